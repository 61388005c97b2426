"""What the local Prefect API was doing while a request stayed open: the evidence a stall needs.

Once per request open longer than ``max(slow_s, DUMP_AFTER_S)``, the server logs every asyncio task's await
chain (each coroutine down to the future it waits on) and every thread's stack: which request or service
holds a database transaction, which one waits for SQLite's lock, and in which thread.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import MutableMapping
from typing import Any

DUMP_AFTER_S = 10.0  # no dump for a request under this, whatever the slow-request line's limit


def await_chain(task: asyncio.Task[Any]) -> list[str]:
    """The task's coroutines, outermost first, each with the line it waits at, then what the last awaits."""
    lines: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            lines.append(f"  awaits {awaited!r}"[:300])
            break
        code = frame.f_code
        lines.append(f"  {code.co_filename}:{frame.f_lineno} in {code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return lines


def stacks() -> str:
    """Every asyncio task of the running loop and every thread, as text."""
    out = []
    for task in sorted(asyncio.all_tasks(), key=lambda t: t.get_name()):
        out += [f"task {task.get_name()}:", *await_chain(task)]
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():  # the documented way to read other threads' stacks
        out.append(f"thread {names.get(ident, ident)}:")
        out += ["  " + line.rstrip() for line in traceback.format_stack(frame, limit=12)]
    return "\n".join(out)


async def watch_open_requests(
    open_requests: MutableMapping[int, tuple[str, float]], slow_s: float, log: logging.Logger
) -> None:
    """Log :func:`stacks` once for each request in ``open_requests`` (``id -> (what, start)``) open too long."""
    limit = max(slow_s, DUMP_AFTER_S)
    dumped: set[int] = set()
    while True:
        await asyncio.sleep(1.0)
        now = time.monotonic()
        for key, (what, start) in list(open_requests.items()):
            if now - start > limit and key not in dumped:
                dumped.add(key)
                log.warning(
                    "request open %.1f s: %s; the server's tasks and threads:\n%s",
                    now - start,
                    what,
                    stacks(),
                )
        dumped &= set(open_requests)
