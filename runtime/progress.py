"""Progress on the terminal for long fan-outs: one bar per step instead of one log line per task run.

:func:`quiet_task_runs_on_console` keeps the routine ``Task run 'ingest user 042' - Finished in state
Completed()`` lines out of the console (they still reach the Prefect API, so the UI shows every task run
and its logs; warnings and errors still print), and :func:`track` shows a bar while a step's futures
finish: per-user ingestion and staypoints, and the trainings of a flow run. Bars draw only on a terminal
(``NEXTLOC_PROGRESS=0`` turns them off); elsewhere, as in CI logs, the step's one summary line is what is
printed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from prefect.futures import PrefectFuture, as_completed

ROUTINE_STATES = ("Finished in state Completed()", "Finished in state Cached(")


class RoutineTaskRunFilter(logging.Filter):
    """Drops the routine INFO line a task run logs when it completes (or is cached); keeps everything else."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO or not record.name.startswith("prefect.task_runs"):
            return True
        return not str(record.msg).startswith(ROUTINE_STATES)


def quiet_task_runs_on_console() -> None:
    """Keep routine task-run completions off the console handlers (not off the API); idempotent."""
    import prefect.main  # noqa: F401  (configures Prefect's logging, once per process)
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(
            isinstance(f, RoutineTaskRunFilter) for f in handler.filters
        ):
            handler.addFilter(RoutineTaskRunFilter())


def progress_enabled() -> bool:
    """Bars draw on a terminal unless ``NEXTLOC_PROGRESS=0``."""
    from rich.console import Console

    return os.environ.get("NEXTLOC_PROGRESS", "1") != "0" and Console(stderr=True).is_terminal


def track(futures: Sequence[PrefectFuture], label: str, sizes: Sequence[int] | None = None) -> list[Any]:
    """Wait for ``futures`` with a bar of how much finished; their results, in order.

    ``sizes`` counts the items each future stands for (a batch of per-user calls), so the bar counts users,
    not batches. A failed future raises when its result is read, after the bar closes, exactly as
    ``.result()`` would.
    """
    if futures and progress_enabled():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        size = dict(zip((id(f) for f in futures), sizes or [1] * len(futures), strict=True))
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
            step = bar.add_task(label, total=sum(size.values()))
            for future in as_completed(list(futures)):
                bar.advance(step, size[id(future)])
    return [f.result() for f in futures]
