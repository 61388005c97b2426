"""The services the service tests share: one `nextloc services start` for tests/services, stopped after its
last test (each boot of PostgreSQL, the Prefect server, MLflow and a worker costs a while)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import services as svc_module

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nextloc(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "nextloc"), *args], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )


@dataclass
class Running:
    """What ``nextloc services start`` started: its project folder, environment, output and backend."""

    root: Path
    env: dict[str, str]
    started: subprocess.CompletedProcess
    backend: str
    stopped: subprocess.CompletedProcess | None = field(default=None)

    def stop(self) -> None:
        """Stop the services (once) and check: the worker first, PostgreSQL last; nothing left running."""
        if self.stopped is not None:
            return
        self.stopped = _nextloc(self.root, self.env, "services", "stop")
        status = _nextloc(self.root, self.env, "services", "status")
        shutil.rmtree(self.root, ignore_errors=True)
        assert self.stopped.returncode == 0, self.stopped.stderr
        if self.backend == "postgres":
            stopped = self.stopped.stderr.replace("\n", " ")
            assert "stopped: worker, mlflow, prefect-server, postgres" in stopped, stopped
        assert "running" not in status.stdout, status.stdout


_RUNNING: list[Running] = []


@pytest.fixture(scope="session")
def running_services():
    """``nextloc services start`` in a project folder under /tmp (mode 0755: as root, PostgreSQL runs as the
    postgres user, which must reach .services/pg; pytest's temporary root is closed to other users), on
    free 127.0.0.1 ports, PostgreSQL where its binaries are installed and SQLite otherwise."""
    root = Path(tempfile.mkdtemp(prefix="nextloc-service-", dir="/tmp"))
    root.chmod(0o755)
    env = {
        **os.environ,
        "NEXTLOC_PREFECT_PORT": str(_free_port()),
        "NEXTLOC_MLFLOW_PORT": str(_free_port()),
        "NEXTLOC_PG_PORT": str(_free_port()),
        "PREFECT_HOME": str(root / ".prefect"),
        "PYTHONPATH": str(REPO),
    }
    for key in ("PREFECT_API_URL", "NEXTLOC_DB_URL", "NEXTLOC_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    try:
        svc_module.postgres_bin_dir()
        backend = "postgres"
    except RuntimeError:
        backend = env["NEXTLOC_SERVICES_BACKEND"] = "sqlite"
    running = Running(root, env, _nextloc(root, env, "services", "start"), backend)
    _RUNNING.append(running)
    try:
        assert running.started.returncode == 0, running.started.stdout + running.started.stderr
        yield running
    finally:
        running.stop()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of tests/services, stop the shared services (not at the session's end: idle
    servers would share the CPU with every test after them)."""
    if nextitem is not None and HERE in Path(nextitem.path).resolve().parents:
        return
    while _RUNNING:
        _RUNNING.pop().stop()
