"""`nextloc ui` refuses clearly where it cannot open the comparison: no experiment yet, a port taken by
another program (the browser test, tests/browser/test_mlflow_ui.py, opens what it prints)."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

NEXTLOC = Path(sys.executable).parent / "nextloc"


def _ui(root: Path, *args: str) -> tuple[int, str]:
    """Exit code and output (stdout and stderr, one line) of ``nextloc ui ARGS`` in ``root``."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "NEXTLOC_TRACKING_URI")}
    done = subprocess.run(
        [str(NEXTLOC), "ui", *args], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def test_without_an_experiment_it_says_how_to_make_one(tmp_path):
    code, output = _ui(tmp_path, "--port", "1")
    assert code == 1, output
    assert "no experiment 'nextloc-geolife'" in output
    assert "`make run` records one" in output
    assert not list((tmp_path / ".services").glob("mlflow-ui-*.pid"))


@pytest.fixture
def another_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_port_another_program_answers_on_is_named_and_nothing_starts(tmp_path, another_server):
    from tracking import mlflow_runs

    mlflow_runs.configure(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    code, output = _ui(tmp_path, "--port", str(another_server))
    assert code == 1, output
    assert f"another program answers at http://127.0.0.1:{another_server}" in output
    assert not list((tmp_path / ".services").glob("mlflow-ui-*.pid"))
