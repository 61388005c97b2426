"""GPX input (through ``gpxpy``): every track point of every track segment, one folder per user.

A user's folder is named by the user number (``raw_dir/NNN/``, ``.gpx`` files at any depth). A point
without a time, or with a coordinate out of range, is skipped and reported naming its track, segment and
point; a file that is not GPX is skipped whole with the parser's message. A point's time without a zone is
wall-clock time in the input's zone.
"""

from __future__ import annotations

from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd
import pyarrow as pa

from nextloc.io.geolife import POSITIONFIXES_SCHEMA, IngestIssue, IngestReport
from nextloc.io.inputs import InputSpec
from nextloc.io.visits import COORDINATE_BOUNDS, short_text


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
