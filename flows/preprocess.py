"""The ``preprocess`` flow: raw GeoLife .plt -> positionfixes -> staypoints -> locations -> samples."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from prefect import flow, get_run_logger, unmapped
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field

from nextloc.config import PreprocessConfig
from nextloc.fingerprint import combine
from nextloc.inputs import InputFormat, InputSpec
from tasks.caching import cached_batch, cached_result, call_cached, outputs_current
from tasks.catalog import Catalog
from tasks.locking import data_dir_lock
from tasks.preprocess import (
    DatasetResult,
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
    write_ingest_report,
)
from tasks.progress import track
from tasks.runners import balanced_batches, fan_out_width


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
    logger = get_run_logger()
    config = config or PreprocessConfig()
    spec = InputSpec(format=input_format, columns=columns or {}, timezone=input_timezone)
    catalog = Catalog(str(Path(data_dir).resolve()))
    store = {"result_storage": catalog.cache}

    with data_dir_lock(catalog.root):  # one writer per data directory
        ingest_run = staypoints_run = 0
        if spec.format in ("geolife", "gpx"):
            # Extract: raw user folders and their content fingerprints; then per user (mapped in parallel)
            users, discovery = discover_raw_users(raw_dir, catalog, spec.format)
            input_fingerprint = combine(*(f"{u.user_id}:{u.fingerprint}" for u in users))
            if spec.format == "geolife":
                ingested, ingest_run = _run_mapped(
                    ingest_user.with_options(**store),
                    "user",
                    users,
                    catalog.cache,
                    weight=_raw_weight,
                    out_path=[str(catalog.positionfixes(u.user_id)) for u in users],
                )
            else:
                ingested, ingest_run = _run_mapped(
                    ingest_gpx_user.with_options(**store),
                    "user",
                    users,
                    catalog.cache,
                    weight=_raw_weight,
                    spec=unmapped(spec),
                    out_path=[str(catalog.positionfixes(u.user_id)) for u in users],
                )
        else:
            # Files that are not per user: read them at once, partitioned per user
            raw = discover_raw_files(raw_dir, spec.format, catalog)
            input_fingerprint = combine(spec.format, raw.fingerprint)
            reader = ingest_visits if spec.format == "visits" else ingest_table
            per_user, discovery = _ensure(reader.with_options(**store), raw, spec, catalog)
            ingested = [] if spec.format == "visits" else per_user

        if spec.format == "visits":
            staypoints = per_user
        else:
            staypoints, staypoints_run = _run_mapped(
                generate_staypoints_user.with_options(**store),
                "ingested",
                ingested,
                catalog.cache,
                weight=lambda r: r.n_rows,
                config=unmapped(config.staypoints),
                tripleg_gap_threshold_min=unmapped(config.quality.tripleg_gap_threshold_min),
                out_path=[str(catalog.user_staypoints(r.user_id)) for r in ingested],
            )
        ingest_summary = write_ingest_report(discovery, ingested, catalog)

        # Dataset level: quality filter + DBSCAN, then samples
        located, located_stats = _ensure(
            locate_staypoints_task.with_options(**store),
            staypoints,
            config,
            str(catalog.located),
            dbscan_tiles,
        )
        upstream = {
            **located_stats,
            "positionfixes": sum(r.n_rows for r in ingested),
            "positionfixes_duplicates": sum(s.n_duplicates for s in staypoints),
            "staypoints": sum(s.n_staypoints for s in staypoints),
            "rows_skipped": ingest_summary["rows_skipped"],
            "files_skipped": ingest_summary["files_skipped"],
            **({} if spec.format == "geolife" else {"input_format": spec.format}),
        }
        dataset: DatasetResult = _ensure(
            build_dataset_task.with_options(**store), located, config, input_fingerprint, upstream, catalog
        )
        logger.info(
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
            "users_run": {"ingest": ingest_run, "staypoints": staypoints_run},
        }


def _raw_weight(user: RawUser) -> float:
    return user.n_files


def _ensure(task_fn: Any, *args: Any) -> Any:
    """Run a task; if a cached result points at files that are gone, recompute it.

    The cache is looked up first (``call_cached``), which also clears a record a crash left unreadable.
    """
    result = call_cached(task_fn, *args)
    if not outputs_current(result):
        result = task_fn.with_options(refresh_cache=True)(*args)
    return result


def _run_mapped(
    task_fn: Any,
    mapped_name: str,
    items: list,
    storage: Path,
    weight: Callable[[Any], float],
    **kwargs: Any,
) -> tuple[list, int]:
    """Run a per-user task over the calls not already in the cache; recompute results whose files are gone.

    The calls to run go in a few balanced batches (``weight`` estimates a call's work), four per worker of
    the flow's task runner, each one ``cached-batch`` task run that caches every call under the per-user
    task's own key (:func:`tasks.caching.cached_batch`). A single call runs as a batch of one, named as the
    per-user task run would be.

    Returns:
        The results in the order of ``items``, and how many calls ran (the rest came from the cache).
    """
    per_item = {k: (v.value if isinstance(v, unmapped) else v) for k, v in kwargs.items()}

    def call(i: int) -> dict[str, Any]:
        return {
            mapped_name: items[i],
            **{k: (v if isinstance(kwargs[k], unmapped) else v[i]) for k, v in per_item.items()},
        }

    results: list[Any] = [None] * len(items)
    todo = []
    for i in range(len(items)):
        hit, value = cached_result(task_fn, call(i), storage)
        if hit and outputs_current(value):
            results[i] = value
        else:
            todo.append(i)
    if todo:
        batches = [
            [todo[j] for j in b]
            for b in balanced_batches([weight(items[i]) for i in todo], 4 * fan_out_width())
        ]
        futures = []
        for k, batch in enumerate(batches, 1):
            calls = [call(i) for i in batch]
            futures.append(
                cached_batch.with_options(
                    task_run_name=_batch_name(task_fn, calls, k, len(batches)),
                    retries=task_fn.retries,
                    retry_delay_seconds=task_fn.retry_delay_seconds,
                ).submit(task_fn, calls, str(storage))
            )
        label = f"{task_fn.name} ({len(todo)} users)"
        done = track(futures, label, sizes=[len(b) for b in batches])
        for batch, batch_results in zip(batches, done, strict=True):
            for i, result in zip(batch, batch_results, strict=True):
                results[i] = result
    get_run_logger().info(
        "%s: %d cached results reused, %d run", task_fn.name, len(items) - len(todo), len(todo)
    )
    return results, len(todo)


def _batch_name(task_fn: Any, calls: list[dict[str, Any]], k: int, n: int) -> str:
    """A batch of one is named as its per-user task run; a larger one by its task, size and place."""
    if len(calls) == 1 and isinstance(task_fn.task_run_name, str):
        return task_fn.task_run_name.format(**calls[0])
    return f"{task_fn.name} x{len(calls)} (batch {k} of {n})"
