"""The training process pool: runs start in submission order; workers end without the interpreter's teardown,
losing nothing."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect import flow, get_run_logger, task

from tasks.runners import training_runner


def _note_exit(path: str) -> None:
    Path(path).write_text("ran")


@task
def work(marker: str) -> int:
    """Logs through Prefect from the worker and registers an exit handler of its own."""
    get_run_logger().info("hello from worker %d", os.getpid())
    atexit.register(_note_exit, marker)
    return os.getpid()


@flow(task_runner=training_runner(1))
def run_in_pool(marker: str) -> int:
    return work.submit(marker).result()


@pytest.mark.usefixtures("prefect_api")
def test_worker_runs_exit_handlers_and_ends(tmp_path):
    """The handlers the task registered ran (ours runs last), the pool shut down, the result came back."""
    marker = tmp_path / "exit-handler"
    pid = run_in_pool(str(marker))
    assert pid != os.getpid()
    assert marker.read_text() == "ran"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the worker is gone


SCRIPT = """
import atexit, sys
from tasks.runners import _exit_without_teardown
_exit_without_teardown()
atexit.register(print, "handler ran", flush=True)
class TornDown:
    def __del__(self):
        print("torn down", flush=True)
kept = TornDown()
sys.stdout.write("unflushed")
"""


def test_exit_skips_the_teardown_after_the_handlers():
    """Handlers registered after the initializer run, stdout is flushed, objects are not freed one by one."""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    assert out.stdout == "unflushedhandler ran\n"


RUN_S = 0.5  # how long each run takes
SLACK_S = 0.15  # two workers picking up the next two runs may read their clocks in either order


@task
def started_at(i: int) -> tuple[int, float]:
    at = time.monotonic()
    time.sleep(RUN_S)
    return i, at


@flow(task_runner=training_runner(2))
def six_in_two_workers() -> list[tuple[int, float]]:
    return [f.result() for f in [started_at.submit(i) for i in range(6)]]


@pytest.mark.usefixtures("prefect_api")
def test_runs_start_in_the_order_they_were_submitted():
    """Six runs on two workers: none starts a run's length before the one submitted before it.

    Runs go to the free workers two at a time, so two runs handed over in order can start within a fraction
    of a millisecond of each other, in either order by the clock. A run handed over out of order starts a
    whole run (0.5 s) before the one submitted ahead of it.
    """
    runs = six_in_two_workers()
    assert [i for i, _ in runs] == list(range(6))
    starts = [at for _, at in runs]
    early = [
        (i, round(starts[i - 1] - starts[i], 3)) for i in range(1, 6) if starts[i] < starts[i - 1] - SLACK_S
    ]
    assert not early, f"(run, seconds it started before the run submitted ahead of it): {early}"
