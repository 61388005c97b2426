"""Seeded synthetic trajectories, and writers for every input format nextloc reads.

:func:`generate` makes ``n_users`` people, each with a home, a work place and a few other anchor places
around a city centre, and lives ``n_days`` of routine: nights at home, weekdays at work with an
occasional errand, weekends at the other places, all with random start times and durations. With
``night_at_home`` (the default) the first stay of a day starts at midnight (UTC) and the last one ends at
midnight, so a user's stays cover every tracked day but its trips, as in continuously tracked data sets
such as DIY: the tracking quality of 10-week windows is about 0.85 with the default ``skip_day_rate``, so
users pass the DIY filter (``min_thres`` 0.6, ``mean_thres`` 0.7). Without it a day's record starts an
hour before the first trip and ends an hour after the last (GeoLife-like habits; quality about 0.36). Trips move
at city speeds; fixes come every few seconds while moving and sparser while staying, with metre-scale GPS
noise (GeoLife-like rates). It is a workload for tests and benchmarks, never a stand-in for GeoLife in an
accuracy claim.

Everything streams: one user-day at a time goes to a :class:`Sink` (CSV, parquet, GPX or visits), so
the data set is never in memory. The same seed gives the same bytes.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from nextloc.io.geolife import POSITIONFIXES_SCHEMA
from nextloc.io.visits import VISITS_SCHEMA

logger = logging.getLogger(__name__)

SynthFormat = Literal["geolife", "csv", "parquet", "gpx", "visits"]
SYNTH_FORMATS: tuple[str, ...] = get_args(SynthFormat)
_M_PER_DEG = 111_320.0


def _iso(ns: np.ndarray, timezone: str | None) -> list[str]:
    """ISO 8601 texts of UTC nanoseconds: ``...Z`` when ``timezone`` is None, else naive wall-clock time."""
    times = pd.to_datetime(ns, utc=True)
    if timezone is None:
        return list(times.strftime("%Y-%m-%dT%H:%M:%S.%fZ").str.replace(".000000Z", "Z", regex=False))
    local = times.tz_convert(timezone).tz_localize(None)
    return list(local.strftime("%Y-%m-%d %H:%M:%S.%f").str.replace(".000000", "", regex=False))


class Sink:
    """Where tables go, a batch at a time; ``close`` finishes the files."""

    def write(self, table: pa.Table, name: str = "") -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        """Finish the files."""

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CsvSink(Sink):
    """One CSV file; ``columns`` renames nextloc's columns; ``timezone`` writes naive local times."""

    def __init__(self, path: Path, columns: dict[str, str] | None = None, timezone: str | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns = columns or {}
        self.timezone = timezone
        self._fh = self.path.open("w", newline="")
        self._writer = csv.writer(self._fh, lineterminator="\n")
        self._header = False

    def write(self, table: pa.Table, name: str = "") -> None:
        if not self._header:
            self._writer.writerow([self.columns.get(c, c) for c in table.column_names])
            self._header = True
        cols = []
        for field in table.schema:
            values = table.column(field.name)
            if pa.types.is_timestamp(field.type):
                cols.append(_iso(values.cast(pa.int64()).to_numpy(), self.timezone))
            elif pa.types.is_floating(field.type):
                cols.append(["" if np.isnan(v) else repr(float(v)) for v in values.to_numpy()])
            else:
                cols.append([str(v) for v in values.to_pylist()])
        self._writer.writerows(zip(*cols, strict=True))

    def close(self) -> None:
        self._fh.close()


class ParquetSink(Sink):
    """One parquet file; ``columns`` renames nextloc's columns.

    Batches are buffered into row groups of at least ``row_group_rows`` rows (one row group per user-day
    would make a DIY-size visits file mostly parquet overhead: 70 MB for 200,000 visits); ``None`` writes
    a row group per batch.
    """

    def __init__(
        self, path: Path, columns: dict[str, str] | None = None, row_group_rows: int | None = 65_536
    ):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns = columns or {}
        self.row_group_rows = row_group_rows
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def write(self, table: pa.Table, name: str = "") -> None:
        table = table.rename_columns([self.columns.get(c, c) for c in table.column_names])
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, table.schema, compression="zstd")
        if not self.row_group_rows:
            self._writer.write_table(table)
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= self.row_group_rows:
            self._flush()

    def _flush(self) -> None:
        if self._writer is not None and self._pending:
            self._writer.write_table(
                pa.concat_tables(self._pending), row_group_size=max(1, self._pending_rows)
            )
        self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        if self._writer is not None:
            self._flush()
            self._writer.close()


class GpxSink(Sink):
    """GPX files ``<root>/<user>/<name>.gpx``: one track per batch (a batch holds one user)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def write(self, table: pa.Table, name: str = "") -> None:
        if table.num_rows == 0:
            return
        user = int(table.column("user_id")[0].as_py())
        path = self.root / f"{user:03d}" / f"{name or 'track'}.gpx"
        path.parent.mkdir(parents=True, exist_ok=True)
        times = _iso(table.column("tracked_at").cast(pa.int64()).to_numpy(), None)
        lat = table.column("latitude").to_numpy()
        lon = table.column("longitude").to_numpy()
        ele = table.column("elevation").to_numpy()
        with path.open("w", encoding="utf-8") as fh:
            fh.write('<?xml version="1.0" encoding="UTF-8"?>\n')
            fh.write('<gpx version="1.1" creator="nextloc" xmlns="http://www.topografix.com/GPX/1/1">\n')
            fh.write(f"<trk><name>{name}</name><trkseg>\n")
            for i in range(table.num_rows):
                elev = "" if np.isnan(ele[i]) else f"<ele>{float(ele[i])!r}</ele>"
                fh.write(
                    f'<trkpt lat="{float(lat[i])!r}" lon="{float(lon[i])!r}">{elev}<time>{times[i]}</time></trkpt>\n'
                )
            fh.write("</trkseg></trk>\n</gpx>\n")


class PltSink(Sink):
    """GeoLife ``.plt`` files ``<root>/Data/<user>/Trajectory/<name>.plt`` (altitude in feet)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def write(self, table: pa.Table, name: str = "") -> None:
        if table.num_rows == 0:
            return
        user = int(table.column("user_id")[0].as_py())
        path = self.root / "Data" / f"{user:03d}" / "Trajectory" / f"{name or 'track'}.plt"
        path.parent.mkdir(parents=True, exist_ok=True)
        ns = table.column("tracked_at").cast(pa.int64()).to_numpy()
        secs = ns // 1_000_000_000
        times = pd.to_datetime(secs, unit="s", utc=True)
        days = secs / 86_400 + 25_569.0
        with path.open("w") as fh:
            fh.write(
                "Geolife trajectory\nWGS 84\nAltitude is in Feet\nReserved 3\n0,2,255,My Track,0,0,2,8421376\n0\n"
            )
            for i in range(table.num_rows):
                lat, lon = table.column("latitude")[i].as_py(), table.column("longitude")[i].as_py()
                elev = table.column("elevation")[i].as_py()
                ft = -777 if elev is None or np.isnan(elev) else elev / 0.3048
                fh.write(f"{lat!r},{lon!r},0,{ft!r},{days[i]!r},{times[i]:%Y-%m-%d},{times[i]:%H:%M:%S}\n")


def open_sink(
    fmt: str, out: Path, columns: dict[str, str] | None = None, timezone: str | None = None
) -> Sink:
    """The sink for an input format: ``out`` is a file for csv/parquet/visits (by suffix), a folder otherwise."""
    out = Path(out)
    if fmt == "csv":
        return CsvSink(out, columns, timezone)
    if fmt == "parquet":
        return ParquetSink(out, columns)
    if fmt == "gpx":
        return GpxSink(out)
    if fmt == "geolife":
        return PltSink(out)
    if fmt == "visits":
        return (
            ParquetSink(out, columns)
            if out.suffix in (".parquet", ".pq")
            else CsvSink(out, columns, timezone)
        )
    raise ValueError(f"unknown format {fmt!r}")


@dataclass(frozen=True)
class SynthConfig:
    """Size and behaviour of a synthetic data set.

    ``skip_day_rate`` is the share of untracked days; ``night_at_home`` makes the first and last stay of a
    day reach midnight (see the module docstring); intervals are seconds between fixes.
    """

    n_users: int = 10
    n_days: int = 90
    n_other_places: int = 4
    seed: int = 0
    start: str = "2008-01-07"
    centre_lat: float = 39.98
    centre_lon: float = 116.32
    city_radius_m: float = 15_000.0
    moving_interval_s: float = 5.0
    staying_interval_s: float = 60.0
    speed_m_s: float = 8.0
    gps_noise_m: float = 5.0
    skip_day_rate: float = 0.1
    night_at_home: bool = True


def generate(
    config: SynthConfig,
    fmt: SynthFormat,
    out: Path,
    columns: dict[str, str] | None = None,
    timezone: str | None = None,
    sink: Sink | None = None,
) -> dict[str, int]:
    """Write a synthetic data set in ``fmt`` to ``out``, one user-day at a time.

    ``sink`` replaces the format's default sink (``out`` is then unused), e.g. a
    ``ParquetSink(path, row_group_rows=1 << 20)`` for hundreds of millions of fixes.

    Returns:
        ``{"users": ..., "positionfixes": ..., "visits": ...}`` (what was written).
    """
    counts = {"users": config.n_users, "positionfixes": 0, "visits": 0}
    with sink or open_sink(fmt, out, columns, timezone) as sink:
        for user in range(1, config.n_users + 1):
            rng = np.random.default_rng([config.seed, user])
            places = _anchors(config, rng)
            for day in range(config.n_days):
                if rng.random() < config.skip_day_rate:
                    continue
                visits = _day_plan(config, rng, user, day, places)
                counts["visits"] += len(visits["started_at"])
                if fmt == "visits":
                    sink.write(_visits_table(user, visits))
                    continue
                fixes = _fixes(config, rng, user, visits)
                counts["positionfixes"] += fixes.num_rows
                sink.write(fixes, name=f"{pd.Timestamp(config.start) + pd.Timedelta(days=day):%Y%m%d}")
    logger.info("synthetic data: %s -> %s", counts, out)
    return counts


def _anchors(config: SynthConfig, rng: np.random.Generator) -> np.ndarray:
    n = 2 + config.n_other_places
    r = config.city_radius_m * np.sqrt(rng.random(n))
    a = rng.random(n) * 2 * np.pi
    lat = config.centre_lat + r * np.sin(a) / _M_PER_DEG
    lon = config.centre_lon + r * np.cos(a) / (_M_PER_DEG * np.cos(np.radians(config.centre_lat)))
    return np.column_stack([lat, lon])


def _day_plan(config: SynthConfig, rng: np.random.Generator, user: int, day: int, places: np.ndarray) -> dict:
    """The day's stays as (place index, start, end) in UTC nanoseconds; home at night, routines by weekday."""
    base = pd.Timestamp(config.start, tz="UTC").value + day * 86_400 * 10**9
    weekday = (pd.Timestamp(config.start).weekday() + day) % 7
    hour = 3_600 * 10**9
    plan = [0]
    if weekday < 5:
        plan.append(1)
        if rng.random() < 0.3:
            plan.append(2 + int(rng.integers(config.n_other_places)))
    else:
        plan.extend(2 + rng.choice(config.n_other_places, size=int(rng.integers(1, 3)), replace=False))
    plan.append(0)
    t = base + int((6.5 + rng.normal(0, 0.5)) * hour)
    starts, ends, where = [], [], []
    for k, place in enumerate(plan):
        stay = (8.5 if place == 1 else 1.5 + 2 * rng.random()) * hour if 0 < k < len(plan) - 1 else hour
        starts.append(t)
        ends.append(t + int(stay))
        where.append(int(place))
        if config.night_at_home and k == 0:
            starts[0] = min(base, t)  # the night since midnight, at home
        elif config.night_at_home and k == len(plan) - 1:
            ends[-1] = max(base + 24 * hour, t + 60 * 10**9)  # the evening until midnight, at home
        if k + 1 < len(plan):
            dist = _dist_m(places[place], places[plan[k + 1]])
            t = ends[-1] + int((dist / config.speed_m_s + 300) * 10**9)
    return {"place": where, "started_at": starts, "finished_at": ends, "coords": places}


def _fixes(config: SynthConfig, rng: np.random.Generator, user: int, visits: dict) -> pa.Table:
    places = visits["coords"]
    times, lats, lons = [], [], []
    step_s = config.staying_interval_s * 10**9
    move_s = config.moving_interval_s * 10**9
    for k, place in enumerate(visits["place"]):
        t = np.arange(visits["started_at"][k], visits["finished_at"][k], step_s, dtype=np.int64)
        times.append(t)
        lats.append(np.full(len(t), places[place][0]))
        lons.append(np.full(len(t), places[place][1]))
        if k + 1 < len(visits["place"]):
            t0, t1 = visits["finished_at"][k], visits["started_at"][k + 1]
            tm = np.arange(t0, t1, move_s, dtype=np.int64)
            f = (tm - t0) / max(t1 - t0, 1)
            nxt = places[visits["place"][k + 1]]
            times.append(tm)
            lats.append(places[place][0] + f * (nxt[0] - places[place][0]))
            lons.append(places[place][1] + f * (nxt[1] - places[place][1]))
    t = np.concatenate(times)
    noise = rng.normal(0, config.gps_noise_m / _M_PER_DEG, (len(t), 2))
    lat = np.round(np.concatenate(lats) + noise[:, 0], 7)
    lon = np.round(np.concatenate(lons) + noise[:, 1] / np.cos(np.radians(config.centre_lat)), 7)
    elev = np.round(50 + rng.normal(0, 3, len(t)), 1)
    return pa.table(
        {
            "user_id": pa.array(np.full(len(t), user, np.int32)),
            "tracked_at": pa.array(t, pa.timestamp("ns", tz="UTC")),
            "latitude": lat,
            "longitude": lon,
            "elevation": elev,
        },
        schema=POSITIONFIXES_SCHEMA,
    )


def _visits_table(user: int, visits: dict) -> pa.Table:
    coords = visits["coords"][visits["place"]]
    n = len(visits["place"])
    return pa.table(
        {
            "user_id": pa.array(np.full(n, user, np.int32)),
            "started_at": pa.array(visits["started_at"], pa.timestamp("ns", tz="UTC")),
            "finished_at": pa.array(visits["finished_at"], pa.timestamp("ns", tz="UTC")),
            "latitude": np.round(coords[:, 0], 7),
            "longitude": np.round(coords[:, 1], 7),
        },
        schema=VISITS_SCHEMA,
    )


def _dist_m(a: np.ndarray, b: np.ndarray) -> float:
    dlat = (a[0] - b[0]) * _M_PER_DEG
    dlon = (a[1] - b[1]) * _M_PER_DEG * np.cos(np.radians(a[0]))
    return float(np.hypot(dlat, dlon))
