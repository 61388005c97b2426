"""Task runners: the per-user fan-out and the trainings, on this machine (default) or a Dask cluster.

``local`` maps per-user work on a thread pool in the flow's process and runs the trainings in a process
pool. ``dask`` uses ``prefect-dask``'s ``DaskTaskRunner`` for both: a ``distributed.LocalCluster`` of
``workers`` single-threaded processes, or the scheduler at ``dask_address`` (``tcp://host:8786``) of an
existing cluster; each (kind, seed) training is one task there. Only paths and small records cross task
boundaries, so workers need the data directory on a shared filesystem, nothing else.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, Literal, Self

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner
from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtime import compat

RunnerKind = Literal["local", "dask"]
# The training processes' glibc malloc maps blocks from 1 MiB up at a fixed threshold. Left to itself, the
# threshold rises to the largest block freed so far, and a routine kind's evaluation, which frees a (batch x
# places) answer after each batch in sizes that vary, leaves them in the heap as fragments that grow with
# questions x places: a 4x synthetic ranker's training held 2.6-3.0 GB rather than 1.25 GB (BENCHMARKS.md).
# A value already in the environment wins; other C libraries ignore it.
TRAINING_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


class Runner(BaseModel):
    """The ``runner`` section of the flows: who runs the per-user work and the trainings.

    Attributes:
        task_runner: ``local`` (threads, and a process pool of ``training.workers`` for the trainings) or
            ``dask`` (both on a Dask cluster).
        dask_address: the scheduler of an existing Dask cluster (``tcp://host:8786``; ``dask`` only).
        dask_workers: the processes of a new ``LocalCluster`` (default: the cores).
        dbscan_tiles: > 0 runs the dataset-level DBSCAN by that many spatial tiles, on the Dask workers with
            ``dask`` (the same location ids; 0: sklearn on one machine).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_runner: RunnerKind = "local"
    dask_address: str | None = None
    dask_workers: Annotated[int, Field(ge=1)] | None = None
    dbscan_tiles: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _address_needs_dask(self) -> Runner:
        if self.dask_address and self.task_runner != "dask":
            raise ValueError("dask_address is only used with task_runner='dask'")
        return self

    def per_user(self) -> TaskRunner:
        """The runner of the per-user preprocessing work (:func:`make_task_runner`)."""
        return make_task_runner(self.task_runner, self.dask_workers, self.dask_address)

    def trainings(self, workers: int) -> TaskRunner:
        """The runner of the trainings: ``workers`` processes here, or the Dask cluster
        (:func:`make_training_runner`)."""
        dask = self.task_runner == "dask"
        return make_training_runner(
            self.task_runner, self.dask_workers if dask else workers, self.dask_address
        )


def make_task_runner(
    kind: RunnerKind = "local",
    workers: int | None = None,
    dask_address: str | None = None,
    worker_env: dict[str, str] | None = None,
) -> TaskRunner:
    """The task runner for per-user preprocessing work.

    Args:
        kind: ``local`` (a thread pool in this process) or ``dask``.
        workers: threads (local) or worker processes of a new ``LocalCluster`` (dask); default: the cores.
        dask_address: scheduler address of an existing Dask cluster (``kind="dask"`` only).
        worker_env: environment variables of a new ``LocalCluster``'s worker processes.

    Raises:
        ValueError: on an unknown kind, or an address given for the local runner.
    """
    n = max(1, workers or os.cpu_count() or 1)
    if kind == "local":
        if dask_address:
            raise ValueError("dask_address is only used with task_runner='dask'")
        return FanOutThreadPool(max_workers=max(2, n))
    if kind != "dask":
        raise ValueError(f"task_runner must be 'local' or 'dask', got {kind!r}")
    from prefect_dask import DaskTaskRunner

    share_api_with_workers()
    if dask_address:
        return DaskTaskRunner(address=dask_address)
    return DaskTaskRunner(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs={
            "n_workers": n,
            "threads_per_worker": 1,
            "processes": True,
            "dashboard_address": ":0",
            **({"env": worker_env} if worker_env else {}),
        },
    )


class FanOutThreadPool(ThreadPoolTaskRunner):
    """Prefect's thread pool, saying how wide it is (:attr:`width`: the ``max_workers`` it was made with;
    Prefect keeps the width only in a private attribute). A copy Prefect makes for a flow run is as wide."""

    def __init__(self, max_workers: int | None = None) -> None:
        super().__init__(max_workers=max_workers)
        self.width = max_workers


class TrainingPoolTaskRunner(ProcessPoolTaskRunner):
    """Prefect's process pool, its runs started in the order they were submitted.

    Prefect's runner hands each submission to its process pool from a thread pool of ``max_workers``
    threads, after resolving the submission's inputs, so runs started in whichever order those threads got
    there: seed 4 before seed 3 in one invocation and after it in the next, and so another run left
    alone at the end and another wall time. Here one thread hands them over, in order
    (:func:`runtime.compat.submit_in_order`). A submission that waits for an upstream future holds back the
    ones after it; the trainings have no upstream futures.

    Its workers start with :data:`TRAINING_ENV` and report to the flow's Prefect API
    (:func:`share_api_with_workers` before they start): a worker
    that found no API in its environment started a temporary server of its own on the same ``PREFECT_HOME``
    database, a second SQLite writer beside the local API, left running once the worker ended.
    """

    def __enter__(self) -> Self:
        share_api_with_workers()
        for key, value in TRAINING_ENV.items():  # the workers are spawned: they start with this environment
            os.environ.setdefault(key, value)
        super().__enter__()
        compat.submit_in_order(self)
        return self


def training_runner(workers: int = 1) -> ProcessPoolTaskRunner:
    """The process pool the trainings run in: ``workers`` processes, each ending without the teardown.

    A worker process that has loaded torch, MLflow and Prefect spends about 1 s tearing the interpreter down
    when the pool shuts it down, and the flow waits for it. Its last exit handler (registered first, run
    last) is :func:`runtime.compat.end_worker_without_teardown`: multiprocessing's queues are delivered (the
    log and event messages forwarded to the flow's process), then the process ends at once.
    """
    return TrainingPoolTaskRunner(max_workers=workers, initializer=_exit_without_teardown)


def make_training_runner(
    kind: RunnerKind = "local", workers: int = 1, dask_address: str | None = None
) -> TaskRunner:
    """The task runner for the trainings: :func:`training_runner` (``local``: ``workers`` processes of this
    machine), or Dask (:func:`make_task_runner`: a new ``LocalCluster`` of ``workers`` single-threaded
    processes, or the cluster at ``dask_address``), one task per (kind, seed). The processes it starts run
    with :data:`TRAINING_ENV` (an existing cluster's workers: as their operator started them).

    Raises:
        ValueError: on an unknown kind, or an address given for the local runner.
    """
    if kind == "local" and not dask_address:
        return training_runner(max(1, workers))
    env = {key: os.environ.get(key, value) for key, value in TRAINING_ENV.items()}
    return make_task_runner(kind, workers, dask_address, worker_env=env)


def _exit_without_teardown() -> None:
    atexit.register(compat.end_worker_without_teardown)


def share_api_with_workers() -> None:
    """Point worker processes at this run's Prefect API (else each would start its own local server).

    Worker processes inherit the environment when they start, so call this before the runner starts them.
    """
    if not os.environ.get("PREFECT_API_URL"):
        with get_client(sync_client=True) as client:
            os.environ["PREFECT_API_URL"] = str(client.api_url)


def tile_map() -> Callable[..., Iterable[Any]]:
    """A ``map`` for independent pieces of one task's work (DBSCAN tiles): on the flow's Dask cluster when
    its task runner is Dask, else the builtin ``map`` in this process.

    The Dask map submits plain functions through the runner's client and gathers the results in order.
    """
    client = _dask_client(_flow_task_runner())
    if client is None:
        return map

    def dask_map(fn: Callable[..., Any], *iterables: Iterable[Any]) -> list[Any]:
        return client.gather(client.map(fn, *(list(it) for it in iterables), pure=False))

    return dask_map


def fan_out_width() -> int:
    """How many tasks the current flow's task runner runs at once: its threads, or the Dask cluster's."""
    runner = _flow_task_runner()
    if isinstance(runner, FanOutThreadPool) and runner.width:
        return runner.width
    client = _dask_client(runner)
    if client is not None:
        with contextlib.suppress(Exception):  # a cluster that cannot say: fall back to this machine's cores
            return max(1, sum(client.nthreads().values()))
    return os.cpu_count() or 1


def balanced_batches(weights: Sequence[float], n_batches: int) -> list[list[int]]:
    """Split items into at most ``n_batches`` batches of about equal total weight, heaviest batch first.

    Longest-processing-time first: each item, heaviest first, joins the lightest batch so far. Batches list
    item indices in ascending order; the result depends only on the weights (ties broken by index).
    """
    n = max(1, min(n_batches, len(weights)))
    loads = [0.0] * n
    batches: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        b = min(range(n), key=lambda b: (loads[b], b))
        batches[b].append(i)
        loads[b] += weights[i]
    order = sorted(range(n), key=lambda b: (-loads[b], b))
    return [sorted(batches[b]) for b in order if batches[b]]


def _dask_client(runner: TaskRunner | None) -> Any | None:
    """The ``distributed.Client`` of a prefect-dask ``DaskTaskRunner`` (its public ``client``, connected on
    first use); None for any other runner."""
    if runner is None or not type(runner).__module__.startswith("prefect_dask"):
        return None
    return runner.client


def _flow_task_runner() -> TaskRunner | None:
    ctx = FlowRunContext.get()
    return ctx.task_runner if ctx is not None else None
