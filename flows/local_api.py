"""The command's own temporary Prefect API, started first so that its boot overlaps the imports.

With no API configured, Prefect starts a temporary local server when a process runs its first flow: it
imports the whole server in the calling process (about 1.8 s), starts it in a subprocess and waits for it
(about 2.7 s more), after the command has already spent about 5 s importing torch, MLflow and Prefect.
``nextloc`` starts the same server (Prefect's ``create_app`` under uvicorn, UI off, the ephemeral set of
services, the database under ``$PREFECT_HOME``) as soon as its arguments are checked, so the server boots
on one core while the command imports on the other; the flows wait for it to answer. Its 503 answers
(SQLite's ``database is locked``) carry a short ``Retry-After`` (:class:`RetrySoonOnBusy`) instead of
Prefect's client's default 2 s back-off.

The server lives as long as the command: :meth:`TemporaryAPI.stop` ends it (``nextloc`` calls it in a
``finally``, and at exit as a fallback), and on Linux the kernel ends it if the command is killed. Flow
runs against it send no heartbeats (they detect crashed runs for workers; a temporary API dies with its
command) and link no Prefect UI (there is none to open later), as with Prefect's own temporary server. A
configured API (``$PREFECT_API_URL``, an API in the active Prefect profile, or one already set in this
process's Prefect settings) is used as it is, and nothing is started.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from tasks import compat

log = logging.getLogger("nextloc.cli.api")

_current: TemporaryAPI | None = None


class TemporaryAPI:
    """A Prefect API server in a subprocess on 127.0.0.1, for one command."""

    def __init__(self, port: int, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.port = port
        self.process: subprocess.Popen[bytes] | None = process
        self.log_path = log_path
        self.started = time.perf_counter()
        self.ready_after_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @classmethod
    def start(cls) -> TemporaryAPI:
        """Start the server (returns at once; :meth:`wait` blocks until it answers)."""
        port = _free_port()
        handle, name = tempfile.mkstemp(prefix="nextloc-prefect-api-", suffix=".log")
        env = {**os.environ, "PREFECT_UI_ENABLED": "0"}
        env.pop("PREFECT_API_URL", None)
        with os.fdopen(handle, "wb") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "--app-dir",
                    str(Path(__file__).resolve().parent.parent),
                    "--factory",
                    "flows.local_api:create_server_app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--log-level",
                    "error",
                    "--lifespan",
                    "on",
                ],
                env=env,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        api = cls(port, process, Path(name))
        atexit.register(api.stop)
        return api

    def wait(self, timeout_s: float) -> None:
        """Block until ``/api/health`` answers 200.

        Raises:
            RuntimeError: the server exited, or did not answer within ``timeout_s``; with its output.
        """
        if self.ready_after_s is not None:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise RuntimeError(f"the temporary Prefect API exited (code {code}): {self._output_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        self.ready_after_s = time.perf_counter() - self.started
                        log.info(
                            "temporary Prefect API on %s (ready %.1f s after the start; stopped when the "
                            "command ends)",
                            self.url,
                            self.ready_after_s,
                        )
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"the temporary Prefect API did not answer within {timeout_s:g} s "
            f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS): {self._output_tail()}"
        )

    def stop(self) -> None:
        """Stop the server (idempotent); its database stays."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with contextlib.suppress(OSError):
            self.log_path.unlink()

    def _output_tail(self, chars: int = 4000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no output)"
        return text[-chars:].strip() or "(no output)"


def create_server_app() -> Callable[..., Awaitable[None]]:
    """The server's ASGI app (``uvicorn --factory flows.local_api:create_server_app``, in the subprocess):
    Prefect's own, as its temporary server builds it (``ephemeral``: the ephemeral set of services;
    ``final``: no other app in this process), with a ``Retry-After`` on its 503 answers."""
    from prefect.server.api.server import create_app

    return RetrySoonOnBusy(create_app(ephemeral=True, final=True))


class RetrySoonOnBusy:
    """ASGI wrapper: a 503 (Prefect's answer to SQLite's ``database is locked``) says when to retry.

    A write that meets another one in SQLite's write-ahead log fails at once instead of waiting for the
    lock; Prefect answers 503 and its client, given no ``Retry-After``, waits 2 s, then 4, 8... A retry
    succeeds as soon as the other write commits, so the first ones come after 0.1 s; the delay doubles
    with each further 503 in the last 10 s (up to 8 s), which keeps a real burst backing off as before.
    """

    def __init__(self, app: Callable[..., Awaitable[None]], window_s: float = 10.0) -> None:
        self.app = app
        self.window_s = window_s
        self.recent: deque[float] = deque()

    def retry_after_s(self) -> float:
        now = time.monotonic()
        while self.recent and now - self.recent[0] > self.window_s:
            self.recent.popleft()
        self.recent.append(now)
        return min(8.0, 0.1 * 2 ** (len(self.recent) - 1))

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_retry_after(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] == 503:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"retry-after"]
                headers.append((b"retry-after", f"{self.retry_after_s():.2f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_retry_after)


def _die_with_parent() -> None:
    """In the server process (Linux): get SIGTERM when the command's process dies, even by SIGKILL."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def api_configured() -> bool:
    """Whether the user chose an API: ``$PREFECT_API_URL``, the active profile's, or this process's settings."""
    if os.environ.get("PREFECT_API_URL"):
        return True
    if os.environ.get("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", "").lower() in {"0", "false"}:
        return True  # no temporary server wanted: let Prefect say so
    if "prefect" in sys.modules:  # already imported (a test harness, a notebook): ask its settings
        from prefect.settings import get_current_settings

        return get_current_settings().api.url is not None
    home = Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect")).expanduser()
    profiles = Path(os.environ.get("PREFECT_PROFILES_PATH", home / "profiles.toml")).expanduser()
    with contextlib.suppress(OSError):
        return "PREFECT_API_URL" in profiles.read_text()
    return False


_saved_env: dict[str, str | None] | None = None  # what the environment held before start_if_needed set it


def start_if_needed() -> TemporaryAPI | None:
    """Start this command's temporary API unless an API is configured; the started one (or None).

    When Prefect is not imported yet (the command), ``$PREFECT_API_URL`` names the server and
    ``$PREFECT_UI_URL`` is empty (no UI to link to) until :func:`stop`: Prefect's settings read them at
    import, so every thread of the process sees them, not only the flows' context (:func:`ready`). A
    thread that did not see the API would start Prefect's own temporary server.
    """
    global _current, _saved_env
    if _current is not None or api_configured():
        return _current
    _current = TemporaryAPI.start()
    if "prefect" not in sys.modules:
        _saved_env = {key: os.environ.get(key) for key in ("PREFECT_API_URL", "PREFECT_UI_URL")}
        os.environ.update(PREFECT_API_URL=_current.url, PREFECT_UI_URL="")
    return _current


def stop() -> None:
    """Send what Prefect still holds (logs, events) to this command's temporary API, then stop it."""
    global _current, _saved_env
    api, _current = _current, None
    if api is None:
        return
    if api.ready_after_s is not None and "prefect" in sys.modules:
        compat.drain_prefect_workers(timeout_s=5)
    api.stop()
    for key, value in (_saved_env or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _saved_env = None


@contextlib.contextmanager
def ready() -> Iterator[None]:
    """Around a flow call: wait for the temporary API and point Prefect at it (no-op without one).

    Inside, Prefect's settings name the API, flow runs send no heartbeats, and no Prefect UI is linked (no
    "View at" lines, no UI links on MLflow runs): it would be gone after the command. The environment
    already names it when :func:`start_if_needed` ran before Prefect's import (the command); otherwise
    (Prefect imported earlier in this process) :func:`tasks.runners.share_api_with_workers` puts it there
    for worker processes, and it is restored on the way out.
    """
    api = _current
    if api is None:
        yield
        return
    from prefect.settings import get_current_settings, temporary_settings

    api.wait(float(get_current_settings().server.ephemeral.startup_timeout_seconds))
    saved = os.environ.get("PREFECT_API_URL")  # share_api_with_workers sets it for worker processes
    updates = {"api.url": api.url, "ui_url": "", "flows.heartbeat_frequency": None}
    try:
        with temporary_settings(updates=updates):
            yield
    finally:
        if saved is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = saved
