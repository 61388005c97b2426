"""``nextloc serve``: MLflow's scoring server for a registered model, in the foreground, on 127.0.0.1.

Decisions:

* **MLflow's own server**, ``mlflow models serve --env-manager local``: the registered pyfunc answers
  ``POST /invocations`` exactly as ``nextloc predict`` does (:mod:`tracking.pyfunc_model`); nothing of ours
  sits between a client and it.
* **No PATH needed.** ``mlflow models serve`` starts ``uvicorn`` by name (``bash -c "exec uvicorn ..."``):
  with only ``.venv/bin/mlflow`` called, and the venv not on ``PATH``, it dies with ``exec: uvicorn: not
  found`` and a traceback (``Return code = 127``). So mlflow runs as ``<this python> -m mlflow`` and the child's ``PATH``
  starts with this interpreter's folder, where pip put ``uvicorn``; without one there, it stops before
  starting anything, saying so.
* **The project's store.** The model URI ``models:/nextloc-<kind>@<alias>`` is resolved against the
  tracking store the other commands use (``--tracking-uri``, ``$NEXTLOC_TRACKING_URI``, else
  ``mlruns/mlflow.db``), passed to the server in its environment (never on its command line: a database
  URI may hold a password). A missing alias is an error naming the store, before the server starts.
* **Foreground, stopped cleanly.** The server runs in its own session (its log goes to this terminal);
  ``nextloc serve`` waits until ``/ping`` answers, prints the URL and an example ``curl``, and on Ctrl-C
  (or SIGTERM) stops the server's whole process group, so no server outlives the command.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType

from services.processes import terminate

log = logging.getLogger("nextloc.cli")

HOST = "127.0.0.1"
EXAMPLE_REQUEST = {
    "dataframe_records": [
        {
            "user_id": 73,
            "started_at": "2008-08-28T15:57:02Z",
            "finished_at": "2008-08-29T02:23:26Z",
            "latitude": 39.97552,
            "longitude": 116.33159,
        },
        {
            "user_id": 73,
            "started_at": "2008-08-29T03:10:00Z",
            "finished_at": "2008-08-29T09:40:00Z",
            "latitude": 39.97446,
            "longitude": 116.33186,
        },
    ],
    "params": {"k": 3},
}


def server_command(model_uri: str, port: int, tracking_uri: str) -> tuple[list[str], dict[str, str]]:
    """The scoring server's command line and environment (see the module docstring).

    Raises:
        FileNotFoundError: no ``uvicorn`` beside this Python interpreter.
    """
    bin_dir = Path(sys.executable).parent
    path = os.pathsep.join(filter(None, [str(bin_dir), os.environ.get("PATH", "")]))
    if shutil.which("uvicorn", path=path) is None:
        raise FileNotFoundError(
            f"MLflow's scoring server needs uvicorn, and there is none in {bin_dir} or on PATH: "
            f"`{sys.executable} -m pip install uvicorn` (it comes with mlflow)"
        )
    env = {
        **os.environ,
        "PATH": path,
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_REGISTRY_URI": tracking_uri,
    }
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri]
    cmd += ["--env-manager", "local", "-h", HOST, "-p", str(port)]
    return cmd, env


def serve_registered(
    kind: str, alias: str, port: int, tracking_uri: str | None, experiment: str, timeout_s: float = 300.0
) -> int:
    """``nextloc serve``: serve ``models:/nextloc-<kind>@<alias>`` until Ctrl-C; the exit code (0: stopped
    by the user, 1: the server failed; a missing model raises
    :class:`tracking.versions.ModelNotFound`)."""
    from tracking import mlflow_runs
    from tracking.registered import model_uri, registered_version

    uri = tracking_uri or mlflow_runs.default_tracking_uri()
    version = registered_version(kind, alias, uri, experiment)
    model = model_uri(kind, alias)
    cmd, env = server_command(model, port, uri)
    log.info("starting MLflow's scoring server for %s (version %s) on %s:%d", model, version, HOST, port)
    # Ctrl-C and SIGTERM both stop the server: SIGINT explicitly too, since a process started in the
    # background of a non-interactive shell inherits SIGINT ignored and Python then installs no handler
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        url = f"http://{HOST}:{port}"
        wait_until_up(server, f"{url}/ping", timeout_s)
        sys.stdout.write(ready_message(url, model, version))
        sys.stdout.flush()
        code = server.wait()
        log.error("the scoring server exited with code %d (its log is above)", code)
        return 1
    except KeyboardInterrupt:
        log.info("stopping the scoring server")
        return 0
    except RuntimeError as err:
        log.error("%s", err)
        return 1
    finally:
        terminate(server.pid, signal.SIGTERM, timeout_s=20)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=5)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C or SIGTERM stops ``nextloc serve``, and the server with it."""
    raise KeyboardInterrupt


def wait_until_up(server: subprocess.Popen, url: str, timeout_s: float) -> None:
    """Wait until ``url`` answers 200.

    Raises:
        RuntimeError: the server exited, or did not answer within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = server.poll()
        if code is not None:
            raise RuntimeError(
                f"the scoring server exited with code {code} before answering (its log is above)"
            )
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the scoring server did not answer at {url} within {timeout_s:.0f} s")


def ready_message(url: str, model: str, version: str) -> str:
    """What ``nextloc serve`` prints once the server answers: the URL and an example request."""
    body = json.dumps(EXAMPLE_REQUEST)
    return (
        f"serving {model} (version {version}) at {url}; Ctrl-C stops it\n"
        f"curl -s -X POST {url}/invocations -H 'Content-Type: application/json' -d '{body}'\n"
    )
