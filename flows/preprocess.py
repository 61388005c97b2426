"""The ``preprocess`` flow: raw GeoLife .plt -> positionfixes -> staypoints -> locations -> samples."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from prefect import flow, get_run_logger, unmapped
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field

from nextloc.config import PreprocessConfig
from nextloc.fingerprint import combine
from nextloc.inputs import InputFormat, InputSpec
from tasks.caching import cached_result, call_cached
from tasks.catalog import Catalog
from tasks.locking import data_dir_lock
from tasks.preprocess import (
    DatasetResult,
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
                    out_path=[str(catalog.positionfixes(u.user_id)) for u in users],
                )
            else:
                ingested, ingest_run = _run_mapped(
                    ingest_gpx_user.with_options(**store),
                    "user",
                    users,
                    catalog.cache,
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


def _outputs_exist(result: Any) -> bool:
    from tasks.caching import Artifact

    if isinstance(result, Artifact):
        return result.is_current()
    if isinstance(result, tuple | list):
        return all(_outputs_exist(r) for r in result)
    if isinstance(result, DatasetResult):
        return all(a.is_current() for a in result.artifacts())
    for name in ("positionfixes", "staypoints"):
        art = getattr(result, name, None)
        if art is not None and not art.is_current():
            return False
    return True


def _ensure(task_fn: Any, *args: Any) -> Any:
    """Run a task; if a cached result points at files that are gone, recompute it.

    The cache is looked up first (``call_cached``), which also clears a record a crash left unreadable.
    """
    result = call_cached(task_fn, *args)
    if not _outputs_exist(result):
        result = task_fn.with_options(refresh_cache=True)(*args)
    return result


def _run_mapped(
    task_fn: Any, mapped_name: str, items: list, storage: Path, **kwargs: Any
) -> tuple[list, int]:
    """Map a per-user task over the calls not already in the cache; recompute results whose files are gone.

    Returns:
        The results in the order of ``items``, and how many calls ran (the rest came from the cache).
    """
    per_item = {k: (v.value if isinstance(v, unmapped) else v) for k, v in kwargs.items()}

    def call(i: int) -> dict[str, Any]:
        return {k: (v if isinstance(kwargs[k], unmapped) else v[i]) for k, v in per_item.items()}

    results: list[Any] = [None] * len(items)
    todo = []
    for i, item in enumerate(items):
        hit, value = cached_result(task_fn, {mapped_name: item, **call(i)}, storage)
        if hit and _outputs_exist(value):
            results[i] = value
        else:
            todo.append(i)
    if todo:
        mapped = {k: (v if isinstance(v, unmapped) else [v[i] for i in todo]) for k, v in kwargs.items()}
        futures = task_fn.map(**{mapped_name: [items[i] for i in todo]}, **mapped)
        for i, result in zip(todo, track(futures, f"{task_fn.name} ({len(todo)} users)"), strict=True):
            results[i] = result
    for i in todo:
        if not _outputs_exist(results[i]):
            results[i] = task_fn.with_options(refresh_cache=True)(**{mapped_name: items[i]}, **call(i))
    get_run_logger().info(
        "%s: %d cached results reused, %d run", task_fn.name, len(items) - len(todo), len(todo)
    )
    return results, len(todo)
