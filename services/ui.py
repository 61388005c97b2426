"""MLflow's UI on the project's own store (``nextloc ui``): started once in the background, found again.

Where the team services run, their MLflow tracking server is the UI. Otherwise the project's store is
``mlruns/mlflow.db``: :func:`ensure_ui` starts ``mlflow ui`` on it (127.0.0.1, port ``$NEXTLOC_UI_PORT``,
default 5050; its log and pid file ``.services/mlflow-ui-<port>.log`` / ``.pid``), or finds the one it
started before, and waits until it answers. :func:`stop_ui` stops every UI it started in this folder
(``nextloc ui --stop``).
"""

from __future__ import annotations

import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from flows import OFFLINE_DEFAULTS
from services.layout import HOST, Services
from services.processes import launch, running_pid, terminate, wait_http

UI = "mlflow-ui"
DEFAULT_PORT = int(os.environ.get("NEXTLOC_UI_PORT", "5050"))
START_TIMEOUT_S = 120.0


def ensure_ui(root: Path, store_uri: str, port: int = DEFAULT_PORT) -> str:
    """The URL of MLflow's UI on ``store_uri``, started from ``root`` unless it already runs there.

    Raises:
        RuntimeError: another program answers on the port, or the UI exits or does not answer in time
            (naming its log).
    """
    services = Services(Path(root))
    services.folder.mkdir(parents=True, exist_ok=True)
    name, url = f"{UI}-{port}", f"http://{HOST}:{port}"
    if running_pid(services, name) is None:
        if _answers(url):
            raise RuntimeError(
                f"another program answers at {url}: choose another port (--port, $NEXTLOC_UI_PORT)"
            )
        command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store_uri]
        launch(
            services,
            name,
            [*command, "--host", HOST, "--port", str(port)],
            {**os.environ, **OFFLINE_DEFAULTS},
        )
    wait_http(services, name, f"{url}/health", START_TIMEOUT_S)
    return url


def stop_ui(root: Path) -> list[str]:
    """Stop the UIs :func:`ensure_ui` started in ``root``; the names of those that ran."""
    services = Services(Path(root))
    stopped = []
    for pid_file in sorted(services.folder.glob(f"{UI}-*.pid")):
        name = pid_file.stem
        pid = running_pid(services, name)
        if pid is not None:
            terminate(pid, signal.SIGTERM, timeout_s=15)
            stopped.append(name)
        pid_file.unlink(missing_ok=True)
    return stopped


def _answers(url: str) -> bool:
    """Whether anything answers HTTP at ``url`` (an error status is an answer too)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
