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

from runtime.runners import fan_out_width, make_task_runner, training_runner


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
from runtime.runners import _exit_without_teardown
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


RUN_S = 0.2  # how long each run works
WAIT_S = 30  # at most this long, a run then waits for every run submitted before it to have started


@task
def started(i: int, log: str) -> int:
    """Appends ``i`` to the shared start log (one ``O_APPEND`` write: lines never interleave), works, then
    waits until every run before ``i`` has started: a worker is free again only then, however late a worker
    that was handed a run gets to start it (bounded: a run handed out of order ends the wait at ``WAIT_S``)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    time.sleep(RUN_S)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not set(range(i)) <= {
        int(n) for n in Path(log).read_text().split()
    }:
        time.sleep(0.05)
    return i


@flow(task_runner=training_runner(2))
def six_in_two_workers(log: str) -> list[int]:
    return [f.result() for f in [started.submit(i, log) for i in range(6)]]


@pytest.mark.usefixtures("prefect_api")
def test_runs_start_in_the_order_they_were_submitted(tmp_path):
    """Six runs on two workers, handed over in submission order: when run ``i`` starts, every run before
    ``i - 1`` has started (read from the order of the start log, not from clocks).

    Two workers take runs first come, first served: run ``i`` goes to a worker that finished a run, which
    happens only after run ``i - 2`` started (each run ends once the runs before it started: not a race
    between a loaded machine's clocks); runs ``i - 1`` and ``i`` may start in either order.
    """
    log = tmp_path / "starts"
    assert six_in_two_workers(str(log)) == list(range(6))
    order = [int(line) for line in log.read_text().split()]
    assert sorted(order) == list(range(6))
    position = {run: at for at, run in enumerate(order)}
    early = [(i, j) for i in range(6) for j in range(i - 1) if position[i] < position[j]]
    assert not early, f"(run, a run submitted two or more before it that started later), start order {order}"


@flow(task_runner=make_task_runner("local", 3))
def _width_of_three() -> int:
    return fan_out_width()


@flow
def _width_of_prefects_default() -> int:
    return fan_out_width()


@pytest.mark.usefixtures("prefect_api")
def test_the_fan_out_is_as_wide_as_the_pool_nextloc_made():
    """The local runner's width is the one nextloc gave it (no private attribute read); a flow on Prefect's
    default runner fans out over this machine's cores."""
    assert _width_of_three() == 3
    assert _width_of_prefects_default() == (os.cpu_count() or 1)


def test_training_runners_start_their_processes_with_the_training_env(monkeypatch):
    """The process pool or a new Dask LocalCluster, their workers started with TRAINING_ENV (one set
    beforehand wins); an address for the local runner is refused."""
    from runtime.runners import TRAINING_ENV, TrainingPoolTaskRunner, make_training_runner

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # the workers' API: not started here
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert isinstance(make_training_runner("local", 2), TrainingPoolTaskRunner)
    assert make_training_runner("dask", 2).cluster_kwargs["env"] == TRAINING_ENV
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "4096")
    assert make_training_runner("dask", 2).cluster_kwargs["env"] == {"MALLOC_MMAP_THRESHOLD_": "4096"}
    with pytest.raises(ValueError, match="only used with task_runner='dask'"):
        make_training_runner("local", 1, "tcp://127.0.0.1:8786")
