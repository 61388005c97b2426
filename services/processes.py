"""The services' processes: started in their own session with a log and a pid file, found again by that
pid file, waited for until they answer, and stopped by signal."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from services.layout import HOST, Services

log = logging.getLogger("nextloc.cli")


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now, for servers about to start there: each socket is
    held until all are bound, so no two are the same (ports asked for one at a time can be)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]


def free_port_env() -> dict[str, str]:
    """The services' port variables (``NEXTLOC_PREFECT_PORT``, ``NEXTLOC_MLFLOW_PORT``, ``NEXTLOC_PG_PORT``:
    :class:`services.layout.Services`) set to three distinct free ports: services started beside others."""
    names = ("NEXTLOC_PREFECT_PORT", "NEXTLOC_MLFLOW_PORT", "NEXTLOC_PG_PORT")
    return dict(zip(names, map(str, free_ports(len(names))), strict=True))


def write_private(path: Path, text: str) -> None:
    """Write a secret atomically (:func:`nextloc.storage.atomic_path`) with mode 0600."""
    from nextloc.storage import atomic_path  # pandas and pyarrow: only when a secret is written

    with atomic_path(path) as tmp:
        tmp.chmod(0o600)
        tmp.write_text(text)


def running_pid(services: Services, name: str) -> int | None:
    """The pid of a running service (from its pid file), or None. A service this process started and that
    has exited is reaped here: until then it would answer ``kill(pid, 0)`` as a zombie."""
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
    with contextlib.suppress(ChildProcessError):  # not this process's child: its parent reaps it
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # this process started it, and it has exited
            return None
    return pid


def launch(services: Services, name: str, cmd: list[str], env: dict[str, str], **run_as: Any) -> None:
    """Start ``cmd`` in its own session with its log and pid file; ``run_as``: Popen's user/group options."""
    if running_pid(services, name) is not None:
        log.info("%s already running (pid %s)", name, running_pid(services, name))
        return
    with open(services.log_file(name), "ab") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=services.root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **run_as,
        )
    services.pid_file(name).write_text(f"{proc.pid}\n")
    log.info("started %s (pid %d), log %s", name, proc.pid, services.log_file(name))


def wait_http(
    services: Services, name: str, url: str, timeout_s: float, context: ssl.SSLContext | None = None
) -> None:
    """Wait until ``url`` answers 200 (``context``: how an ``https`` server is verified); fail naming the
    service's log if it exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running_pid(services, name) is None:
            raise RuntimeError(f"{name} exited; see {services.log_file(name)}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url, timeout=5, context=context) as response,
        ):
            if response.status == 200:
                log.info("%s is up: %s", name, url)
                return
        time.sleep(0.5)
    raise RuntimeError(
        f"{name} did not answer at {url} within {timeout_s:.0f} s; see {services.log_file(name)}"
    )


def wait_worker(
    services: Services,
    pool: str,
    timeout_s: float,
    headers: dict[str, str],
    context: ssl.SSLContext | None = None,
) -> None:
    """Wait until the services' worker is online in the work pool ``pool`` (``headers``: the API's
    credentials; ``context``: :func:`wait_http`'s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running_pid(services, "worker") is None:
            raise RuntimeError(f"the worker exited; see {services.log_file('worker')}")
        with contextlib.suppress(OSError, ValueError):
            url = f"{services.api_url}/work_pools/{pool}/workers/filter"
            workers = post_json(url, headers=headers, context=context)
            if any(w.get("status") == "ONLINE" for w in workers):
                log.info("worker online in work pool %s", pool)
                return
        time.sleep(1.0)
    raise RuntimeError(
        f"no worker online in {pool} within {timeout_s:.0f} s; see {services.log_file('worker')}"
    )


def post_json(
    url: str,
    body: dict | None = None,
    timeout_s: float = 5.0,
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> Any:
    """POST ``body`` (default ``{}``, as a Prefect API filter endpoint takes it) as JSON, with ``headers``
    (credentials: :func:`services.auth.authorization`; ``context``: :func:`wait_http`'s); the decoded
    answer."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
        return json.loads(response.read())


def terminate(pid: int, sig: signal.Signals, timeout_s: float, group: bool = True) -> None:
    """Signal a service's process group (or the process alone); SIGKILL the group if still there after ``timeout_s``."""
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if group else os.kill)(pid, sig)
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
