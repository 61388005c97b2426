"""Read raw GeoLife 1.3 ``.plt`` trajectories into positionfixes.

A ``.plt`` file has 6 header lines, then rows ``lat,lon,0,altitude_ft,days_since_1899,YYYY-MM-DD,HH:MM:SS``.
Times are GMT; they become tz-aware UTC ``tracked_at`` values. Altitude is converted from feet to metres
(trackintel ``read_geolife`` semantics).

Parsing is columnar: the bodies of all files of a user are concatenated and parsed once by pyarrow's
multi-threaded CSV reader. Only when that strict fast path finds something wrong (a malformed row, a
non-numeric or non-finite field, an out-of-range coordinate, a time that is not ``HH:MM:SS``, a non-ASCII
byte anywhere, a cut-off line) are the user's files split in halves, and halves of halves, down to the
files that fail alone, which are read row by row, so that every bad row is reported with its file and line
and every good row is kept; only the files that fail are read slowly. Both paths accept exactly the same
rows, so a row's fate never depends on what else is in the user's files.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

logger = logging.getLogger(__name__)

FEET_TO_M = 0.3048
HEADER_LINES = 6
_NAMES = ["latitude", "longitude", "zero", "altitude_ft", "days", "date", "time"]
_TYPES = {
    "latitude": pa.float64(),
    "longitude": pa.float64(),
    "altitude_ft": pa.float64(),
    "date": pa.date32(),
    "time": pa.time32("s"),
}
# The fast path reads the time as text and decodes it itself: pyarrow's time32 parser also accepts
# "HH:MM", which is what a row cut off inside its seconds looks like.
_FAST_TYPES = {**_TYPES, "time": pa.string()}
_USED = ["latitude", "longitude", "altitude_ft", "date", "time"]
# A header line that is really a data row (the header is short): 5 fields, then a date.
_DATA_ROW_RE = re.compile(rb"(?:[^,\n]*,){5}[ \t]*\d{4}-\d{2}-\d{2}[ \t]*,")
_UTF8_BOM = b"\xef\xbb\xbf"
MAX_ISSUES_KEPT = 200

POSITIONFIXES_SCHEMA = pa.schema(
    [
        ("user_id", pa.int32()),
        ("tracked_at", pa.timestamp("ns", tz="UTC")),
        ("latitude", pa.float64()),
        ("longitude", pa.float64()),
        ("elevation", pa.float64()),
    ]
)


@dataclass(frozen=True)
class IngestIssue:
    """One problem found in the raw data: where it is and what it is."""

    file: str
    line: int | None
    kind: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        if not self.kind and not self.message:  # a plain message, e.g. from IngestReport.from_dict
            return where
        return f"{where}: {self.kind}: {self.message}"


@dataclass
class IngestReport:
    """What was read, what was skipped and why (counts plus the first issues verbatim)."""

    files_read: int = 0
    files_skipped: int = 0
    rows_read: int = 0
    rows_skipped: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    issues: list[IngestIssue] = field(default_factory=list)

    def add(self, issue: IngestIssue, rows: int = 0) -> None:
        """Record an issue (and how many rows it cost); the first issues are kept verbatim."""
        self.counts[issue.kind] += 1
        self.rows_skipped += rows
        if len(self.issues) < MAX_ISSUES_KEPT:
            self.issues.append(issue)
        logger.warning("skipped %s", issue)

    def merge(self, other: IngestReport) -> None:
        """Add another report's numbers into this one."""
        self.files_read += other.files_read
        self.files_skipped += other.files_skipped
        self.rows_read += other.rows_read
        self.rows_skipped += other.rows_skipped
        self.counts.update(other.counts)
        room = MAX_ISSUES_KEPT - len(self.issues)
        self.issues.extend(other.issues[: max(room, 0)])

    def to_dict(self) -> dict:
        """JSON-ready summary."""
        return {
            "files_read": self.files_read,
            "files_skipped": self.files_skipped,
            "rows_read": self.rows_read,
            "rows_skipped": self.rows_skipped,
            "counts": dict(sorted(self.counts.items())),
            "issues": [str(i) for i in self.issues],
        }

    @classmethod
    def from_dict(cls, data: dict) -> IngestReport:
        """Inverse of :meth:`to_dict` (issues come back as plain messages)."""
        report = cls(
            files_read=data["files_read"],
            files_skipped=data["files_skipped"],
            rows_read=data["rows_read"],
            rows_skipped=data["rows_skipped"],
            counts=Counter(data["counts"]),
        )
        report.issues = [IngestIssue(file=msg, line=None, kind="", message="") for msg in data["issues"]]
        return report


def list_user_dirs(data_dir: Path) -> tuple[list[tuple[int, Path]], IngestReport]:
    """Find the user folders ``Data/NNN`` under a GeoLife root (or its ``Data`` folder).

    Args:
        data_dir: the folder holding ``Data/`` (or ``Data/`` itself).

    Returns:
        ``[(user_id, folder), ...]`` sorted by user id, and a report naming folders that were skipped.

    Raises:
        FileNotFoundError: if no user folder exists there.

    Examples:
        >>> users, report = list_user_dirs(Path("geolife"))  # doctest: +SKIP
    """
    root = Path(data_dir)
    if (root / "Data").is_dir():
        root = root / "Data"
    if not root.is_dir():
        raise FileNotFoundError(f"GeoLife data folder not found: {root}")
    report = IngestReport()
    users: list[tuple[int, Path]] = []
    for entry in sorted(root.iterdir()):
        if not entry.is_dir():
            continue
        if not (entry.name.isascii() and entry.name.isdigit()):  # "²".isdigit() but int("²") fails
            report.add(IngestIssue(str(entry), None, "not_a_user_folder", "folder name is not a user number"))
            continue
        users.append((int(entry.name), entry))
    if not users:
        raise FileNotFoundError(f"no GeoLife user folders (Data/NNN) found under {root}")
    return users, report


def list_plt_files(user_dir: Path) -> list[Path]:
    """The ``Trajectory/*.plt`` files of a user folder, sorted by name (i.e. by start time)."""
    traj = Path(user_dir) / "Trajectory"
    if not traj.is_dir():
        return []
    with os.scandir(traj) as entries:  # the entries' types come with the listing: no stat per file
        names = [e.name for e in entries if _has_plt_suffix(e.name) and e.is_file()]
    return [traj / name for name in sorted(names)]


def _has_plt_suffix(name: str) -> bool:
    """``Path(name).suffix.lower() == ".plt"`` (a name that is only ``.plt`` has no suffix)."""
    return len(name) > 4 and name[-4:].lower() == ".plt"


def read_user(user_id: int, files: list[Path]) -> tuple[pa.Table, IngestReport]:
    """Read all ``.plt`` files of one user into a positionfixes table.

    Rows keep file order (files sorted by name) and line order; nothing is sorted or de-duplicated here.

    Args:
        user_id: the GeoLife user number.
        files: the user's ``.plt`` files.

    Returns:
        A table with :data:`POSITIONFIXES_SCHEMA` and the report of what was skipped.
    """
    report = IngestReport()
    bodies: list[tuple[Path, memoryview, int]] = []  # (file, body, first body line number)
    for path in files:
        read = _read_body(path, report)
        if read is None:
            continue
        bodies.append((path, *read))
    if not bodies:
        if not files:
            report.add(IngestIssue(f"user {user_id:03d}", None, "empty_user", "no .plt files"))
        return _empty_table(), report

    tables = _parse(bodies, report)
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    report.files_read += len(bodies)
    report.rows_read += table.num_rows
    return _finish(table, user_id), report


def _read_body(path: Path, report: IngestReport) -> tuple[memoryview, int] | None:
    """The data part of a .plt file (zero-copy) and its first line number, or None (reported) if it is
    not a GeoLife trajectory.

    A GeoLife header whose later lines are missing (a data row appears among the first 6 lines) is
    reported as ``short_header`` and the file is read from that data row on, so no row is silently
    taken for a header line. A file with no header at all, whose first line is a GeoLife data row, is
    reported as ``missing_header`` and read whole (its rows are judged like any other).
    """
    try:
        raw = path.read_bytes()
    except OSError as err:
        report.files_skipped += 1
        report.add(IngestIssue(str(path), None, "unreadable_file", str(err)))
        return None
    if not raw.strip():
        report.files_skipped += 1
        report.add(IngestIssue(str(path), None, "empty_file", "file is empty"))
        return None
    skip = len(_UTF8_BOM) if raw.startswith(_UTF8_BOM) else 0  # a BOM (Windows editors) is no content
    if _DATA_ROW_RE.match(raw, skip):
        report.add(
            IngestIssue(
                str(path),
                1,
                "missing_header",
                "no GeoLife header: line 1 is a data row; every line is read as data",
            )
        )
        if not raw.endswith(b"\n"):
            raw += b"\n"
        return memoryview(raw)[skip:], 1
    pos = 0
    first_line = HEADER_LINES + 1
    for line_no in range(1, HEADER_LINES + 1):
        if line_no > 1 and _DATA_ROW_RE.match(raw, pos):
            first_line = line_no  # a data row where a header line should be: the header is short
            break
        nl = raw.find(b"\n", pos)
        if nl < 0:
            pos = -1
            break
        pos = nl + 1
    title = raw[skip : skip + 20]
    if pos < 0 or not title.strip().lower().startswith(b"geolife trajectory"):
        report.files_skipped += 1
        first = raw[:60].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
        report.add(
            IngestIssue(str(path), 1, "bad_header", f"not a GeoLife .plt header (first line {first!r})")
        )
        return None
    if first_line <= HEADER_LINES:
        report.add(
            IngestIssue(
                str(path),
                first_line,
                "short_header",
                f"header has {first_line - 1} lines, expected {HEADER_LINES}; line {first_line} is read as data",
            )
        )
    if not raw.endswith(b"\n"):
        raw += b"\n"  # a file cut off mid-line: the partial row is judged by the parser
    return memoryview(raw)[pos:], first_line


def _parse(bodies: list[tuple[Path, memoryview, int]], report: IngestReport) -> list[pa.Table]:
    """The bodies' rows in order: parsed at once when the strict fast path accepts them all, else each half
    on its own, down to the files that fail alone, which are read row by row (and their bad rows reported)."""
    table = _parse_fast(bodies)
    if table is not None:
        return [table]
    if len(bodies) == 1:
        return [_parse_slow(bodies, report)]
    half = len(bodies) // 2
    return _parse(bodies[:half], report) + _parse(bodies[half:], report)


def _parse_fast(bodies: list[tuple[Path, memoryview, int]]) -> pa.Table | None:
    """Strict columnar parse of all bodies at once; None if anything at all looks wrong."""
    expected = sum(body.obj.count(b"\n", len(body.obj) - len(body)) for _, body, _ in bodies)
    bad_rows: list[int] = []
    data = b"".join(body for _, body, _ in bodies)
    if not data.isascii():  # the unused columns are never decoded by the CSV reader
        return None

    def on_invalid(row: pcsv.InvalidRow) -> str:
        bad_rows.append(row.number or -1)
        return "skip"

    try:
        table = pcsv.read_csv(
            pa.py_buffer(data),
            read_options=pcsv.ReadOptions(column_names=_NAMES, block_size=1 << 24),
            parse_options=pcsv.ParseOptions(
                invalid_row_handler=on_invalid, ignore_empty_lines=False, quote_char=False
            ),
            convert_options=pcsv.ConvertOptions(
                column_types=_FAST_TYPES, include_columns=_USED, strings_can_be_null=False
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError):
        return None
    if bad_rows or table.num_rows != expected:
        return None
    if any(table.column(c).null_count for c in _USED):
        return None
    if not _in_range(table).all():
        return None
    seconds = _strict_seconds(table.column("time"))
    if seconds is None:
        return None
    return table.set_column(table.schema.get_field_index("time"), "time", seconds)


def _strict_seconds(times: pa.ChunkedArray) -> pa.Array | None:
    """Decode exact ``HH:MM:SS`` strings to time32 seconds, vectorised; None if any value is not one."""
    parts = []
    for chunk in times.chunks:
        n = len(chunk)
        if n == 0:
            continue
        offsets = np.frombuffer(chunk.buffers()[1], np.int32, count=n + 1, offset=chunk.offset * 4)
        if not (np.diff(offsets) == 8).all():
            return None
        text = np.frombuffer(chunk.buffers()[2], np.uint8, count=8 * n, offset=int(offsets[0])).reshape(n, 8)
        if not (text[:, [2, 5]] == ord(":")).all():
            return None
        digits = text[:, [0, 1, 3, 4, 6, 7]] - np.uint8(ord("0"))  # non-digits wrap around to > 9
        if not (digits <= 9).all():
            return None
        d = digits.astype(np.int32)
        hours, minutes, secs = d[:, 0] * 10 + d[:, 1], d[:, 2] * 10 + d[:, 3], d[:, 4] * 10 + d[:, 5]
        if not ((hours < 24) & (minutes < 60) & (secs < 60)).all():
            return None
        parts.append(hours * 3600 + minutes * 60 + secs)
    secs_all = np.concatenate(parts) if parts else np.empty(0, np.int32)
    return pa.array(secs_all, pa.int32()).cast(pa.time32("s"))


def _in_range(table: pa.Table) -> np.ndarray:
    lat = table.column("latitude").to_numpy()
    lon = table.column("longitude").to_numpy()
    alt = table.column("altitude_ft").to_numpy()
    return (np.abs(lat) <= 90.0) & (np.abs(lon) <= 180.0) & np.isfinite(alt)


def _parse_slow(bodies: list[tuple[Path, memoryview, int]], report: IngestReport) -> pa.Table:
    """Row-by-row parse that reports each bad row with its file and line and keeps every good row."""
    cols: dict[str, list] = {c: [] for c in _USED}
    for path, body, first_line in bodies:
        for offset, raw_line in enumerate(bytes(body).split(b"\n")[:-1]):
            line_no = first_line + offset
            issue = _parse_row(raw_line, cols)
            if issue is not None:
                report.add(IngestIssue(str(path), line_no, issue[0], issue[1]), rows=1)
    return pa.table(
        {
            "latitude": pa.array(cols["latitude"], pa.float64()),
            "longitude": pa.array(cols["longitude"], pa.float64()),
            "altitude_ft": pa.array(cols["altitude_ft"], pa.float64()),
            "date": pc.cast(pa.array(cols["date"], pa.string()), pa.date32())
            if cols["date"]
            else pa.array([], pa.date32()),
            "time": _parse_times(cols["time"]),
        }
    )


def _parse_row(raw_line: bytes, cols: dict[str, list]) -> tuple[str, str] | None:
    """Validate one data row; append it to ``cols`` if good, else return (kind, message)."""
    try:
        line = raw_line.decode("ascii").strip()
    except UnicodeDecodeError:
        return "non_ascii", f"row contains non-ASCII bytes: {raw_line[:60]!r}"
    if not line:
        return "empty_row", "blank line"
    parts = line.split(",")
    if len(parts) != len(_NAMES):
        return (
            "field_count",
            f"expected {len(_NAMES)} comma-separated fields, got {len(parts)}: {line[:80]!r}",
        )
    try:
        if "_" in parts[0] + parts[1] + parts[3]:  # float() takes "3_9.9"; a CSV number has no "_"
            raise ValueError(parts[0])
        lat, lon, alt = float(parts[0]), float(parts[1]), float(parts[3])
    except ValueError:
        return "non_numeric", f"latitude/longitude/altitude not numeric: {line[:80]!r}"
    if not (np.isfinite(lat) and np.isfinite(lon) and np.isfinite(alt)):
        return "non_numeric", f"non-finite value: {line[:80]!r}"
    if abs(lat) > 90 or abs(lon) > 180:
        return "out_of_range", f"coordinates out of range (lat={lat}, lon={lon})"
    date, time = parts[5].strip(), parts[6].strip()
    if not (_DATE_RE.match(date) and _TIME_RE.match(time)):
        return "bad_timestamp", f"date/time not YYYY-MM-DD,HH:MM:SS: {date!r},{time!r}"
    try:
        np.datetime64(f"{date}T{time}")
    except ValueError:
        return "bad_timestamp", f"invalid date/time {date} {time}"
    cols["latitude"].append(lat)
    cols["longitude"].append(lon)
    cols["altitude_ft"].append(alt)
    cols["date"].append(date)
    cols["time"].append(time)
    return None


_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TIME_RE = re.compile(r"^\d{2}:\d{2}:\d{2}$")


def _parse_times(values: list[str]) -> pa.Array:
    if not values:
        return pa.array([], pa.time32("s"))
    secs = [int(v[0:2]) * 3600 + int(v[3:5]) * 60 + int(v[6:8]) for v in values]
    return pa.array(secs, pa.int32()).cast(pa.time32("s"))


def _finish(table: pa.Table, user_id: int) -> pa.Table:
    days = table.column("date").cast(pa.int32()).to_numpy().astype(np.int64)
    secs = table.column("time").cast(pa.int32()).to_numpy().astype(np.int64)
    tracked_at = (days * 86_400 + secs) * 1_000_000_000
    return pa.table(
        {
            "user_id": pa.array(np.full(table.num_rows, user_id, np.int32)),
            "tracked_at": pa.array(tracked_at, pa.timestamp("ns", tz="UTC")),
            "latitude": table.column("latitude").combine_chunks(),
            "longitude": table.column("longitude").combine_chunks(),
            "elevation": pa.array(table.column("altitude_ft").to_numpy() * FEET_TO_M, pa.float64()),
        },
        schema=POSITIONFIXES_SCHEMA,
    )


def _empty_table() -> pa.Table:
    return POSITIONFIXES_SCHEMA.empty_table()
