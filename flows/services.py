"""Run nextloc as a service on this machine: a Prefect server, the MLflow UI and the deployment server.

``nextloc services start`` (``make services``) starts, in the background, each with its log and pid file
under ``.services/``:

* ``prefect server start`` on 127.0.0.1:4200 (SQLite, its own ``PREFECT_HOME`` in ``.services/prefect``);
* ``mlflow server`` on 127.0.0.1:5000 over the project's store (``mlruns/mlflow.db``, ``mlruns/artifacts``);
* ``python -m flows.serve``: registers ``preprocess-train/geolife`` and ``retrain/geolife-dumps`` and runs
  their flow runs.

It waits until each answers, then says how to use them. ``nextloc services stop`` stops them in the safe
order (the deployment server first: it talks to the Prefect server while it shuts down).
Ports: ``$NEXTLOC_PREFECT_PORT`` and ``$NEXTLOC_MLFLOW_PORT``. Everything stays on 127.0.0.1, offline.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("nextloc.cli")

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Services:
    """Where the services of one project folder keep their state, and their ports."""

    root: Path
    prefect_port: int = int(os.environ.get("NEXTLOC_PREFECT_PORT", "4200"))
    mlflow_port: int = int(os.environ.get("NEXTLOC_MLFLOW_PORT", "5000"))

    @property
    def folder(self) -> Path:
        """``.services/``: logs, pid files, the Prefect server's home."""
        return self.root / ".services"

    @property
    def api_url(self) -> str:
        """The Prefect API every client needs in ``PREFECT_API_URL``."""
        return f"http://{HOST}:{self.prefect_port}/api"

    @property
    def mlflow_url(self) -> str:
        """The MLflow UI."""
        return f"http://{HOST}:{self.mlflow_port}"

    def pid_file(self, name: str) -> Path:
        """Pid file of a service."""
        return self.folder / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        """Log of a service."""
        return self.folder / f"{name}.log"


def start(services: Services, timeout_s: float = 180.0) -> None:
    """Start whatever is not running yet and wait until all three answer.

    Raises:
        RuntimeError: if a service exits or does not answer in ``timeout_s``; its log is named.
    """
    services.folder.mkdir(parents=True, exist_ok=True)
    (services.root / "mlruns" / "artifacts").mkdir(parents=True, exist_ok=True)
    base = {
        **os.environ,
        "DO_NOT_TRACK": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    base.pop("PREFECT_API_URL", None)
    bin_dir = Path(sys.executable).parent
    server_env = {**base, "PREFECT_HOME": str(services.folder / "prefect")}
    _launch(
        services,
        "prefect-server",
        [str(bin_dir / "prefect"), "server", "start", "--host", HOST, "--port", str(services.prefect_port)],
        server_env,
    )
    mlruns = (services.root / "mlruns").resolve()
    _launch(
        services,
        "mlflow",
        [
            str(bin_dir / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{mlruns / 'mlflow.db'}",
            "--default-artifact-root",
            str(mlruns / "artifacts"),
            "--host",
            HOST,
            "--port",
            str(services.mlflow_port),
            "--workers",
            "1",
        ],
        base,
    )
    _wait_http(services, "prefect-server", f"{services.api_url}/health", timeout_s)
    serve_env = {
        **base,
        "PREFECT_API_URL": services.api_url,
        "PREFECT_RUNNER_POLL_FREQUENCY": os.environ.get("PREFECT_RUNNER_POLL_FREQUENCY", "2"),
        "NEXTLOC_MLFLOW_UI_URL": services.mlflow_url,
        "PREFECT_HOME": os.environ.get("PREFECT_HOME", str(services.root / ".prefect")),
    }
    _launch(services, "serve", [sys.executable, "-m", "flows.serve"], serve_env)
    _wait_http(services, "mlflow", f"{services.mlflow_url}/health", timeout_s)
    _wait_deployments(services, timeout_s)


def stop(services: Services, timeout_s: float = 30.0) -> list[str]:
    """Stop the deployment server, then MLflow, then the Prefect server; returns what was stopped."""
    stopped = []
    for name, sig in (
        ("serve", signal.SIGINT),
        ("mlflow", signal.SIGTERM),
        ("prefect-server", signal.SIGTERM),
    ):
        pid = running_pid(services, name)
        if pid is not None:
            _terminate(pid, sig, timeout_s)
            stopped.append(name)
        services.pid_file(name).unlink(missing_ok=True)
    return stopped


def status(services: Services) -> dict[str, int | None]:
    """``{service: pid or None}``."""
    return {name: running_pid(services, name) for name in ("prefect-server", "mlflow", "serve")}


def running_pid(services: Services, name: str) -> int | None:
    """The pid of a running service (from its pid file), or None."""
    try:
        pid = int(services.pid_file(name).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def _launch(services: Services, name: str, cmd: list[str], env: dict[str, str]) -> None:
    if running_pid(services, name) is not None:
        log.info("%s already running (pid %s)", name, running_pid(services, name))
        return
    with open(services.log_file(name), "ab") as out:
        proc = subprocess.Popen(
            cmd, cwd=services.root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    services.pid_file(name).write_text(f"{proc.pid}\n")
    log.info("started %s (pid %d), log %s", name, proc.pid, services.log_file(name))


def _wait_http(services: Services, name: str, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running_pid(services, name) is None:
            raise RuntimeError(f"{name} exited; see {services.log_file(name)}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as response:
            if response.status == 200:
                log.info("%s is up: %s", name, url)
                return
        time.sleep(0.5)
    raise RuntimeError(
        f"{name} did not answer at {url} within {timeout_s:.0f} s; see {services.log_file(name)}"
    )


def _wait_deployments(services: Services, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    wanted = {"preprocess-train/geolife", "retrain/geolife-dumps"}
    while time.monotonic() < deadline:
        if running_pid(services, "serve") is None:
            raise RuntimeError(f"the deployment server exited; see {services.log_file('serve')}")
        with contextlib.suppress(OSError, ValueError):
            flows = {f["id"]: f["name"] for f in _post_json(f"{services.api_url}/flows/filter")}
            deployments = _post_json(f"{services.api_url}/deployments/filter")
            if wanted <= {f"{flows.get(d['flow_id'], '?')}/{d['name']}" for d in deployments}:
                log.info("deployments served: %s", ", ".join(sorted(wanted)))
                return
        time.sleep(1.0)
    raise RuntimeError(
        f"deployments not registered within {timeout_s:.0f} s; see {services.log_file('serve')}"
    )


def _post_json(url: str) -> list[dict]:
    """POST ``{}`` to a Prefect API filter endpoint; the decoded answer."""
    request = urllib.request.Request(
        url, data=b"{}", headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def _terminate(pid: int, sig: signal.Signals, timeout_s: float) -> None:
    """Signal a service's process group; SIGKILL it if it is still there after ``timeout_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    else:
        log.warning("pid %d did not stop in %.0f s; killing it", pid, timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
