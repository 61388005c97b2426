"""The command's own temporary Prefect API (:mod:`flows.local_api`): a real server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from flows import local_api

REPO = Path(__file__).resolve().parents[2]


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status


class TestRetrySoonOnBusy:
    """The 503 Prefect answers for SQLite's ``database is locked`` gets a Retry-After that grows."""

    @staticmethod
    def _answer(status: int):
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": status, "headers": [(b"x", b"1")]})
            await send({"type": "http.response.body", "body": b""})

        return app

    @staticmethod
    def _call(wrapped: local_api.RetrySoonOnBusy) -> dict[bytes, bytes]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        asyncio.run(wrapped({"type": "http"}, None, send))
        return dict(sent[0]["headers"])

    def test_503_says_when_to_retry_and_backs_off(self) -> None:
        wrapped = local_api.RetrySoonOnBusy(self._answer(503))
        delays = [float(self._call(wrapped)[b"retry-after"]) for _ in range(9)]
        assert delays[:3] == [0.1, 0.2, 0.4]
        assert delays == sorted(delays)
        assert delays[-1] == 8.0  # capped

    def test_other_answers_are_untouched(self) -> None:
        headers = self._call(local_api.RetrySoonOnBusy(self._answer(200)))
        assert headers == {b"x": b"1"}

    def test_old_503s_are_forgotten(self) -> None:
        wrapped = local_api.RetrySoonOnBusy(self._answer(503), window_s=0.0)
        assert [float(self._call(wrapped)[b"retry-after"]) for _ in range(3)] == [0.1, 0.1, 0.1]


def test_server_starts_answers_and_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    api = local_api.TemporaryAPI.start()
    try:
        api.wait(timeout_s=120)
        assert _get(f"{api.url}/health") == 200
        assert (api.ready_after_s or 0) > 0
        assert (tmp_path / "home" / "prefect.db").is_file()  # the database of this PREFECT_HOME
    finally:
        api.stop()
    with pytest.raises(urllib.error.URLError):
        _get(f"{api.url}/health")
    assert not api.log_path.exists()
    api.stop()  # idempotent


def test_a_server_that_dies_is_reported_with_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.write_text("a file where the Prefect home folder should be")
    monkeypatch.setenv("PREFECT_HOME", str(home))
    api = local_api.TemporaryAPI.start()
    with pytest.raises(RuntimeError, match="temporary Prefect API exited"):
        api.wait(timeout_s=120)
    api.stop()


@pytest.mark.parametrize(
    "env",
    [{"PREFECT_API_URL": "http://127.0.0.1:4200/api"}, {"PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "false"}],
)
def test_a_configured_api_is_used_as_it_is(env: dict[str, str], tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "from flows import local_api\n"
        "api = local_api.start_if_needed()\n"
        "print(json.dumps({'started': api is not None, 'prefect': 'prefect' in sys.modules}))\n"
    )
    base = {k: v for k, v in os.environ.items() if k not in {"PREFECT_API_URL"}}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, "PREFECT_HOME": str(tmp_path), **env},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"started": False, "prefect": False}


def test_a_profile_naming_an_api_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_PROFILES_PATH", str(tmp_path / "profiles.toml"))
    monkeypatch.delitem(sys.modules, "prefect", raising=False)  # as in the command: not imported yet
    assert not local_api.api_configured()
    (tmp_path / "profiles.toml").write_text(
        'active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://prefect.example:4200/api"\n'
    )
    assert local_api.api_configured()


def test_the_command_runs_on_its_own_api_and_stops_it(sample_dir: Path, tmp_path: Path) -> None:
    """``nextloc run`` on the real sample (a training in a worker process): one API, its own, for the main
    thread, the other threads and the worker; no dead UI links; nothing left running."""
    env = {k: v for k, v in os.environ.items() if k not in {"PREFECT_API_URL", "MLFLOW_TRACKING_URI"}}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), COLUMNS="250", NO_COLOR="1", NEXTLOC_PROGRESS="0")
    env.update(PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "flows.cli", "run", "--raw-dir", str(sample_dir), "--model", "markov"]
    result = subprocess.run(
        [*command, "--data-dir", str(tmp_path / "out")],
        cwd=tmp_path,  # its mlruns/ goes here
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    words = output.split()
    url = words[words.index("temporary") + 4]  # "temporary Prefect API on <url>"
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/api", url), output
    assert "View at" not in output  # no link to a UI that is gone after the command
    assert "Starting temporary server" not in output  # Prefect did not start a second one
    with pytest.raises(urllib.error.URLError):
        _get(f"{url}/health")
    assert (tmp_path / "out" / "metadata.json").is_file()
    assert (tmp_path / "out" / "results" / "markov" / "seed0" / "results.json").is_file()


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_command_takes_its_server_with_it(tmp_path: Path) -> None:
    code = (
        "import time\n"
        "from flows import local_api\n"
        "api = local_api.TemporaryAPI.start()\n"
        "api.wait(120)\n"
        "print(api.url, flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    command = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**env, "PREFECT_HOME": str(tmp_path)},
    )
    url = command.stdout.readline().strip()
    assert _get(f"{url}/health") == 200
    command.kill()  # SIGKILL: no finally, no atexit
    command.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            _get(f"{url}/health")
        except urllib.error.URLError:
            return
        time.sleep(0.2)
    pytest.fail(f"the server at {url} outlived its killed command")
