"""CSV and parquet input: positionfixes or already-extracted visits of any number of users, streamed.

The rules of every reader beside GeoLife (:mod:`nextloc.io.inputs`): a bad row is reported with its file and
row and skipped, the good rows around it keep their exact values, a bad file costs that file, and every issue
lands in an :class:`~nextloc.io.geolife.IngestReport`. A row's first problem is its issue; a row whose every
field is blank is an ``empty_row``.

Columns are renamed to nextloc's names through :meth:`~nextloc.io.inputs.InputSpec.source`; times and numbers
are read by :mod:`nextloc.io.visits`, a time without a zone being wall-clock time in the input's zone. CSV
issues name the file's line (the header is line 1, and a skipped malformed line still counts); parquet
issues name the data row (1-based). A file is read in batches of about a million rows, and a parquet file
without its pre-buffer cache, so memory stays about one batch whatever the file's size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.ipc  # noqa: F401  (pa.ipc)
import pyarrow.parquet as pq

from nextloc.io.geolife import POSITIONFIXES_SCHEMA, IngestIssue, IngestReport
from nextloc.io.inputs import InputSpec
from nextloc.io.visits import (
    COORDINATE_BOUNDS,
    POSITIONFIX_COLUMNS,
    REQUIRED_POSITIONFIX_COLUMNS,
    VISIT_COLUMNS,
    VISITS_SCHEMA,
    parse_numbers,
    parse_times,
    short_text,
)

# trackintel staypoints (its CSV writer's WKT, or GeoParquet's WKB): the point is the ``geom`` column
TRACKINTEL_COLUMNS = ("user_id", "started_at", "finished_at", "geom")
_REQUIRED = {
    "positionfixes": REQUIRED_POSITIONFIX_COLUMNS,
    "visits": VISIT_COLUMNS,
    "trackintel": TRACKINTEL_COLUMNS,
}
_BATCH_ROWS = 1 << 20
_MAX_USER_ID = np.iinfo(np.int32).max


def read_positionfix_files(files: list[Path], spec: InputSpec) -> tuple[pa.Table, IngestReport]:
    """Read CSV or parquet positionfixes of any number of users.

    Returns:
        One table with :data:`~nextloc.io.geolife.POSITIONFIXES_SCHEMA` (rows in file and row order) and the
        report. Use :func:`split_by_user` for the per-user partitions.
    """
    report = IngestReport()
    parts = list(iter_positionfix_batches(files, spec, report))
    table = pa.concat_tables(parts) if parts else POSITIONFIXES_SCHEMA.empty_table()
    return table, report


def iter_positionfix_batches(files: list[Path], spec: InputSpec, report: IngestReport) -> Iterator[pa.Table]:
    """Stream CSV or parquet positionfixes: the good rows of each batch (up to about a million rows), in file
    and row order, with :data:`~nextloc.io.geolife.POSITIONFIXES_SCHEMA`; issues and counts go to ``report``."""
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
    """Read already-extracted visits (CSV or parquet) of any number of users: nextloc's visit columns, or
    trackintel staypoints (``spec.format == "trackintel"``: the point in ``geom``, WKT or WKB).

    A visit needs ``started_at <= finished_at``; the times follow the same rules as positionfix times.

    Returns:
        One table with :data:`VISITS_SCHEMA` (rows in file and row order) and the report.
    """
    report = IngestReport()
    if spec.format != "trackintel":
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
    kind = spec.format if spec.format in ("visits", "trackintel") else "positionfixes"
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
    if spec.format == "trackintel":
        lat, lon = _point_coordinates(frame["geom"], bad, where, report)
    else:
        lat, lon = (
            _numbers(frame[c], c, COORDINATE_BOUNDS[c], bad, where, report) for c in COORDINATE_BOUNDS
        )
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
        if _typed(values) or _binary(values):  # a number, time or WKB is never blank text: only missing
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


def _binary(values: pd.Series) -> bool:
    """A column of bytes (a parquet binary column: GeoParquet's WKB), which is not text."""
    first = values.first_valid_index()
    return values.dtype == object and first is not None and isinstance(values[first], bytes | bytearray)


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


def _point_coordinates(
    values: pd.Series, bad: np.ndarray, where: _Where, report: IngestReport
) -> tuple[np.ndarray, np.ndarray]:
    """Latitude and longitude of a ``geom`` column: WKT text (trackintel's CSV writers) or WKB bytes
    (GeoParquet). A value that is not a non-empty point is a ``bad_geometry`` row; coordinates out of
    range are ``out_of_range`` rows, as for the latitude and longitude columns."""
    import shapely  # here: only this input format needs it, and every CLI command imports this module

    raw = values.to_numpy(object)
    wkb = any(isinstance(v, bytes | bytearray) for v in raw)  # a parquet binary column (nulls aside)
    texts = raw if wkb else np.array([v if isinstance(v, str) else "" for v in raw], object)
    geoms = (
        shapely.from_wkb(raw, on_invalid="ignore") if wkb else shapely.from_wkt(texts, on_invalid="ignore")
    )
    ok = (shapely.get_type_id(geoms) == 0) & ~shapely.is_empty(geoms)
    _report_rows(~ok, bad, values, where, report, "bad_geometry", "geom is not a point (WKT or WKB)")
    lat = pd.Series(np.where(ok, shapely.get_y(geoms), np.nan), index=values.index)
    lon = pd.Series(np.where(ok, shapely.get_x(geoms), np.nan), index=values.index)
    return (
        _numbers(lat, "latitude", COORDINATE_BOUNDS["latitude"], bad, where, report),
        _numbers(lon, "longitude", COORDINATE_BOUNDS["longitude"], bad, where, report),
    )


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


def _iso(ns: int) -> str:
    return pd.Timestamp(int(ns), tz="UTC").isoformat()
