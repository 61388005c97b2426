"""What a flow reuses instead of running: the one place that decides, from a data directory's cache, which task
calls run.

- :func:`call_cached`: one task call, or its cached result without a task run.
- :class:`PerItem` and :func:`map_cached`: a per-user task over many items (optionally a second one chained on
  each result); only the calls not in the cache run, in a few balanced ``cached-batch`` task runs.
- :class:`Trainings`: a training flow's calls looked up once; :meth:`Trainings.settled` names the parent run
  that already holds them and the champion decisions on them (a rerun with nothing new: no MLflow, no parent
  run of its own, :mod:`runtime.reruns`), :meth:`Trainings.run` trains the rest, :meth:`Trainings.remember`
  records where the results went. :class:`Decisions` is what those decisions read.

Every lookup is :func:`runtime.caching.current_result`'s: a hit is reused only if each file it points at is
still the one written; otherwise a warning names the file and the call runs again.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import get_run_logger, unmapped
from pydantic import BaseModel

from runtime.caching import Then, cached_batch, current_result
from runtime.catalog import Catalog
from runtime.progress import track
from runtime.reruns import Settled, read_settled, settled_key, write_settled
from runtime.runners import balanced_batches, fan_out_width

__all__ = ["Decisions", "PerItem", "Settled", "Trainings", "call_cached", "map_cached"]


def call_cached(task: Any, *args: Any) -> Any:
    """Call ``task`` (its ``result_storage`` set), or return its cached result without a task run.

    A hit whose files are still the ones written is returned; a miss, or a result whose files changed (the
    warning names them, the record is removed), runs the task, which caches its result. The cache is looked
    up first, which also clears a record a crash left unreadable.
    """
    parameters = dict(inspect.signature(task.fn).bind(*args).arguments)
    hit, result = current_result(task, parameters, task.result_storage)
    return result if hit else task(*args)


# --- per-user fan-out ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PerItem:
    """A per-user task over a list of items.

    Attributes:
        task: the task (its ``result_storage`` the data directory's cache).
        mapped_name: its parameter that takes the item.
        weight: an estimate of one call's work, from its item (balances the batches).
        kwargs: the other parameters, each ``unmapped(value)`` or a list of one value per item.
    """

    task: Any
    mapped_name: str
    weight: Callable[[Any], float]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def call(self, i: int, item: Any) -> dict[str, Any]:
        """The parameters of the call on ``item``, the ``i``-th item."""
        return {
            self.mapped_name: item,
            **{k: (v.value if isinstance(v, unmapped) else v[i]) for k, v in self.kwargs.items()},
        }

    def others(self, i: int) -> dict[str, Any]:
        """The parameters of the ``i``-th call but the item."""
        return {k: v for k, v in self.call(i, None).items() if k != self.mapped_name}


def map_cached(
    step: PerItem, items: list, storage: Path, then: PerItem | None = None
) -> tuple[list[list], list[int]]:
    """Run a per-user task (and ``then`` a second one on each result) over the calls not in the cache.

    Calls whose cached result points at files that are gone or changed run again (a warning names the file).
    The calls to run go in a few balanced batches (the step's ``weight`` estimates a call's work), four per
    worker of the flow's task runner, each one ``cached-batch`` task run that caches every call under the
    per-user task's own key (:func:`runtime.caching.cached_batch`). With ``then``, a user whose first step must
    run goes on to the second in the same batch (no wait for the other users in between); a user whose first
    step is cached and second is not runs the second alone. A single call runs as a batch of one, named as the
    per-user task run would be.

    Returns:
        The results of each step in the order of ``items``, and how many calls of each step were not found in
        the cache (and so ran in a batch).
    """
    steps = [step] if then is None else [step, then]
    results: list[list[Any]] = [[None] * len(items) for _ in steps]
    todo: list[list[int]] = [[] for _ in steps]  # [both steps (or the one), the second step alone]
    for i, item in enumerate(items):
        for k, s in enumerate(steps):
            hit, value = current_result(s.task, s.call(i, item if k == 0 else results[0][i]), storage)
            if not hit:
                todo[k].append(i)
                break
            results[k][i] = value
    submitted = _submit_batches(0, step, todo[0], items, storage, then)
    if then is not None:
        submitted += _submit_batches(1, then, todo[1], results[0], storage)
    if submitted:
        label = " + ".join(s.task.name for s in steps) + f" ({sum(map(len, todo))} users)"
        done = track([f for _, _, f in submitted], label, sizes=[len(b) for _, b, _ in submitted])
        for (k, batch, _), batch_results in zip(submitted, done, strict=True):
            for i, result in zip(batch, batch_results, strict=True):
                if then is not None and k == 0:
                    results[0][i], results[1][i] = result
                else:
                    results[k][i] = result
    ran = [len(todo[0])] if then is None else [len(todo[0]), len(todo[0]) + len(todo[1])]
    for s, out, n in zip(steps, results, ran, strict=True):
        get_run_logger().info("%s: %d cached results reused, %d run", s.task.name, len(out) - n, n)
    return results, ran


def _submit_batches(
    k: int, step: PerItem, todo: list[int], items: list, storage: Path, then: PerItem | None = None
) -> list[tuple[int, list[int], Any]]:
    """Submit ``step``'s calls on ``items[i]`` for ``i`` in ``todo``, in balanced ``cached-batch`` runs (each
    call chained to ``then``, when given): ``(k, the batch's item indices, its future)`` per batch."""
    batches = balanced_batches([step.weight(items[i]) for i in todo], 4 * fan_out_width()) if todo else []
    submitted = []
    for b, members in enumerate(batches, 1):
        rows = [todo[j] for j in members]
        calls = [step.call(i, items[i]) for i in rows]
        chained = None if then is None else Then(then.task, then.mapped_name, [then.others(i) for i in rows])
        future = cached_batch.with_options(
            task_run_name=_batch_name(step.task, calls, b, len(batches), then),
            retries=step.task.retries,
            retry_delay_seconds=step.task.retry_delay_seconds,
        ).submit(step.task, calls, str(storage), chained)
        submitted.append((k, rows, future))
    return submitted


def _batch_name(
    task_fn: Any, calls: list[dict[str, Any]], k: int, n: int, then: PerItem | None = None
) -> str:
    """A batch of one is named as its per-user task run; a larger one by its task, size and place (a chained
    second task adds ``+ <its name>``)."""
    chained = "" if then is None else f" + {then.task.name}"
    if len(calls) == 1 and isinstance(task_fn.task_run_name, str):
        return task_fn.task_run_name.format(**calls[0]) + chained
    return f"{task_fn.name}{chained} x{len(calls)} (batch {k} of {n})"


# --- trainings and the rerun with nothing new -----------------------------------------------------------


@dataclass(frozen=True)
class Decisions:
    """What a training run's champion decisions read besides the trainings: part of its record's key.

    Attributes:
        rule: the champion rule (:class:`tasks.promotion.PromotionRule`).
        kinds: the kinds whose champion is decided (empty: none is).
        tracking_uri: the store the decisions go to (resolved, never None).
        experiment: the experiment of the parent runs.
        champions: reads the version holding each kind's champion alias now,
            ``champions(kinds, tracking_uri, experiment)`` (:func:`tracking.versions.champion_versions`).
    """

    rule: BaseModel
    kinds: list[str]
    tracking_uri: str
    experiment: str
    champions: Callable[[list[str], str, str], dict[str, str | None]]

    def key(self, catalog: Catalog, runs: list[dict[str, Any]]) -> str:
        """The key of the record of ``runs`` decided on under this rule, with the champions as they are now
        (:func:`runtime.reruns.settled_key`)."""
        champions = self.champions(self.kinds, self.tracking_uri, self.experiment)
        return settled_key(
            catalog, runs, champions, self.rule, self.kinds, self.tracking_uri, self.experiment
        )


@dataclass(frozen=True)
class Trainings:
    """A training task's calls in a data directory, each looked up in its cache once (:meth:`look_up`).

    Attributes:
        task: the training task, its results stored in ``catalog.cache``.
        calls: its parameters, one dict per (kind, seed).
        catalog: the data directory.
        cached: ``(hit, result)`` per call, in order.
    """

    task: Any
    calls: list[dict[str, Any]]
    catalog: Catalog
    cached: list[tuple[bool, Any]]

    @classmethod
    def look_up(cls, task: Any, calls: list[dict[str, Any]], catalog: Catalog) -> Trainings:
        """``task``'s ``calls`` with the cached result of each (a hit only if its files are as written)."""
        task = task.with_options(result_storage=catalog.cache)
        return cls(task, calls, catalog, [current_result(task, call, catalog.cache) for call in calls])

    def cached_results(self) -> list[Any]:
        """The cached result of each call (None for a miss)."""
        return [value for _, value in self.cached]

    def settled(self, decisions: Decisions) -> Settled | None:
        """The record of the run that recorded these trainings and made ``decisions`` on them, if every
        training is cached and every champion is still where that run left it; else None."""
        if not all(hit for hit, _ in self.cached):
            return None
        return read_settled(self.catalog, decisions.key(self.catalog, self.cached_results()))

    def run(self, **parameters: Any) -> list[dict[str, Any]]:
        """Each call's result, in order: a cached one as read back (no worker process starts for it), the others
        trained on the flow's task runner with ``parameters`` over their own (ones the cache key leaves out,
        such as the parent run's id)."""
        calls = [{**call, **parameters} for call in self.calls]
        futures = {
            i: self.task.submit(**call)
            for i, (call, (hit, _)) in enumerate(zip(calls, self.cached, strict=True))
            if not hit
        }
        done = dict(
            zip(futures, track(list(futures.values()), f"training ({len(futures)} runs)"), strict=True)
        )
        get_run_logger().info("trainings: %d cached, %d run", len(calls) - len(futures), len(futures))
        return [done.get(i, value) for i, (_, value) in enumerate(self.cached)]

    def remember(self, results: list[dict[str, Any]], decisions: Decisions, settled: Settled) -> None:
        """Record that ``results`` and ``decisions`` on them are ``settled``, keyed on the champions as the
        decisions left them."""
        write_settled(self.catalog, decisions.key(self.catalog, results), settled)
