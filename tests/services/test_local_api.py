"""The project's local Prefect API (:mod:`services.local_api`): real servers on 127.0.0.1, shared by the
commands of one Prefect home, replaced when dead, gone when idle."""

from __future__ import annotations

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

from services import local_api

pytestmark = pytest.mark.slow  # real servers started and stopped, minutes in all
REPO = Path(__file__).resolve().parents[2]


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status


def _attach(home: Path, hold_s: float = 0.0) -> dict[str, Any]:
    """What another process (a command) finds: attach, wait, then hold the API for ``hold_s``."""
    code = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from services import local_api\n"
        "api = local_api.attach_or_start(Path(sys.argv[1]))\n"
        "api.wait(120)\n"
        "print(json.dumps({'pid': api.pid, 'port': api.port, 'started': api.started_here}), flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(home), str(hold_s)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PREFECT_HOME": str(home)},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not local_api._is_server(pid):
            return True
        time.sleep(0.2)
    return False


def test_one_server_per_home_shared_replaced_and_stopped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    try:
        first = _attach(home)
        assert first["started"]
        url = f"http://127.0.0.1:{first['port']}"
        assert _get(f"{url}/api/health") == 200  # it outlives the command that started it
        assert (home / "prefect.db").is_file()  # the database of this PREFECT_HOME
        with urllib.request.urlopen(url, timeout=10) as page:  # the UI for the user's own runs
            assert b"<html" in page.read().lower()
        assert _attach(home) == {**first, "started": False}  # the next command uses it
        os.kill(first["pid"], 9)  # a dead one...
        assert _gone(first["pid"], 10)
        replaced = _attach(home)
        assert replaced["started"]  # ...is replaced,
        assert replaced["pid"] != first["pid"]
        assert replaced["port"] == first["port"]  # on the same port (the UI's address stays)
    finally:
        stopped = local_api.stop_server(home)
    assert stopped is not None
    assert _gone(stopped, 1)
    with pytest.raises(urllib.error.URLError):
        _get(f"{url}/api/health")
    assert local_api.stop_server(home) is None  # nothing left to stop


def test_commands_started_at_once_share_one_server(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(3) as pool:
            found = list(pool.map(lambda _: _attach(tmp_path), range(3)))
        assert len({(f["pid"], f["port"]) for f in found}) == 1, found
        assert sum(f["started"] for f in found) == 1
    finally:
        local_api.stop_server(tmp_path)


def test_an_idle_server_stops_unless_a_command_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXTLOC_LOCAL_API_IDLE_S", "1")
    try:
        api = local_api.attach_or_start(tmp_path)
        api.wait(120)
        time.sleep(3)  # idle, but this command holds it
        assert _get(f"{api.url}/health") == 200
        api.release()
        assert _gone(api.pid, 30)
        assert local_api.running(tmp_path) is None
        assert _attach(tmp_path)["started"]  # the next command starts a new one
    finally:
        local_api.stop_server(tmp_path)


def test_a_server_that_dies_is_reported_with_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "PREFECT_API_DATABASE_CONNECTION_URL", f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/x.db"
    )
    api = local_api.attach_or_start(tmp_path)
    try:
        with pytest.raises(RuntimeError, match="local Prefect API exited.*nextloc-api.log"):
            api.wait(120)
    finally:
        api.release()
        local_api.stop_server(tmp_path)


@pytest.mark.parametrize(
    "env",
    [{"PREFECT_API_URL": "http://127.0.0.1:4200/api"}, {"PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "false"}],
)
def test_a_configured_api_is_used_as_it_is(env: dict[str, str], tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "from services import local_api\n"
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


def test_commands_share_the_local_api_and_leave_it_running(sample_dir: Path, tmp_path: Path) -> None:
    """Two ``nextloc run`` on the real sample (a training in a worker process): the first starts the local
    API, the second uses it; one API for the main thread, the other threads and the worker; no dead UI
    links; ``nextloc services stop`` stops it."""
    env = {k: v for k, v in os.environ.items() if k not in {"PREFECT_API_URL", "MLFLOW_TRACKING_URI"}}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), COLUMNS="250", NO_COLOR="1", NEXTLOC_PROGRESS="0")
    env.update(PYTHONPATH=str(REPO))
    command = [
        sys.executable,
        "-m",
        "commands.main",
        "run",
        "--raw-dir",
        str(sample_dir),
        "--model",
        "markov",
    ]
    urls = []
    for how in ("started", "running"):
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
        assert words[words.index("API") + 1] == how, output  # "local Prefect API started on <url>"
        urls.append(words[words.index("API") + 3])
        assert "View at" not in output  # no UI links on runs: the port may change after an idle exit
        assert "Starting temporary server" not in output  # Prefect did not start one of its own
    assert urls[0] == urls[1], urls
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/api", urls[0]), urls
    assert _get(f"{urls[0]}/health") == 200
    assert (tmp_path / "out" / "results" / "markov" / "seed0" / "results.json").is_file()
    stop = subprocess.run(
        [sys.executable, "-m", "commands.main", "services", "stop"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "local Prefect API" in stop.stderr, stop.stderr
    with pytest.raises(urllib.error.URLError):
        _get(f"{urls[0]}/health")


_BURSTS = """
import sys
from services import local_api

local_api.start_if_needed()  # as a command does, before Prefect is imported
from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner

@task
def double(i):
    return 2 * i

@flow(task_runner=ThreadPoolTaskRunner(max_workers=8))
def burst(n):
    return sum(f.result() for f in double.map(range(n)))

with local_api.ready():
    for _ in range(int(sys.argv[1])):
        assert burst(40) == 2 * sum(range(40))
"""


def test_writers_at_once_are_all_answered_at_once(tmp_path: Path) -> None:
    """Three commands' flows at once, 40 tasks each (the task-run recorder writing beside them): every
    request answered within 15 s and none refused (no retries). With Prefect's own pool of connections
    this load got ``database is locked`` (503s, a command failing after its retries) and 15-60 s
    stalls (issue 33; ``benchmarks/local_api_load.py`` measures both)."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path),
        "PREFECT_API_REQUEST_TIMEOUT": "15",
        "PREFECT_CLIENT_MAX_RETRIES": "0",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    env.pop("PREFECT_API_URL", None)
    try:
        commands = [
            subprocess.Popen(
                [sys.executable, "-c", _BURSTS, "6"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(3)
        ]
        outputs = [command.communicate(timeout=600)[0] for command in commands]
        assert [c.returncode for c in commands] == [0, 0, 0], "\n".join(o[-3000:] for o in outputs)
        server_log = (tmp_path / local_api.LOG).read_text()
        assert "database is locked" not in server_log, server_log[-3000:]
        assert "slow request" not in server_log, server_log[-3000:]
    finally:
        local_api.stop_server(tmp_path)
