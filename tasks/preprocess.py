"""Thin Prefect tasks around the pure ``nextloc`` preprocessing functions.

Each task reads its inputs from paths, calls one library function, writes its outputs atomically, and
returns :class:`~runtime.caching.Artifact` records (path + content fingerprint). Parquet paths, never
DataFrames, cross task boundaries, so results are small, cacheable and shippable to Dask workers.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from prefect import get_run_logger, task

from nextloc.config import PreprocessConfig, StaypointConfig
from nextloc.fingerprint import combine, hash_file_groups_memo, hash_files_memo
from nextloc.io.geolife import IngestReport, list_plt_files, list_user_dirs, read_user
from nextloc.io.gpx import list_gpx_files, list_gpx_users, read_gpx_user
from nextloc.io.inputs import InputSpec, list_input_files
from nextloc.io.tabular import (
    iter_positionfix_batches,
    read_spilled,
    read_visit_files,
    spill_by_user,
    split_by_user,
)
from nextloc.preprocessing.dataset import build_dataset, locate_staypoints
from nextloc.preprocessing.sequences import SPLITS
from nextloc.preprocessing.staypoints import STAYPOINT_COLUMNS, generate_staypoints
from nextloc.preprocessing.vocabulary import location_vocabulary, user_vocabulary
from nextloc.raw.duplicates import STAYPOINT_COLUMNS as DUPLICATE_COLUMNS
from nextloc.raw.duplicates import SharedFiles, describe_pairs, duplicate_report, shared_files
from nextloc.storage import read_parquet, write_geoparquet, write_json, write_parquet
from runtime.caching import CACHE_POLICY, Artifact
from runtime.catalog import Catalog
from runtime.runners import tile_map


@dataclass(frozen=True)
class RawUser:
    """One user folder of the raw data and the fingerprint of the files read (``n_files`` of them)."""

    user_id: int
    path: str = field(metadata={"cache_key": False})  # where; what is in it is the fingerprint
    fingerprint: str
    n_files: int
    dropped: tuple[str, ...] = ()  # files (relative to ``path``) left out as copies of another user's


@dataclass(frozen=True)
class IngestResult:
    """Positionfixes of one user and the ingest report."""

    user_id: int
    positionfixes: Artifact | None
    n_rows: int
    report: dict


@dataclass(frozen=True)
class StaypointsResult:
    """Staypoints of one user and the extent of the user's triplegs (for the quality filter)."""

    user_id: int
    staypoints: Artifact | None
    n_staypoints: int
    tripleg_start: str | None
    tripleg_end: str | None
    n_pfs: int
    n_duplicates: int


@dataclass(frozen=True)
class DatasetResult:
    """Final outputs of preprocessing."""

    staypoints: Artifact
    samples: dict[str, Artifact]
    metadata: Artifact
    stats: dict = field(default_factory=dict)
    vocabulary: dict[str, Artifact] = field(default_factory=dict)


@dataclass(frozen=True)
class RawFiles:
    """The files of a tabular or visits input and the fingerprint of their content."""

    paths: list[str] = field(metadata={"cache_key": False})  # where; what is in them is the fingerprint
    fingerprint: str


_just_written = threading.local()  # .positionfixes: (Artifact, table) this thread wrote last


def _write_positionfixes(table: pa.Table, out_path: str) -> Artifact:
    """Write a user's positionfixes, and keep the table for this thread's next :func:`_read_positionfixes`."""
    artifact = Artifact.record(out_path, write_parquet(table, Path(out_path)))
    _just_written.positionfixes = (artifact, table)
    return artifact


def _read_positionfixes(artifact: Artifact) -> pd.DataFrame:
    """A user's positionfixes as pandas: the table this thread has just written, when the file is still the
    one written from it (a batch chains a user's ingestion to its staypoints: 1.2 s less CPU on GeoLife
    than decoding every file again), else the file."""
    fresh, _just_written.positionfixes = getattr(_just_written, "positionfixes", None), None
    if fresh is not None and fresh[0] == artifact and artifact.is_current():
        return fresh[1].to_pandas()
    return read_parquet(Path(artifact.path))


@task(name="discover-raw-users")
def discover_raw_users(
    raw_dir: str, catalog: Catalog, input_format: str = "geolife", drop_shared_files: bool = False
) -> tuple[list[RawUser], dict]:
    """List user folders (GeoLife ``Data/NNN`` or GPX ``NNN/``) and fingerprint their files (hashes are
    memoised by size and mtime).

    The same file hashes find the files several users hold (:func:`nextloc.raw.duplicates.shared_files`): the
    report gains ``shared_files``, and with ``drop_shared_files`` each copy is left out of its user
    (``RawUser.dropped``; the user's fingerprint is then that of the files it keeps).
    """
    logger = get_run_logger()
    gpx = input_format == "gpx"
    raw = _absolute(raw_dir)
    users, report = list_gpx_users(raw) if gpx else list_user_dirs(raw)
    memo_path = catalog.raw_hash_memo
    memo: dict[str, list] = json.loads(memo_path.read_text()) if memo_path.exists() else {}
    files = [list_gpx_files(folder) if gpx else list_plt_files(folder) for _, folder in users]
    fingerprints = hash_file_groups_memo(
        [(f, folder) for f, (_, folder) in zip(files, users, strict=True)], memo
    )
    hashes = {
        user_id: {_relative(f, folder): memo[str(f)][2] for f in user_files}
        for (user_id, folder), user_files in zip(users, files, strict=True)
    }
    shared = shared_files(hashes, drop=drop_shared_files)
    found = []
    for (user_id, folder), user_files, fingerprint in zip(users, files, fingerprints, strict=True):
        dropped = shared.dropped.get(user_id, ())
        if dropped:  # the files read, fingerprinted (from the memo)
            user_files = [f for f in user_files if _relative(f, folder) not in dropped]
            fingerprint = hash_files_memo(user_files, memo, root=folder)
        found.append(RawUser(user_id, str(folder), fingerprint, len(user_files), dropped))
    write_json(memo, memo_path)
    logger.info(
        "found %d user folders (%d %s files) under %s",
        len(found),
        sum(u.n_files for u in found),
        ".gpx" if gpx else ".plt",
        raw_dir,
    )
    _log_shared_files(shared)
    return found, {**report.to_dict(), "shared_files": shared.to_dict()}


def _absolute(raw_dir: str) -> Path:
    """``raw_dir`` as one spelling of it (absolute, normalised): the raw paths in reports and in the hash
    memo are then the same whether it was given as ``data/raw``, ``./data/raw/`` or ``/abs/data/raw``."""
    return Path(os.path.abspath(raw_dir))


def _log_shared_files(shared: SharedFiles) -> None:
    """Warn of the user pairs holding identical files, and of the copies dropped (one line each)."""
    logger = get_run_logger()
    if shared.pairs:
        pairs = ", ".join(f"{a:03d}/{b:03d} {n}" for (a, b), n in shared.pairs.items())
        logger.warning("%d user pairs hold identical files: %s", len(shared.pairs), pairs)
    if shared.dropped:
        dropped = ", ".join(f"{user:03d} {len(paths)}" for user, paths in shared.dropped.items())
        logger.warning("files dropped as copies of a lower user id's: %s", dropped)


@task(name="discover-raw-files")
def discover_raw_files(raw_dir: str, input_format: str, catalog: Catalog) -> RawFiles:
    """The files of a CSV, parquet or visits input (one file or a folder) and their content fingerprint."""
    raw = _absolute(raw_dir)
    files = list_input_files(raw, input_format)
    memo_path = catalog.raw_hash_memo
    memo: dict[str, list] = json.loads(memo_path.read_text()) if memo_path.exists() else {}
    root = raw if raw.is_dir() else raw.parent
    fingerprint = hash_files_memo(files, memo, root=root)
    write_json(memo, memo_path)
    get_run_logger().info("found %d %s input files under %s", len(files), input_format, raw_dir)
    return RawFiles([str(f) for f in files], fingerprint)


@task(
    name="ingest-gpx-user",
    task_run_name="ingest gpx user {user.user_id:03d}",
    cache_policy=CACHE_POLICY,
    persist_result=True,
    retries=1,
)
def ingest_gpx_user(user: RawUser, spec: InputSpec, out_path: str) -> IngestResult:
    """Read one user's GPX track points into a positionfixes parquet file (one partition of the dataset)."""
    table, report = read_gpx_user(user.user_id, _files_read(user, list_gpx_files(Path(user.path))), spec)
    if table.num_rows == 0:
        return IngestResult(user.user_id, None, 0, report.to_dict())
    return IngestResult(user.user_id, _write_positionfixes(table, out_path), table.num_rows, report.to_dict())


@task(name="ingest-table", cache_policy=CACHE_POLICY, persist_result=True)
def ingest_table(raw: RawFiles, spec: InputSpec, catalog: Catalog) -> tuple[list[IngestResult], dict]:
    """Read CSV/parquet positionfixes of every user and write one positionfixes partition per user.

    The files are not per user: they are streamed a batch at a time, each batch's rows spilled per user
    to scratch files, then each user's partition is written from its own pieces (memory: one batch plus
    the largest user, not the data). The per-user staypoint tasks below stay cached per user on the
    content of each partition (a user whose rows did not change is a cache hit).
    """
    logger = get_run_logger()
    report = IngestReport()
    results = []
    n_rows = 0
    catalog.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=catalog.root, prefix=".spill-") as spill:
        batches = iter_positionfix_batches([Path(p) for p in raw.paths], spec, report)
        for user_id, pieces in spill_by_user(batches, Path(spill)).items():
            part = read_spilled(pieces)
            out = catalog.positionfixes(user_id)
            results.append(
                IngestResult(
                    user_id,
                    Artifact.record(out, write_parquet(part, out)),
                    part.num_rows,
                    IngestReport().to_dict(),
                )
            )
            n_rows += part.num_rows
    if not results:
        raise ValueError(
            f"no valid positionfixes in {len(raw.paths)} {spec.format} file(s): {report.to_dict()['counts']}"
        )
    logger.info(
        "read %d positionfixes of %d users (%d rows skipped)",
        n_rows,
        len(results),
        report.rows_skipped,
    )
    return results, report.to_dict()


@task(name="ingest-visits", cache_policy=CACHE_POLICY, persist_result=True)
def ingest_visits(raw: RawFiles, spec: InputSpec, catalog: Catalog) -> tuple[list[StaypointsResult], dict]:
    """Read already-extracted visits and write them as each user's staypoints (no staypoint generation)."""
    logger = get_run_logger()
    table, report = read_visit_files([Path(p) for p in raw.paths], spec)
    results = []
    for user_id, part in split_by_user(table).items():
        sp = part.to_pandas().sort_values("started_at", kind="stable", ignore_index=True)
        sp["elevation"] = float("nan")
        sp["n_pfs"] = 0
        out = catalog.user_staypoints(user_id)
        art = Artifact.record(out, write_geoparquet(sp[STAYPOINT_COLUMNS], out))
        results.append(StaypointsResult(user_id, art, len(sp), None, None, 0, 0))
    if not results:
        raise ValueError(f"no valid visits in {len(raw.paths)} file(s): {report.to_dict()['counts']}")
    logger.info(
        "read %d visits of %d users (%d rows skipped)", table.num_rows, len(results), report.rows_skipped
    )
    return results, report.to_dict()


def _files_read(user: RawUser, files: list[Path]) -> list[Path]:
    """``files`` of a user folder but the ones discovery dropped as copies."""
    if not user.dropped:
        return files
    dropped = set(user.dropped)
    return [f for f in files if _relative(f, user.path) not in dropped]


def _relative(path: Path, folder: str | Path) -> str:
    """``path`` relative to ``folder``, which holds it (as ``relative_to`` gives it, without its cost)."""
    return str(path)[len(str(folder)) + 1 :]


@task(
    name="ingest-user",
    task_run_name="ingest user {user.user_id:03d}",
    cache_policy=CACHE_POLICY,
    persist_result=True,
    retries=1,
)
def ingest_user(user: RawUser, out_path: str) -> IngestResult:
    """Read one user's .plt files into a positionfixes parquet file (one partition of the dataset)."""
    logger = get_run_logger()
    table, report = read_user(user.user_id, _files_read(user, list_plt_files(Path(user.path))))
    if report.rows_skipped or report.files_skipped:
        logger.warning(
            "user %03d: skipped %d rows, %d files: %s",
            user.user_id,
            report.rows_skipped,
            report.files_skipped,
            dict(report.counts),
        )
    if table.num_rows == 0:
        return IngestResult(user.user_id, None, 0, report.to_dict())
    return IngestResult(user.user_id, _write_positionfixes(table, out_path), table.num_rows, report.to_dict())


@task(
    name="generate-staypoints-user",
    task_run_name="staypoints user {ingested.user_id:03d}",
    cache_policy=CACHE_POLICY,
    persist_result=True,
    retries=1,
)
def generate_staypoints_user(
    ingested: IngestResult, config: StaypointConfig, tripleg_gap_threshold_min: float, out_path: str
) -> StaypointsResult:
    """Sliding-window staypoints of one user, plus the extent of the user's triplegs."""
    if ingested.positionfixes is None:
        return StaypointsResult(ingested.user_id, None, 0, None, None, 0, 0)
    pfs = _read_positionfixes(ingested.positionfixes)
    result = generate_staypoints(pfs, config, tripleg_gap_threshold_min=tripleg_gap_threshold_min)
    fingerprint = write_geoparquet(result.staypoints[STAYPOINT_COLUMNS], Path(out_path))
    return StaypointsResult(
        user_id=ingested.user_id,
        staypoints=Artifact.record(out_path, fingerprint),
        n_staypoints=len(result.staypoints),
        tripleg_start=result.tripleg_start.isoformat() if result.tripleg_start is not None else None,
        tripleg_end=result.tripleg_end.isoformat() if result.tripleg_end is not None else None,
        n_pfs=result.n_pfs,
        n_duplicates=result.n_duplicates,
    )


@task(name="locate-staypoints", cache_policy=CACHE_POLICY, persist_result=True)
def locate_staypoints_task(
    users: list[StaypointsResult], config: PreprocessConfig, out_path: str, dbscan_tiles: int = 0
) -> tuple[Artifact, dict]:
    """Quality filter + dataset-level DBSCAN over every user's staypoints.

    ``dbscan_tiles > 0`` clusters by that many spatial tiles (the same bytes out); on the Dask runner the
    tiles run on the cluster's workers (:func:`runtime.runners.tile_map`).
    """
    logger = get_run_logger()
    with_sp = [u for u in users if u.staypoints is not None and u.n_staypoints > 0]
    sp = pd.concat(
        [
            pq.read_table(u.staypoints.path, columns=STAYPOINT_COLUMNS).to_pandas()
            for u in sorted(with_sp, key=lambda u: u.user_id)
        ],
        ignore_index=True,
    )
    extents = pd.DataFrame(
        {
            "user_id": [u.user_id for u in users],
            "tripleg_start": pd.to_datetime([u.tripleg_start for u in users], utc=True),
            "tripleg_end": pd.to_datetime([u.tripleg_end for u in users], utc=True),
        }
    )
    located = locate_staypoints(sp, extents, config, dbscan_tiles, tile_map() if dbscan_tiles else None)
    fingerprint = write_geoparquet(located.staypoints, Path(out_path))
    logger.info("located staypoints: %s", located.stats)
    return Artifact.record(out_path, fingerprint), located.stats


@task(name="build-dataset", cache_policy=CACHE_POLICY, persist_result=True)
def build_dataset_task(
    located: Artifact,
    config: PreprocessConfig,
    input_fingerprint: str,
    upstream_stats: dict,
    catalog: Catalog,
) -> DatasetResult:
    """Merge, time features, split, targets, encodings and samples; writes the final outputs."""
    logger = get_run_logger()
    located_sp = read_parquet(Path(located.path))
    dataset = build_dataset(located_sp, config)
    sp_art = Artifact.record(catalog.staypoints, write_geoparquet(dataset.staypoints, catalog.staypoints))
    samples = {
        split: Artifact.record(
            catalog.samples(split), write_parquet(dataset.samples[split], catalog.samples(split))
        )
        for split in SPLITS
    }
    vocabulary = {
        "locations": Artifact.record(
            catalog.vocabulary("locations"),
            write_geoparquet(
                location_vocabulary(located_sp, dataset.staypoints), catalog.vocabulary("locations")
            ),
        ),
        "users": Artifact.record(
            catalog.vocabulary("users"),
            write_parquet(user_vocabulary(dataset.staypoints), catalog.vocabulary("users")),
        ),
    }
    metadata = {
        **dataset.stats,
        "preprocessing": upstream_stats,
        "config": config.model_dump(mode="json"),
        "config_fingerprint": config.fingerprint(),
        "input_fingerprint": input_fingerprint,
        "dataset_fingerprint": combine(sp_art.fingerprint, *(samples[s].fingerprint for s in SPLITS)),
        "files": {
            "staypoints": "staypoints.parquet",
            **{f"samples_{s}": f"samples/{s}.parquet" for s in SPLITS},
            **{f"vocabulary_{k}": f"vocabulary/{k}.parquet" for k in vocabulary},
        },
    }
    meta_art = Artifact.record(catalog.metadata, write_json(metadata, catalog.metadata))
    logger.info(
        "dataset: %d users, total_loc_num %d, staypoints %s, samples %s",
        dataset.stats["n_users"]["train"],
        dataset.stats["total_loc_num"],
        dataset.stats["n_staypoints"],
        dataset.stats["n_samples"],
    )
    return DatasetResult(sp_art, samples, meta_art, dataset.stats, vocabulary)


@task(name="write-ingest-report")
def write_ingest_report(discovery: dict, ingested: list[IngestResult], catalog: Catalog) -> dict:
    """Aggregate the per-user ingest reports into ``ingest_report.json`` and return the summary."""
    total = IngestReport.from_dict(discovery)
    for result in ingested:
        total.merge(IngestReport.from_dict(result.report))
    summary = total.to_dict()
    write_json(summary, catalog.ingest_report)
    return summary


@task(name="report-duplicates")
def report_duplicates(
    summary: dict, discovery: dict, dataset: DatasetResult, config: PreprocessConfig, catalog: Catalog
) -> dict:
    """Add the ``duplicates`` section (:func:`nextloc.raw.duplicates.duplicate_report`) to the ingest report and
    write ``ingest_report.json`` again; returns the summary with it.

    The report is written first by :func:`write_ingest_report` (so a dataset stage that fails still leaves
    it), then here, once the final staypoints show which staypoints and test targets are copies.
    """
    staypoints = read_parquet(Path(dataset.staypoints.path), columns=list(DUPLICATE_COLUMNS))
    test_ids = pq.read_table(dataset.samples["test"].path, columns=["staypoint_id"]).column(0).to_numpy()
    files = SharedFiles.from_dict(discovery["shared_files"]) if "shared_files" in discovery else None
    duplicates = duplicate_report(files, staypoints, test_ids, config.duplicates.drop_shared_files)
    if duplicates["pairs"]:
        get_run_logger().warning(
            "users sharing recordings: %s; %d of %d test samples are copies",
            describe_pairs(duplicates, 5),
            duplicates["copied_test_samples"],
            duplicates["test_samples"],
        )
    summary = {**summary, "duplicates": duplicates}
    write_json(summary, catalog.ingest_report)
    return summary
