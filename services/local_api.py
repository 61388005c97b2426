"""The project's local Prefect API: one server per Prefect home, started by the first command, shared by
the ones after it, gone after an idle time.

With no API configured (no ``$PREFECT_API_URL``, none in the active Prefect profile), a ``nextloc``
command needs a Prefect API for its flows. The first command starts one in the background (Prefect's
``create_app`` under uvicorn on 127.0.0.1, the ephemeral set of services, its SQLite database
``prefect.db`` under ``$PREFECT_HOME``, which ``nextloc`` sets to ``./.prefect``) and records it in
``$PREFECT_HOME/nextloc-api.json``; the commands after it find it there and use it at once. One server
per database is also what SQLite wants: a second server on the same file (each command booting its own,
or one still shutting down while the next starts) takes the same write lock from another process.

* **Shared, never doubled.** Commands take turns on ``nextloc-api.lock`` (``flock``) to look the server
  up and, when none answers, start it; two commands started at once share one.
* **Replaced when dead.** A recorded server whose process is gone, or is not ours, is started anew (on
  the same port when it is free, so the UI's address stays the same).
* **Stopped when idle.** Each command holds a shared ``flock`` on ``nextloc-api.users`` while it runs;
  the server exits once no request came for ``$NEXTLOC_LOCAL_API_IDLE_S`` seconds (default 1800) and no
  command holds that lock (it takes it exclusively, so a command arriving then waits for it to go and
  starts a new one). ``nextloc services stop`` stops it at once.
* **Its UI.** ``http://127.0.0.1:PORT`` shows the project's flow runs while it is up.
* **Its log.** ``$PREFECT_HOME/nextloc-api.log``, with one line for each request slower than
  ``$NEXTLOC_API_SLOW_S`` seconds (default 5): a stall leaves its trace there.

Its database has one connection (:func:`runtime.compat.one_sqlite_connection`): requests and services take
turns for it on the event loop, so SQLite never has two writers, never answers ``database is locked`` and
never keeps a request waiting on its lock. Flow runs send no heartbeats to it (they detect crashed runs
for workers; it has none). A configured API is used as it is, and nothing is started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nextloc.atomic import write_text_atomic
from nextloc.file_lock import exclusive_lock
from services.api_watch import watch_open_requests
from services.processes import terminate

log = logging.getLogger("nextloc.cli.api")

RECORD = "nextloc-api.json"
USERS = "nextloc-api.users"  # the commands' shared locks
LOG = "nextloc-api.log"
MODULE = "services.local_api"
DEFAULT_IDLE_S = 1800.0
DEFAULT_SLOW_S = 5.0
_LOG_KEEP_BYTES = 5_000_000


def prefect_home() -> Path:
    """``$PREFECT_HOME`` (Prefect's default ``~/.prefect`` when unset), created if missing."""
    home = Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect")).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


@dataclass
class LocalAPI:
    """The local server of one Prefect home, as this command uses it."""

    home: Path
    pid: int
    port: int
    started_here: bool
    users_fd: int | None = None
    """This command's shared lock on ``nextloc-api.users`` (the server stays while it is held)."""
    ready_after_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / LOG

    def wait(self, timeout_s: float) -> None:
        """Block until ``/api/health`` answers 200.

        Raises:
            RuntimeError: the server exited, or did not answer within ``timeout_s``; with its log's tail.
        """
        if self.ready_after_s is not None:
            return
        started = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _is_server(self.pid):
                raise RuntimeError(f"the local Prefect API exited: {log_tail(self.home)}")
            if _healthy(self.url):
                self.ready_after_s = time.perf_counter() - started
                how = "started" if self.started_here else "running"
                log.info("local Prefect API %s on %s (UI %s)", how, self.url, self.ui_url)
                return
            time.sleep(0.05)
        raise RuntimeError(
            f"the local Prefect API (pid {self.pid}) did not answer within {timeout_s:g} s; "
            f"`nextloc services stop` stops it: {log_tail(self.home)}"
        )

    def release(self) -> None:
        """Let the server go idle: drop this command's shared lock (idempotent)."""
        fd, self.users_fd = self.users_fd, None
        if fd is not None:
            os.close(fd)


def attach_or_start(home: Path) -> LocalAPI:
    """The home's running server, or one started now (returns at once; :meth:`LocalAPI.wait` waits)."""
    users_fd = os.open(home / USERS, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(users_fd, fcntl.LOCK_SH)  # waits while a server that went idle is exiting
    try:
        with exclusive_lock(home / "nextloc-api.lock"):
            record = read_record(home)
            if record is not None and _is_server(record["pid"]):
                return LocalAPI(home, record["pid"], record["port"], False, users_fd)
            port = _free_port(record["port"] if record else None)
            pid = _launch(home, port)
            _write_record(home, pid, port)
            return LocalAPI(home, pid, port, True, users_fd)
    except BaseException:
        os.close(users_fd)
        raise


def _launch(home: Path, port: int) -> int:
    log_path = home / LOG
    with contextlib.suppress(OSError):
        if log_path.stat().st_size > _LOG_KEEP_BYTES:
            log_path.replace(log_path.with_suffix(".log.1"))
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    for key in ("PREFECT_API_URL", "PREFECT_UI_URL"):
        env.pop(key, None)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", MODULE, "--port", str(port)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the command, and its Ctrl-C
        )
    return process.pid


def read_record(home: Path) -> dict[str, int] | None:
    """``{"pid": ..., "port": ...}`` of the home's server as last recorded, or None."""
    try:
        record = json.loads((home / RECORD).read_text())
        return {"pid": int(record["pid"]), "port": int(record["port"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(home: Path, pid: int, port: int) -> None:
    write_text_atomic(home / RECORD, json.dumps({"pid": pid, "port": port}) + "\n")


def _is_server(pid: int) -> bool:
    """Whether ``pid`` is alive and (where ``/proc`` tells) one of these servers, not a recycled pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    with contextlib.suppress(OSError):  # reap it if it is our child that exited
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.parent.parent.joinpath("self").exists():
        return True  # no /proc (macOS): trust the pid
    try:
        text = cmdline.read_bytes()
    except OSError:
        return False
    return not text or MODULE.encode() in text  # empty for a moment while it is being exec'd


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _free_port(preferred: int | None) -> int:
    for port in (preferred, 0):
        if port is None:
            continue
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
            )  # as uvicorn binds: TIME_WAIT is no owner
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError("no free port on 127.0.0.1")


def log_tail(home: Path, chars: int = 4000) -> str:
    """The end of the server's log (``$PREFECT_HOME/nextloc-api.log``)."""
    try:
        text = (home / LOG).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return f"{home / LOG}: ..." + (text[-chars:].strip() or "(empty)")


def stop_server(home: Path, timeout_s: float = 30.0) -> int | None:
    """Stop the home's server (SIGTERM, SIGKILL after ``timeout_s``); its pid, or None if none ran."""
    record = read_record(home)
    if record is None or not _is_server(record["pid"]):
        (home / RECORD).unlink(missing_ok=True)
        return None
    terminate(record["pid"], signal.SIGTERM, timeout_s)  # its own session: the group is the server
    (home / RECORD).unlink(missing_ok=True)
    return record["pid"]


def running(home: Path) -> LocalAPI | None:
    """The home's server if its process runs (for ``nextloc services status``); None otherwise."""
    record = read_record(home)
    if record is None or not _is_server(record["pid"]):
        return None
    return LocalAPI(home, record["pid"], record["port"], False)


# --- the command's side ---------------------------------------------------------------------------

_current: LocalAPI | None = None
_saved_env: dict[str, str | None] | None = None  # what the environment held before start_if_needed


def prefect_settings(api: LocalAPI) -> dict[str, Any]:
    """Prefect's settings for flows run against ``api``: its URL, no UI links (the port may change after an
    idle exit), no heartbeats (they detect crashed runs for workers; it has none)."""
    return {"api.url": api.url, "ui_url": "", "flows.heartbeat_frequency": None}


def api_configured() -> bool:
    """Whether the user chose an API: ``$PREFECT_API_URL``, the active profile's, or this process's settings."""
    if os.environ.get("PREFECT_API_URL"):
        return True
    if os.environ.get("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", "").lower() in {"0", "false"}:
        return True  # no local server wanted: let Prefect say so
    if "prefect" in sys.modules:  # already imported (a test harness, a notebook): ask its settings
        from prefect.settings import get_current_settings

        return get_current_settings().api.url is not None
    home = Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect")).expanduser()
    profiles = Path(os.environ.get("PREFECT_PROFILES_PATH", home / "profiles.toml")).expanduser()
    with contextlib.suppress(OSError):
        return "PREFECT_API_URL" in profiles.read_text()
    return False


def start_if_needed() -> LocalAPI | None:
    """Use (or start) the local API unless an API is configured; the local one (or None).

    When Prefect is not imported yet (the command), ``$PREFECT_API_URL`` names the server and
    ``$PREFECT_UI_URL`` is empty (no UI links on runs: the port may change after an idle exit) until
    :func:`stop`: Prefect's settings read them at import, so every thread and worker process of the
    command sees them. A thread that did not see the API would start Prefect's own temporary server.
    """
    global _current, _saved_env
    if _current is not None or api_configured():
        return _current
    _current = attach_or_start(prefect_home())
    if "prefect" not in sys.modules:
        _saved_env = {key: os.environ.get(key) for key in ("PREFECT_API_URL", "PREFECT_UI_URL")}
        os.environ.update(PREFECT_API_URL=_current.url, PREFECT_UI_URL="")
    return _current


def stop() -> None:
    """The command is done with the API: send what Prefect still holds (logs, events), then let it go idle."""
    global _current, _saved_env
    api, _current = _current, None
    if api is None:
        return
    if api.ready_after_s is not None and "prefect" in sys.modules:
        from runtime import compat

        compat.drain_prefect_workers(timeout_s=5)
    api.release()
    for key, value in (_saved_env or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _saved_env = None


@contextlib.contextmanager
def ready() -> Iterator[None]:
    """Around a flow call: wait for the local API and point Prefect at it (no-op without one).

    Inside, Prefect's settings name the API, flow runs send no heartbeats, and no Prefect UI is linked.
    The environment already names it when :func:`start_if_needed` ran before Prefect's import (the
    command); otherwise :func:`runtime.runners.share_api_with_workers` puts it there for worker processes,
    and it is restored on the way out.
    """
    api = _current
    if api is None:
        yield
        return
    from prefect.settings import get_current_settings, temporary_settings

    api.wait(float(get_current_settings().server.ephemeral.startup_timeout_seconds))
    saved = os.environ.get("PREFECT_API_URL")  # share_api_with_workers sets it for worker processes
    try:
        with temporary_settings(updates=prefect_settings(api)):
            yield
    finally:
        if saved is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = saved


# --- the server's side ----------------------------------------------------------------------------


class Activity:
    """ASGI wrapper: when the last request ended, how many are in flight, and a log line for slow ones."""

    def __init__(self, app: Callable[..., Awaitable[None]], slow_s: float) -> None:
        self.app = app
        self.slow_s = slow_s
        self.in_flight = 0
        self.last = time.monotonic()
        self.open: dict[int, tuple[str, float]] = {}  # http requests in flight: what, since when

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        self.in_flight += 1
        start = time.monotonic()
        if scope["type"] == "http":
            self.open[id(scope)] = (f"{scope.get('method')} {scope.get('path')}", start)
        try:
            await self.app(scope, receive, send)
        finally:
            self.open.pop(id(scope), None)
            self.in_flight -= 1
            self.last = time.monotonic()
            took = self.last - start
            if scope["type"] == "http" and took > self.slow_s:
                log.warning("slow request: %s %s took %.1f s", scope.get("method"), scope.get("path"), took)


def create_server_app(slow_s: float = DEFAULT_SLOW_S) -> Activity:
    """The server's ASGI app: Prefect's API with the ephemeral set of services, its UI, and our wrappers."""
    from prefect.server.api.server import create_app, create_ui_app

    from runtime import compat

    compat.one_sqlite_connection()  # one writer: no request waits on SQLite's lock
    api = create_app(ephemeral=True, final=True)  # ephemeral: no UI of its own
    ui = create_ui_app(ephemeral=False)

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        to_api = scope["type"] == "lifespan" or path == "/api" or path.startswith("/api/")
        await (api if to_api else ui)(scope, receive, send)

    return Activity(app, slow_s)


async def _exit_when_idle(server: Any, activity: Activity, home: Path, idle_s: float) -> None:
    """Ask uvicorn to exit once nothing happened for ``idle_s`` and no command holds the users' lock."""
    users = os.open(home / USERS, os.O_RDWR | os.O_CREAT, 0o644)
    while not server.should_exit:
        await asyncio.sleep(min(30.0, max(0.2, idle_s / 10)))
        if activity.in_flight or time.monotonic() - activity.last < idle_s:
            continue
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until this process exits
        except BlockingIOError:
            continue  # a command is running: it will talk to us again
        log.info("idle for %.0f s with no command running: stopping", idle_s)
        server.should_exit = True


def serve(port: int, idle_s: float, slow_s: float) -> None:
    """Run the server in this process until it is idle or signalled (``python -m services.local_api``)."""
    import uvicorn

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)  # its own lines; the services' routine ones (docket's every 5 s) stay out
    home = prefect_home()
    activity = create_server_app(slow_s)
    config = uvicorn.Config(
        activity,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    log.info("local Prefect API pid %d on http://127.0.0.1:%d/api, home %s", os.getpid(), port, home)

    async def main() -> None:
        watchers = [
            asyncio.create_task(_exit_when_idle(server, activity, home, idle_s)),
            asyncio.create_task(watch_open_requests(activity.open, slow_s, log)),
        ]
        try:
            await server.serve()
        finally:
            for watcher in watchers:
                watcher.cancel()

    asyncio.run(main())
    log.info("stopped")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--idle-s", type=float, default=float(os.environ.get("NEXTLOC_LOCAL_API_IDLE_S", DEFAULT_IDLE_S))
    )
    parser.add_argument(
        "--slow-s", type=float, default=float(os.environ.get("NEXTLOC_API_SLOW_S", DEFAULT_SLOW_S))
    )
    args = parser.parse_args()
    serve(args.port, args.idle_s, args.slow_s)
