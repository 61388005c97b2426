"""The ``preprocess`` flow: raw GeoLife .plt -> positionfixes -> staypoints -> locations -> samples."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from prefect import flow, get_run_logger, unmapped
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field

from nextloc.config import PreprocessConfig
from nextloc.fingerprint import combine
from nextloc.io.inputs import VISIT_FORMATS, InputFormat, InputSpec
from runtime.catalog import Catalog
from runtime.locking import data_dir_lock
from runtime.reuse import PerItem, call_cached, map_cached
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
        located, located_stats = call_cached(
            locate_staypoints_task.with_options(**store),
            read.staypoints,
            config,
            str(catalog.located),
            dbscan_tiles,
        )
        upstream = _upstream_counts(read, located_stats, ingest_summary, spec)
        dataset: DatasetResult = call_cached(
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
    ingest = PerItem(
        reader.with_options(result_storage=catalog.cache),
        "user",
        _raw_weight,
        {
            "out_path": [str(catalog.positionfixes(u.user_id)) for u in users],
            **({"spec": unmapped(spec)} if spec.format == "gpx" else {}),
        },
    )
    (ingested, staypoints), (ingest_run, staypoints_run) = map_cached(
        ingest, users, catalog.cache, then=_staypoints_of([u.user_id for u in users], config, catalog)
    )
    fingerprint = combine(*(f"{u.user_id}:{u.fingerprint}" for u in users))
    return _Read(ingested, staypoints, discovery, fingerprint, ingest_run, staypoints_run)


def _read_files(raw_dir: str, spec: InputSpec, config: PreprocessConfig, catalog: Catalog) -> _Read:
    """Files that are not per user, read at once and partitioned per user; visits skip the staypoints."""
    raw = discover_raw_files(raw_dir, spec.format, catalog)
    fingerprint = combine(spec.format, raw.fingerprint)
    reader = ingest_visits if spec.format in VISIT_FORMATS else ingest_table
    per_user, discovery = call_cached(reader.with_options(result_storage=catalog.cache), raw, spec, catalog)
    if spec.format in VISIT_FORMATS:
        return _Read([], per_user, discovery, fingerprint)
    staypoints_of = _staypoints_of([r.user_id for r in per_user], config, catalog)
    (staypoints,), (staypoints_run,) = map_cached(staypoints_of, per_user, catalog.cache)
    return _Read(per_user, staypoints, discovery, fingerprint, staypoints_run=staypoints_run)


def _staypoints_of(user_ids: list[int], config: PreprocessConfig, catalog: Catalog) -> PerItem:
    return PerItem(
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
