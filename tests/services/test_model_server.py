"""``nextloc serve``'s command (:mod:`services.model_server`): MLflow run by this Python, its uvicorn
resolvable without the venv on PATH, the store in the environment only. The real server is started by
tests/flows/test_predict_flow.py::test_nextloc_serve_answers_without_the_venv_on_path."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from services.model_server import HOST, server_command


def test_mlflow_runs_with_this_python_and_finds_its_uvicorn(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no venv
    secret = "postgresql+psycopg://nextloc:hunter2@127.0.0.1:5433/nextloc_mlflow"
    cmd, env = server_command("models:/nextloc-markov@champion", 5123, secret)
    assert cmd[:5] == [sys.executable, "-m", "mlflow", "models", "serve"]
    assert cmd[cmd.index("--env-manager") + 1] == "local"
    assert (cmd[cmd.index("-h") + 1], cmd[cmd.index("-p") + 1]) == (HOST, "5123")
    bin_dir = str(Path(sys.executable).parent)
    assert env["PATH"].split(os.pathsep)[0] == bin_dir
    assert shutil.which("uvicorn", path=env["PATH"]) == str(Path(bin_dir) / "uvicorn")
    assert env["MLFLOW_TRACKING_URI"] == secret
    assert not [arg for arg in cmd if "hunter2" in arg]


def test_no_uvicorn_is_said_before_anything_starts(monkeypatch, tmp_path: Path) -> None:
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="needs uvicorn"):
        server_command("models:/nextloc-markov@champion", 5123, "sqlite:///x.db")
