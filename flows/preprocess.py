"""The ``preprocess`` flow: raw GeoLife .plt -> positionfixes -> staypoints -> locations -> samples."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from prefect import flow, get_run_logger, unmapped
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field

from nextloc.config import PreprocessConfig
from nextloc.fingerprint import combine
from nextloc.io.inputs import VISIT_FORMATS, InputFormat, InputSpec
from runtime.caching import Then, cached_batch, call_cached, current_result
from runtime.catalog import Catalog
from runtime.locking import data_dir_lock
from runtime.progress import track
from runtime.runners import balanced_batches, fan_out_width
from tasks.preprocess import (
    DatasetResult,
    IngestResult,
    RawUser,
    build_dataset_task,
    discover_raw_files,
    discover_raw_users,
    generate_staypoints_user,
    ingest_gpx_user,
    ingest_table,
    ingest_user,
    ingest_visits,
    locate_staypoints_task,
    report_duplicates,
    write_ingest_report,
)


@flow(
    name="preprocess",
    flow_run_name="preprocess {data_dir}",
    task_runner=ThreadPoolTaskRunner(max_workers=max(2, os.cpu_count() or 2)),
    validate_parameters=True,
)
def preprocess(
    raw_dir: str,
    data_dir: str = "data/geolife",
    config: PreprocessConfig | None = None,
    input_format: InputFormat = "geolife",
    columns: dict[str, str] | None = None,
    input_timezone: str = "UTC",
    dbscan_tiles: Annotated[int, Field(ge=0)] = 0,
) -> dict[str, Any]:
    """Turn raw trajectories into staypoints, samples and metadata under ``data_dir``.

    ``input_format`` names the input kind: a GeoLife ``Data/`` tree (default), CSV or parquet
    positionfixes (one file or a folder; ``columns`` maps nextloc's column names to the files'), GPX
    folders (one per user), or already-extracted visits (they skip staypoint generation).
    ``input_timezone`` is the zone of timestamps written without one. ``dbscan_tiles`` > 0 runs the
    dataset-level DBSCAN by that many spatial tiles with epsilon-wide halos, on the Dask workers when the
    task runner is Dask (the same location ids, byte for byte; 0, the default, is sklearn on one machine).

    Every task is cached on its inputs' content fingerprints, its config and the library code: a rerun on
    unchanged input is all cache hits, and a changed parameter recomputes only the tasks below it.
    """
    config = config or PreprocessConfig()
    spec = InputSpec(format=input_format, columns=columns or {}, timezone=input_timezone)
    catalog = Catalog(str(Path(data_dir).resolve()))
    store = {"result_storage": catalog.cache}

    with data_dir_lock(catalog.root):  # one writer per data directory
        # Extract: raw data -> per-user positionfixes -> per-user staypoints
        if spec.format in ("geolife", "gpx"):  # one folder per user
            read = _read_users(raw_dir, spec, config, catalog)
        else:  # files not per user (CSV, parquet, visits)
            read = _read_files(raw_dir, spec, config, catalog)
        ingest_summary = write_ingest_report(read.discovery, read.ingested, catalog)

        # Dataset level: quality filter + DBSCAN, then samples
        located, located_stats = _ensure(
            locate_staypoints_task.with_options(**store),
            read.staypoints,
            config,
            str(catalog.located),
            dbscan_tiles,
        )
        upstream = _upstream_counts(read, located_stats, ingest_summary, spec)
        dataset: DatasetResult = _ensure(
            build_dataset_task.with_options(**store),
            located,
            config,
            read.input_fingerprint,
            upstream,
            catalog,
        )
        ingest_summary = report_duplicates(ingest_summary, read.discovery, dataset, config, catalog)
        get_run_logger().info(
            "preprocess done: %d users, total_loc_num %d, samples %s -> %s",
            dataset.stats["n_users"]["train"],
            dataset.stats["total_loc_num"],
            dataset.stats["n_samples"],
            catalog.root,
        )
        return {
            "data_dir": str(catalog.root),
            "stats": dataset.stats,
            "ingest": ingest_summary,
            "flow_run_id": str(flow_run.get_id()),
            "users_run": {"ingest": read.ingest_run, "staypoints": read.staypoints_run},
        }


@dataclass
class _Read:
    """What the extract stage gives the dataset level: per-user ingest results and staypoints, what
    discovery found, the input's fingerprint, and how many users each per-user step ran (not cached)."""

    ingested: list[IngestResult]
    staypoints: list[Any]
    discovery: Any
    input_fingerprint: str
    ingest_run: int = 0
    staypoints_run: int = 0


def _read_users(raw_dir: str, spec: InputSpec, config: PreprocessConfig, catalog: Catalog) -> _Read:
    """Raw user folders and their content fingerprints; then per user (in parallel batches), each user's
    positionfixes straight on to its staypoints."""
    users, discovery = discover_raw_users(raw_dir, catalog, spec.format, config.duplicates.drop_shared_files)
    reader = ingest_user if spec.format == "geolife" else ingest_gpx_user
    ingest = _Step(
        reader.with_options(result_storage=catalog.cache),
        "user",
        _raw_weight,
        {
            "out_path": [str(catalog.positionfixes(u.user_id)) for u in users],
            **({"spec": unmapped(spec)} if spec.format == "gpx" else {}),
        },
    )
    (ingested, staypoints), (ingest_run, staypoints_run) = _run_mapped(
        ingest, users, catalog.cache, then=_staypoints_of([u.user_id for u in users], config, catalog)
    )
    fingerprint = combine(*(f"{u.user_id}:{u.fingerprint}" for u in users))
    return _Read(ingested, staypoints, discovery, fingerprint, ingest_run, staypoints_run)


def _read_files(raw_dir: str, spec: InputSpec, config: PreprocessConfig, catalog: Catalog) -> _Read:
    """Files that are not per user, read at once and partitioned per user; visits skip the staypoints."""
    raw = discover_raw_files(raw_dir, spec.format, catalog)
    fingerprint = combine(spec.format, raw.fingerprint)
    reader = ingest_visits if spec.format in VISIT_FORMATS else ingest_table
    per_user, discovery = _ensure(reader.with_options(result_storage=catalog.cache), raw, spec, catalog)
    if spec.format in VISIT_FORMATS:
        return _Read([], per_user, discovery, fingerprint)
    staypoints_of = _staypoints_of([r.user_id for r in per_user], config, catalog)
    (staypoints,), (staypoints_run,) = _run_mapped(staypoints_of, per_user, catalog.cache)
    return _Read(per_user, staypoints, discovery, fingerprint, staypoints_run=staypoints_run)


def _staypoints_of(user_ids: list[int], config: PreprocessConfig, catalog: Catalog) -> _Step:
    return _Step(
        generate_staypoints_user.with_options(result_storage=catalog.cache),
        "ingested",
        _ingested_weight,
        {
            "config": unmapped(config.staypoints),
            "tripleg_gap_threshold_min": unmapped(config.quality.tripleg_gap_threshold_min),
            "out_path": [str(catalog.user_staypoints(u)) for u in user_ids],
        },
    )


def _upstream_counts(
    read: _Read, located_stats: dict[str, Any], ingest_summary: dict[str, Any], spec: InputSpec
) -> dict[str, Any]:
    """The counts of the stages before the dataset, recorded in its metadata."""
    return {
        **located_stats,
        "positionfixes": sum(r.n_rows for r in read.ingested),
        "positionfixes_duplicates": sum(s.n_duplicates for s in read.staypoints),
        "staypoints": sum(s.n_staypoints for s in read.staypoints),
        "rows_skipped": ingest_summary["rows_skipped"],
        "files_skipped": ingest_summary["files_skipped"],
        **({} if spec.format == "geolife" else {"input_format": spec.format}),
    }


def _raw_weight(user: RawUser) -> float:
    return user.n_files


def _ingested_weight(ingested: IngestResult) -> float:
    return ingested.n_rows


def _ensure(task_fn: Any, *args: Any) -> Any:
    """Run a task, or reuse its cached result if the files it points at are still the ones written (a changed
    one is named in a warning and the task runs again: :func:`runtime.caching.call_cached`).

    The cache is looked up first, which also clears a record a crash left unreadable.
    """
    return call_cached(task_fn, *args)


@dataclass(frozen=True)
class _Step:
    """A per-user task over a list of items: which parameter takes the item, the other parameters
    (``unmapped`` or one value per item) and an estimate of a call's work."""

    task: Any
    mapped_name: str
    weight: Callable[[Any], float]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def call(self, i: int, item: Any) -> dict[str, Any]:
        return {
            self.mapped_name: item,
            **{k: (v.value if isinstance(v, unmapped) else v[i]) for k, v in self.kwargs.items()},
        }

    def others(self, i: int) -> dict[str, Any]:
        return {k: v for k, v in self.call(i, None).items() if k != self.mapped_name}


def _run_mapped(
    step: _Step, items: list, storage: Path, then: _Step | None = None
) -> tuple[list[list], list[int]]:
    """Run a per-user task (and ``then`` a second one on each result) over the calls not in the cache.

    Calls whose cached result points at files that are gone or changed run again (a warning names the file:
    :func:`runtime.caching.current_result`). The calls to run go in a few
    balanced batches (the step's ``weight`` estimates a call's work), four per worker of the flow's task
    runner, each one ``cached-batch`` task run that caches every call under the per-user task's own key
    (:func:`runtime.caching.cached_batch`). With ``then``, a user whose first step must run goes on to the
    second in the same batch (no wait for the other users in between); a user whose first step is cached
    and second is not runs the second alone. A single call runs as a batch of one, named as the per-user
    task run would be.

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
    k: int, step: _Step, todo: list[int], items: list, storage: Path, then: _Step | None = None
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


def _batch_name(task_fn: Any, calls: list[dict[str, Any]], k: int, n: int, then: _Step | None = None) -> str:
    """A batch of one is named as its per-user task run; a larger one by its task, size and place (a chained
    second task adds ``+ <its name>``)."""
    chained = "" if then is None else f" + {then.task.name}"
    if len(calls) == 1 and isinstance(task_fn.task_run_name, str):
        return task_fn.task_run_name.format(**calls[0]) + chained
    return f"{task_fn.name}{chained} x{len(calls)} (batch {k} of {n})"
