"""Every use of a private API of Prefect or CPython, each behind one small named shim.

nextloc reaches into internals only where the public API lacks the hook or costs time on every command.
Each such place is a function here, checked against the version range it was written and tested for
(:data:`RANGES`). Outside its range a shim either falls back to the public path (what the code does
without the shortcut; a warning names the shim) or fails loudly where a silent difference would change
results; each docstring says which. ``tests/runtime/test_compat.py`` tests every shim in and out of range.

This module imports only the standard library at import time: ``commands.main`` imports it before Prefect is
loaded, and the version checks read package metadata only when a shim is called.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.metadata
import logging
import os
import re
import sys
import threading
from typing import Any, NoReturn

log = logging.getLogger(__name__)

#: Versions each shim was written for: ``low <= version < high`` (release numbers only).
RANGES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "cpython": ((3, 11), (3, 14)),  # requires-python
    "prefect": ((3, 8), (3, 9)),  # pyproject's prefect>=3.8,<3.9; constraints.txt pins 3.8.8
}


@functools.cache
def installed_release(component: str) -> tuple[int, ...] | None:
    """The release numbers of ``component`` as installed (``cpython``: this interpreter), or None."""
    if component == "cpython":
        return tuple(sys.version_info[:3]) if sys.implementation.name == "cpython" else None
    try:
        version = importlib.metadata.version(component)
    except importlib.metadata.PackageNotFoundError:
        return None
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else None


def supported(component: str) -> bool:
    """Whether the installed ``component`` is within the range the shims were written for."""
    low, high = RANGES[component]
    release = installed_release(component)
    return release is not None and low <= release < high


def _versions(component: str) -> tuple[str, str, str]:
    """``(installed, low, high)`` of ``component``, as text."""

    def text(release: tuple[int, ...] | None) -> str:
        return ".".join(map(str, release)) if release else "none"

    low, high = RANGES[component]
    return text(installed_release(component)), text(low), text(high)


@functools.cache  # once per shim and process
def _fallback(shim: str, component: str) -> None:
    installed, low, high = _versions(component)
    log.warning(
        "%s: %s %s is outside >=%s,<%s (runtime/compat.py); falling back as its docstring says",
        shim,
        component,
        installed,
        low,
        high,
    )


class UnsupportedVersion(RuntimeError):
    """A shim that must not guess was called on a version outside its range."""


def _require(shim: str, component: str) -> None:
    if not supported(component):
        installed, low, high = _versions(component)
        raise UnsupportedVersion(
            f"{shim} was written for {component} >={low},<{high}, installed: {installed}; "
            "check runtime/compat.py against the new version and widen RANGES"
        )


# --- CPython ---------------------------------------------------------------------------------------


def exit_without_teardown(code: int) -> NoReturn:
    """End the process with ``code`` after what an exit must do, skipping the interpreter's teardown.

    Freeing every object of torch, pandas, MLflow and Prefect one by one takes about 1.2 s at the end of a
    command, memory the OS takes back at once anyway. The interpreter's own first steps of an exit run, in
    its order: threading's exit hooks (idle thread-pool workers stop) and the join of non-daemon threads
    (``threading._shutdown``), every ``atexit`` handler (``atexit._run_exitfuncs``: logging's flush,
    Prefect's and MLflow's own); the standard streams are flushed; then ``os._exit``.

    Outside its CPython range: ``sys.exit(code)``, the normal exit with its teardown. Retired by: a public
    exit that runs the exit hooks and skips the teardown (CPython has none: ``os._exit`` skips both).
    """
    if not supported("cpython"):
        _fallback("exit_without_teardown", "cpython")
        sys.exit(code)
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def end_worker_without_teardown() -> None:
    """As a process's last ``atexit`` handler: deliver multiprocessing's queued messages, then end at once.

    A worker process that has loaded torch, MLflow and Prefect spends about 1 s tearing the interpreter
    down, and the pool that shuts it down waits for it. ``multiprocessing.util._exit_function`` is what
    the interpreter's own exit would run for multiprocessing: the queues' feeder threads deliver what they
    hold (the log and event messages forwarded to the flow's process). Then the streams are flushed and
    the process ends with code 0 (the pool does not read worker exit codes).

    Outside its CPython range: returns, and the interpreter's normal exit goes on. Retired by: a public
    flush of multiprocessing's queue feeders, or a Prefect process pool that ends its workers without the
    teardown (neither exists).
    """
    if not supported("cpython"):
        _fallback("end_worker_without_teardown", "cpython")
        return
    import multiprocessing.util

    multiprocessing.util._exit_function()  # type: ignore[attr-defined]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


# --- Prefect ---------------------------------------------------------------------------------------------


def submit_in_order(runner: Any) -> None:
    """Make a started Prefect ``ProcessPoolTaskRunner`` hand its submissions to the pool in order.

    Prefect resolves each submission's inputs and hands it to the process pool from a private thread pool
    (``_resolver_executor``) of ``max_workers`` threads, so runs start in whichever order those threads get
    there. This replaces it (before anything was submitted) with one thread. Outside its Prefect range:
    Prefect's own executor stays (runs may start out of submission order; results are the same). Retired
    by: an option of ``ProcessPoolTaskRunner`` that keeps submission order (Prefect 3.8.8 has none). Upstream:
    the resolver pool came with PrefectHQ/prefect#19172 (futures resolved before pickling); no upstream issue
    found about submission order.
    """
    if not supported("prefect"):
        _fallback("submit_in_order", "prefect")
        return
    from concurrent.futures import ThreadPoolExecutor

    if runner._resolver_executor is not None:
        runner._resolver_executor.shutdown(wait=False)  # unused so far: nothing was submitted
        runner._resolver_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="training-submit")


def engine_cache_key(task: Any, parameters: dict[str, Any]) -> str | None:
    """The cache key Prefect's task engine computes for calling ``task`` with ``parameters``.

    The engine binds the call's parameters (defaults included) with ``get_call_parameters`` and asks the
    task's cache policy for a key, given its task run context, the inputs and the flow's parameters. Out of
    a run, a stand-in context carries the task (all that ``TASK_SOURCE`` and nextloc's ``ContentInputs``
    read), and no flow parameters (no nextloc policy reads them). Outside its Prefect range it raises
    :class:`UnsupportedVersion`: a key that silently differed from the engine's would make every lookup
    miss, or find records the engine never wrote. Retired by: a public function that gives a task call's
    cache key (Prefect 3.8.8 computes it only inside the engine, ``compute_transaction_key``). Upstream: no
    upstream issue found.
    """
    _require("engine_cache_key", "prefect")
    from types import SimpleNamespace

    from prefect.utilities.callables import get_call_parameters

    inputs = get_call_parameters(task.fn, (), parameters)
    return task.cache_policy.compute_key(
        task_ctx=SimpleNamespace(task=task), inputs=inputs, flow_parameters={}
    )


def drain_prefect_workers(timeout_s: float) -> None:
    """Send what Prefect's background workers still hold (logs, events) to the API, waiting up to
    ``timeout_s`` for each.

    The command stops its temporary API before the interpreter's exit, when Prefect would drain them
    itself; ``drain_all`` of ``APILogWorker`` and ``EventsWorker`` comes from Prefect's private queue
    service base class. A worker that fails to drain is skipped. Outside its Prefect range: nothing is
    drained (the last logs and events of the command may miss the temporary API's database). Retired by:
    a public flush of Prefect's log and event workers (Prefect 3.8.8's ``APILogHandler.flush`` drains the log
    worker only, always for 5 s; nothing drains the events worker before the interpreter's exit). Upstream: no
    upstream issue found.
    """
    if not supported("prefect"):
        _fallback("drain_prefect_workers", "prefect")
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):
            service.drain_all(timeout=timeout_s)


def one_sqlite_connection() -> None:
    """Give this process's Prefect server one SQLite connection: one writer, and no lock to wait for.

    Prefect's SQLite engine pools up to 15 connections to one database file (SQLAlchemy's 5 plus 10 of
    overflow), so requests and the server's services (the task-run recorder's two consumers) write through
    different connections, and SQLite lets one write at a time. A transaction that has read and then
    writes while another holds the lock fails at once (``database is locked``: Prefect's 503); any other
    writer waits in SQLite's busy handler, up to Prefect's 60 s ``busy_timeout``, and while it waits the
    server's event loop can stall, so the transaction holding the lock, which needs that loop to commit,
    never does until the timeout: a minute-long stall (docs/performance.md). With one
    connection, sessions take turns in the pool, waiting on the event loop, and SQLite never sees two
    writers.

    Prefect builds its engine with ``create_async_engine`` as named in
    ``prefect.server.database.configurations``, when the first session needs it; this wraps that name so
    SQLite engines get a pool of one (``pool_size=1, max_overflow=0``). Call it in the server's process,
    before its app starts. Outside its Prefect range: Prefect's own pool stays (writes contend as above).
    Retired by: pool settings that reach SQLite's engine. Upstream: the pool settings of
    PrefectHQ/prefect#10348 reach only the PostgreSQL configuration (3.8.8's ``AioSqliteConfiguration.engine``
    passes none); tuning Prefect's SQLite connections is open as PrefectHQ/prefect#14658.
    """
    if not supported("prefect"):
        _fallback("one_sqlite_connection", "prefect")
        return
    import prefect.server.database.configurations as configurations
    from sqlalchemy.pool import AsyncAdaptedQueuePool

    create = configurations.create_async_engine
    if getattr(create, "nextloc_one_connection", False):
        return

    @functools.wraps(create)
    def create_with_one_connection(url: Any, **kwargs: Any) -> Any:
        if str(url).startswith("sqlite"):
            kwargs.update(poolclass=AsyncAdaptedQueuePool, pool_size=1, max_overflow=0)
        return create(url, **kwargs)

    create_with_one_connection.nextloc_one_connection = True  # type: ignore[attr-defined]
    configurations.create_async_engine = create_with_one_connection
