"""Readers beside GeoLife: positionfixes as CSV/parquet or GPX, and already-extracted visits.

Every reader follows the GeoLife reader's rules (:mod:`nextloc.geolife`): a bad row is reported with its
file and row and skipped, the good rows around it are kept with their exact values, a bad file costs that
file, and every issue lands in an :class:`~nextloc.geolife.IngestReport`.

* **CSV / parquet positionfixes** (:func:`read_positionfix_files`): columns ``user_id``, ``tracked_at``,
  ``latitude``, ``longitude`` and optional ``elevation`` (metres), renamed through
  :attr:`InputSpec.columns`. Times are ISO 8601 with or without a zone (``Z``, ``+08:00``); a time without
  a zone is wall-clock time in :attr:`InputSpec.timezone`. A parquet timestamp column works as well. CSV
  issues name the file's line (the header is line 1); parquet issues name the data row (1-based).
* **GPX** (:func:`read_gpx_user`, through ``gpxpy``): every track point of every track segment; one
  folder per user, named by the user number. Issues name the track, segment and point.
* **Visits** (:func:`read_visit_files`): ``user_id``, ``started_at``, ``finished_at``, ``latitude``,
  ``longitude``; they enter the pipeline as staypoints (after staypoint generation).

Rows keep their read order: the staypoint step sorts by time (stable), as for GeoLife.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.ipc  # noqa: F401  (pa.ipc)
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator

from nextloc.config import known_timezone
from nextloc.geolife import POSITIONFIXES_SCHEMA, IngestIssue, IngestReport
from nextloc.visits import (
    COORDINATE_BOUNDS,
    POSITIONFIX_COLUMNS,
    REQUIRED_POSITIONFIX_COLUMNS,
    VISIT_COLUMNS,
    VISITS_SCHEMA,
    parse_numbers,
    parse_times,
    short_text,
)

logger = logging.getLogger(__name__)

InputFormat = Literal["geolife", "csv", "parquet", "gpx", "visits"]
INPUT_FORMATS: tuple[str, ...] = ("geolife", "csv", "parquet", "gpx", "visits")
_REQUIRED = {"positionfixes": REQUIRED_POSITIONFIX_COLUMNS, "visits": VISIT_COLUMNS}
_SUFFIXES = {
    "csv": (".csv",),
    "parquet": (".parquet", ".pq"),
    "gpx": (".gpx",),
    "visits": (".csv", ".parquet", ".pq"),
}
_BATCH_ROWS = 1 << 20
_MAX_USER_ID = np.iinfo(np.int32).max


class InputSpec(BaseModel):
    """How to read an input: its kind, the column mapping, and the zone of times written without one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: InputFormat = Field("geolife", description="geolife, csv, parquet, gpx or visits.")
    columns: dict[str, str] = Field(
        default_factory=dict, description="nextloc column -> column in the files, e.g. tracked_at=time."
    )
    timezone: str = Field("UTC", description="Zone of timestamps written without one.")

    @field_validator("columns")
    @classmethod
    def _known_columns(cls, value: dict[str, str]) -> dict[str, str]:
        known = set(POSITIONFIX_COLUMNS) | set(VISIT_COLUMNS)
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown column(s) {unknown} in the mapping; expected some of {sorted(known)}")
        sources = list(value.values())
        if len(set(sources)) != len(sources):
            raise ValueError(f"two nextloc columns map to the same file column: {value}")
        return dict(sorted(value.items()))

    _known_timezone = field_validator("timezone")(classmethod(lambda cls, value: known_timezone(value)))

    def source(self, column: str) -> str:
        """The file column holding nextloc's ``column``."""
        return self.columns.get(column, column)


def parse_columns(text: str | None) -> dict[str, str]:
    """``"user_id=uid,tracked_at=time"`` -> ``{"user_id": "uid", "tracked_at": "time"}``.

    Raises:
        ValueError: on an item that is not ``name=column``.
    """
    mapping: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, column = item.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise ValueError(f"--columns expects name=column items separated by commas, got {item!r}")
        mapping[name.strip()] = column.strip()
    return mapping


def list_input_files(raw_dir: Path, fmt: str) -> list[Path]:
    """The input files of a tabular or visits input: ``raw_dir`` itself, or its files (recursively, sorted).

    Raises:
        FileNotFoundError: if the path does not exist or holds no file of that kind.
    """
    root = Path(raw_dir)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"input not found: {root}")
    suffixes = _SUFFIXES[fmt]
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
    if not files:
        raise FileNotFoundError(f"no {'/'.join(suffixes)} files found under {root}")
    return files


# --- CSV / parquet -----------------------------------------------------------------------------------


def read_positionfix_files(files: list[Path], spec: InputSpec) -> tuple[pa.Table, IngestReport]:
    """Read CSV or parquet positionfixes of any number of users.

    Returns:
        One table with :data:`~nextloc.geolife.POSITIONFIXES_SCHEMA` (rows in file and row order) and the
        report. Use :func:`split_by_user` for the per-user partitions.
    """
    report = IngestReport()
    parts = list(iter_positionfix_batches(files, spec, report))
    table = pa.concat_tables(parts) if parts else POSITIONFIXES_SCHEMA.empty_table()
    return table, report


def iter_positionfix_batches(files: list[Path], spec: InputSpec, report: IngestReport) -> Iterator[pa.Table]:
    """Stream CSV or parquet positionfixes: the good rows of each batch (up to about a million rows), in file
    and row order, with :data:`~nextloc.geolife.POSITIONFIXES_SCHEMA`; issues and counts go to ``report``."""
    for frame, where in _frames(files, spec, report):
        part = _positionfix_batch(frame, where, spec, report)
        if part.num_rows:
            report.rows_read += part.num_rows
            yield part


def spill_by_user(batches: Iterable[pa.Table], spill_dir: Path) -> dict[int, list[Path]]:
    """Write each batch's rows to one Arrow IPC file per user under ``spill_dir`` (memory: one batch).

    Reading a user's files in the returned order (:func:`read_spilled`) gives exactly that user's rows of
    the whole stream, in order: :func:`split_by_user` of the concatenated batches, without holding them.

    Returns:
        user id -> the user's spill files, in stream order (ids sorted).
    """
    spill_dir.mkdir(parents=True, exist_ok=True)
    pieces: dict[int, list[Path]] = {}
    for k, batch in enumerate(batches):
        for user_id, part in split_by_user(batch).items():
            path = spill_dir / f"{user_id}-{k:06d}.arrow"
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, part.schema) as writer:
                writer.write_table(part)
            pieces.setdefault(user_id, []).append(path)
    return dict(sorted(pieces.items()))


def read_spilled(paths: list[Path]) -> pa.Table:
    """One user's rows back from :func:`spill_by_user`'s files, as one contiguous table."""
    tables = []
    for path in paths:
        with pa.memory_map(str(path)) as source:
            tables.append(pa.ipc.open_file(source).read_all())
    return pa.concat_tables(tables).combine_chunks()


def read_visit_files(files: list[Path], spec: InputSpec) -> tuple[pa.Table, IngestReport]:
    """Read already-extracted visits (CSV or parquet) of any number of users.

    A visit needs ``started_at <= finished_at``; the times follow the same rules as positionfix times.

    Returns:
        One table with :data:`VISITS_SCHEMA` (rows in file and row order) and the report.
    """
    report = IngestReport()
    spec = spec.model_copy(update={"format": "visits"})
    parts = [_visit_batch(frame, where, spec, report) for frame, where in _frames(files, spec, report)]
    parts = [p for p in parts if p.num_rows]
    table = pa.concat_tables(parts) if parts else VISITS_SCHEMA.empty_table()
    report.rows_read += table.num_rows
    return table, report


def split_by_user(table: pa.Table) -> dict[int, pa.Table]:
    """Partition a table by ``user_id`` (sorted ids), keeping each user's row order."""
    if table.num_rows == 0:
        return {}
    users = table.column("user_id").to_numpy()
    order = np.argsort(users, kind="stable")
    ordered = table.take(pa.array(order))
    sorted_ids = users[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    ends = np.r_[starts[1:], len(sorted_ids)]
    return {int(sorted_ids[s]): ordered.slice(s, e - s) for s, e in zip(starts, ends, strict=True)}


class _Where:
    """Where a batch of rows came from, to name a row in an issue."""

    def __init__(self, path: Path, line_of: np.ndarray):
        self.path = str(path)
        self.line_of = line_of  # file line (CSV) or 1-based data row (parquet) of each batch row


def _frames(
    files: list[Path], spec: InputSpec, report: IngestReport
) -> Iterator[tuple[pd.DataFrame, _Where]]:
    """Batches of raw rows (renamed to nextloc's names) of every file; unusable files are reported."""
    kind = "visits" if spec.format == "visits" else "positionfixes"
    for path in files:
        is_parquet = path.suffix.lower() in (".parquet", ".pq")
        try:
            batches = _parquet_batches(path) if is_parquet else _csv_batches(path, report)
            first = True
            for frame, line_of in batches:
                if first:
                    missing = [c for c in _REQUIRED[kind] if spec.source(c) not in frame.columns]
                    if missing:
                        report.files_skipped += 1
                        names = ", ".join(f"{c} (column {spec.source(c)!r})" for c in missing)
                        report.add(
                            IngestIssue(
                                str(path),
                                1 if not is_parquet else None,
                                "missing_column",
                                f"missing {names}; the file has {list(frame.columns)[:12]}",
                            )
                        )
                        break
                    first = False
                renamed = {spec.source(c): c for c in (*POSITIONFIX_COLUMNS, *VISIT_COLUMNS)}
                frame = frame.rename(columns={k: v for k, v in renamed.items() if k in frame.columns})
                yield frame, _Where(path, line_of)
            else:
                if first:
                    report.files_skipped += 1
                    report.add(IngestIssue(str(path), None, "empty_file", "file has no rows"))
                    continue
            if not first:
                report.files_read += 1
        except (OSError, pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError, ValueError) as err:
            report.files_skipped += 1
            report.add(IngestIssue(str(path), None, "unreadable_file", short_text(str(err))))


def _csv_batches(path: Path, report: IngestReport) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Stream a CSV file as string columns; a row with the wrong field count is reported with its line."""
    if path.stat().st_size == 0 or not path.read_bytes()[:65536].strip():
        return
    invalid: list[int] = []

    def on_invalid(row: pcsv.InvalidRow) -> str:
        invalid.append(row.number if row.number is not None else -1)
        report.add(
            IngestIssue(
                str(path),
                row.number,
                "field_count",
                f"expected {row.expected_columns} comma-separated fields, got {row.actual_columns}: "
                f"{short_text(row.text)!r}",
            ),
            rows=1,
        )
        return "skip"

    with path.open("rb") as fh:
        header = fh.readline().decode("utf-8-sig", "replace").rstrip("\r\n")
    names = [n.strip() for n in header.split(",")]
    reader = pcsv.open_csv(
        path,
        read_options=pcsv.ReadOptions(use_threads=False, block_size=1 << 24, skip_rows=1, column_names=names),
        parse_options=pcsv.ParseOptions(invalid_row_handler=on_invalid, ignore_empty_lines=False),
        convert_options=pcsv.ConvertOptions(
            column_types={n: pa.string() for n in names}, strings_can_be_null=False
        ),
    )
    next_row = 0  # data rows delivered so far
    for batch in reader:
        n = batch.num_rows
        rows = np.arange(next_row, next_row + n)
        # line = header + data rows before + invalid rows at or before it (rows never span lines here)
        bad = np.sort(np.array([b for b in invalid if b > 0], np.int64))
        lines = rows + 2
        if len(bad):
            for _ in range(len(bad)):  # a skipped line shifts every later row by one; iterate to a fixpoint
                shifted = rows + 2 + np.searchsorted(bad, lines, side="right")
                if np.array_equal(shifted, lines):
                    break
                lines = shifted
        next_row += n
        yield batch.to_pandas(), lines


def _parquet_batches(path: Path) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    # pre_buffer (the default) keeps every column chunk read in a cache for the reader's lifetime: the
    # whole compressed file ends up in memory (9.4 GB RSS for 400M fixes in benchmarks/scale.py)
    pf = pq.ParquetFile(path, pre_buffer=False)
    start = 0
    for batch in pf.iter_batches(batch_size=_BATCH_ROWS):
        n = batch.num_rows
        yield batch.to_pandas(), np.arange(start + 1, start + n + 1)
        start += n
    if start == 0:
        yield pf.schema_arrow.empty_table().to_pandas(), np.empty(0, np.int64)


def _positionfix_batch(frame: pd.DataFrame, where: _Where, spec: InputSpec, report: IngestReport) -> pa.Table:
    n = len(frame)
    if n == 0:
        return POSITIONFIXES_SCHEMA.empty_table()
    bad = _empty_rows(frame, where, report)
    user = _user_ids(frame["user_id"], bad, where, report)
    tracked = _times(frame["tracked_at"], spec.timezone, "tracked_at", bad, where, report)
    lat, lon = (_numbers(frame[c], c, COORDINATE_BOUNDS[c], bad, where, report) for c in COORDINATE_BOUNDS)
    if "elevation" in frame.columns:
        elev = _numbers(frame["elevation"], "elevation", None, bad, where, report, allow_empty=True)
    else:
        elev = np.full(n, np.nan)
    good = ~bad
    return pa.table(
        {
            "user_id": pa.array(user[good].astype(np.int32)),
            "tracked_at": pa.array(tracked[good], pa.timestamp("ns", tz="UTC")),
            "latitude": pa.array(lat[good], pa.float64()),
            "longitude": pa.array(lon[good], pa.float64()),
            "elevation": pa.array(elev[good], pa.float64()),
        },
        schema=POSITIONFIXES_SCHEMA,
    )


def _visit_batch(frame: pd.DataFrame, where: _Where, spec: InputSpec, report: IngestReport) -> pa.Table:
    n = len(frame)
    if n == 0:
        return VISITS_SCHEMA.empty_table()
    bad = _empty_rows(frame, where, report)
    user = _user_ids(frame["user_id"], bad, where, report)
    started = _times(frame["started_at"], spec.timezone, "started_at", bad, where, report)
    finished = _times(frame["finished_at"], spec.timezone, "finished_at", bad, where, report)
    lat, lon = (_numbers(frame[c], c, COORDINATE_BOUNDS[c], bad, where, report) for c in COORDINATE_BOUNDS)
    backwards = ~bad & (finished < started)
    for i in np.flatnonzero(backwards):
        report.add(
            IngestIssue(
                where.path,
                int(where.line_of[i]),
                "bad_interval",
                f"finished_at {_iso(finished[i])} is before started_at {_iso(started[i])}",
            ),
            rows=1,
        )
    good = ~(bad | backwards)
    return pa.table(
        {
            "user_id": pa.array(user[good].astype(np.int32)),
            "started_at": pa.array(started[good], pa.timestamp("ns", tz="UTC")),
            "finished_at": pa.array(finished[good], pa.timestamp("ns", tz="UTC")),
            "latitude": pa.array(lat[good], pa.float64()),
            "longitude": pa.array(lon[good], pa.float64()),
        },
        schema=VISITS_SCHEMA,
    )


def _report_rows(
    mask: np.ndarray,
    bad: np.ndarray,
    values: pd.Series,
    where: _Where,
    report: IngestReport,
    kind: str,
    what: str,
) -> None:
    """Report the rows in ``mask`` that are not bad yet (one issue per row: its first problem)."""
    new = mask & ~bad
    for i in np.flatnonzero(new):
        report.add(
            IngestIssue(where.path, int(where.line_of[i]), kind, f"{what}: {short_text(values.iloc[i])!r}"),
            rows=1,
        )
    bad |= new


def _empty_rows(frame: pd.DataFrame, where: _Where, report: IngestReport) -> np.ndarray:
    """Rows whose every field is empty (a blank line in a CSV file), reported as ``empty_row``."""
    empty = np.ones(len(frame), bool)
    for column in frame.columns:
        values = frame[column]
        if _typed(values):  # a number or a time is never blank text: only a missing value is empty
            empty &= values.isna().to_numpy(bool)
            continue
        empty &= (values.isna() | (values.astype("string").str.strip() == "")).fillna(True).to_numpy(bool)
    bad = np.zeros(len(frame), bool)
    for i in np.flatnonzero(empty):
        report.add(IngestIssue(where.path, int(where.line_of[i]), "empty_row", "blank row"), rows=1)
    return bad | empty


def _typed(values: pd.Series) -> bool:
    """A numeric (not boolean) or datetime column, as typed parquet gives: no text to parse."""
    dtype = values.dtype
    numeric = pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)
    return numeric or pd.api.types.is_datetime64_any_dtype(dtype)


def _user_ids(values: pd.Series, bad: np.ndarray, where: _Where, report: IngestReport) -> np.ndarray:
    nums, _ = parse_numbers(values)
    ok = np.isfinite(nums) & (nums >= 0) & (nums <= _MAX_USER_ID) & (np.floor(nums) == nums)
    _report_rows(~ok, bad, values, where, report, "bad_user_id", "user_id is not a whole number 0..2^31-1")
    return np.where(ok, nums, 0).astype(np.int64)


def _numbers(
    values: pd.Series,
    name: str,
    bound: float | None,
    bad: np.ndarray,
    where: _Where,
    report: IngestReport,
    *,
    allow_empty: bool = False,
) -> np.ndarray:
    nums, empty = parse_numbers(values)
    if allow_empty:
        nums = np.where(empty, np.nan, nums)
        ok = empty | np.isfinite(nums)
    else:
        ok = np.isfinite(nums)
    _report_rows(~ok, bad, values, where, report, "non_numeric", f"{name} not a finite number")
    if bound is not None:
        out = ok & (np.abs(np.where(ok, nums, 0.0)) > bound)
        _report_rows(out, bad, values, where, report, "out_of_range", f"{name} outside +-{bound:g}")
    return nums


def _times(
    values: pd.Series, timezone: str, name: str, bad: np.ndarray, where: _Where, report: IngestReport
) -> np.ndarray:
    """UTC nanoseconds of each value (``0`` where bad); naive times are wall-clock times in ``timezone``."""
    parsed = parse_times(values, timezone)
    ok = parsed.notna().to_numpy(bool)
    what = f"{name} is not a time (ISO 8601; no zone means {timezone}; DST gaps and repeats are refused)"
    _report_rows(~ok, bad, values, where, report, "bad_timestamp", what)
    out = np.zeros(len(values), np.int64)
    out[ok] = parsed[ok].astype("int64").to_numpy()
    return out


# --- GPX ---------------------------------------------------------------------------------------------


def list_gpx_users(raw_dir: Path) -> tuple[list[tuple[int, Path]], IngestReport]:
    """Find the user folders of a GPX input: ``raw_dir/<user number>/`` (its ``.gpx`` files, any depth).

    Raises:
        FileNotFoundError: if ``raw_dir`` is missing or holds no user folder.
    """
    root = Path(raw_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"GPX input folder not found: {root}")
    report = IngestReport()
    users = []
    for entry in sorted(root.iterdir()):
        if not entry.is_dir():
            continue
        if not (entry.name.isascii() and entry.name.isdigit()):
            report.add(IngestIssue(str(entry), None, "not_a_user_folder", "folder name is not a user number"))
            continue
        users.append((int(entry.name), entry))
    if not users:
        raise FileNotFoundError(f"no GPX user folders (<raw_dir>/NNN/*.gpx) found under {root}")
    return users, report


def list_gpx_files(user_dir: Path) -> list[Path]:
    """The ``.gpx`` files of a user folder (any depth), sorted by path."""
    return sorted(p for p in Path(user_dir).rglob("*") if p.is_file() and p.suffix.lower() == ".gpx")


def read_gpx_user(
    user_id: int, files: list[Path], spec: InputSpec | None = None
) -> tuple[pa.Table, IngestReport]:
    """Read the track points of one user's GPX files into a positionfixes table (files by name, points in order).

    A point without a time, or with a coordinate out of range, is skipped and reported; a file that is
    not GPX (bad XML, a number gpxpy cannot read) is skipped whole, with the parser's message.
    """
    import gpxpy
    import gpxpy.gpx

    spec = spec or InputSpec(format="gpx")
    report = IngestReport()
    zone = ZoneInfo(spec.timezone)
    cols: dict[str, list] = {"tracked_at": [], "latitude": [], "longitude": [], "elevation": []}
    if not files:
        report.add(IngestIssue(f"user {user_id:03d}", None, "empty_user", "no .gpx files"))
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            report.files_skipped += 1
            report.add(IngestIssue(str(path), None, "unreadable_file", short_text(str(err))))
            continue
        if not text.strip():
            report.files_skipped += 1
            report.add(IngestIssue(str(path), None, "empty_file", "file is empty"))
            continue
        try:
            gpx = gpxpy.parse(text)
        except (gpxpy.gpx.GPXException, ValueError) as err:
            report.files_skipped += 1
            report.add(
                IngestIssue(str(path), None, "bad_gpx", f"not a readable GPX file: {short_text(str(err))}")
            )
            continue
        report.files_read += 1
        for t, track in enumerate(gpx.tracks, 1):
            for s, segment in enumerate(track.segments, 1):
                for p, point in enumerate(segment.points, 1):
                    where = f"track {t}, segment {s}, point {p}"
                    issue = _gpx_point(point, zone, cols)
                    if issue is not None:
                        report.add(IngestIssue(str(path), None, issue[0], f"{where}: {issue[1]}"), rows=1)
    n = len(cols["tracked_at"])
    report.rows_read += n
    table = pa.table(
        {
            "user_id": pa.array(np.full(n, user_id, np.int32)),
            "tracked_at": pa.array(np.array(cols["tracked_at"], np.int64), pa.timestamp("ns", tz="UTC")),
            "latitude": pa.array(cols["latitude"], pa.float64()),
            "longitude": pa.array(cols["longitude"], pa.float64()),
            "elevation": pa.array(cols["elevation"], pa.float64()),
        },
        schema=POSITIONFIXES_SCHEMA,
    )
    return table, report


def _gpx_point(point, zone: ZoneInfo, cols: dict[str, list]) -> tuple[str, str] | None:
    lat, lon = point.latitude, point.longitude
    if lat is None or lon is None or not (np.isfinite(lat) and np.isfinite(lon)):
        return "non_numeric", f"lat/lon not finite numbers ({lat}, {lon})"
    if abs(lat) > COORDINATE_BOUNDS["latitude"] or abs(lon) > COORDINATE_BOUNDS["longitude"]:
        return "out_of_range", f"coordinates out of range (lat={lat}, lon={lon})"
    if point.time is None:
        return "bad_timestamp", "track point has no <time>"
    ts = pd.Timestamp(point.time)
    ts = ts.tz_localize(zone) if ts.tzinfo is None else ts
    elev = point.elevation
    if elev is not None and not np.isfinite(elev):
        return "non_numeric", f"elevation not a finite number ({elev})"
    cols["tracked_at"].append(ts.tz_convert("UTC").value)
    cols["latitude"].append(float(lat))
    cols["longitude"].append(float(lon))
    cols["elevation"].append(np.nan if elev is None else float(elev))
    return None


def _iso(ns: int) -> str:
    return pd.Timestamp(int(ns), tz="UTC").isoformat()
