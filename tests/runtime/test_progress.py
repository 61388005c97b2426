"""The console shows one bar per step, not one line per task run (the API still gets every line)."""

from __future__ import annotations

import logging

import pytest

from runtime.progress import RoutineTaskRunFilter


def record(name: str, level: int, msg: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, None, None)


@pytest.mark.parametrize(
    ("name", "level", "msg", "shown"),
    [
        ("prefect.task_runs", logging.INFO, "Finished in state Completed()", False),
        ("prefect.task_runs", logging.INFO, "Finished in state Cached(type=COMPLETED)", False),
        ("prefect.task_runs", logging.INFO, "found 182 user folders", True),  # a task's own message
        ("prefect.task_runs", logging.ERROR, "Finished in state Failed('boom')", True),
        ("prefect.task_runs", logging.WARNING, "Finished in state Completed()", True),
        ("prefect.flow_runs", logging.INFO, "Finished in state Completed()", True),  # the flow's own end
        ("nextloc.preprocessing.locations", logging.INFO, "DBSCAN: 954 staypoints -> 78 locations", True),
    ],
)
def test_only_routine_task_run_completions_leave_the_console(name, level, msg, shown):
    assert RoutineTaskRunFilter().filter(record(name, level, msg)) is shown


def test_quiet_console_is_idempotent_and_touches_only_console_handlers():
    from prefect.logging.handlers import APILogHandler, PrefectConsoleHandler

    from runtime.progress import quiet_task_runs_on_console

    quiet_task_runs_on_console()
    quiet_task_runs_on_console()
    root = logging.getLogger()
    consoles = [h for h in root.handlers if isinstance(h, PrefectConsoleHandler)]
    assert consoles
    for handler in consoles:
        assert sum(isinstance(f, RoutineTaskRunFilter) for f in handler.filters) == 1
    for handler in logging.getLogger("prefect.task_runs").handlers:  # the API still gets every line
        if isinstance(handler, APILogHandler):
            assert not any(isinstance(f, RoutineTaskRunFilter) for f in handler.filters)
    for handler in consoles:  # leave the test process as we found it
        handler.filters = [f for f in handler.filters if not isinstance(f, RoutineTaskRunFilter)]
