"""Staypoints from positionfixes: a compiled, exact equivalent of trackintel's sliding method.

``generate_staypoints`` reproduces ``trackintel.preprocessing.generate_staypoints(method="sliding",
distance_metric="haversine", exclude_duplicate_pfs=True)`` row for row: the same duplicate removal, the same
stable time ordering, the same float haversine, the same anchor/gap/threshold logic, ``finished_at`` = the
first fix outside, and the same geometry (circular mean of the longitudes and arithmetic mean of the
latitudes of the *unique* fixes, summed in the same order). ``tests/nextloc/preprocessing/test_staypoints.py`` checks
that equality against trackintel itself on real GeoLife users.

The per-fix loop is sequential by nature (each anchor depends on the previous decision), so it is written
as numba kernels (:mod:`nextloc.preprocessing.staypoint_kernels`, imported on first use) rather than
trackintel's Python loop.

It also computes, per user, the time extent of trackintel's ``between_staypoints`` triplegs (the
positionfixes outside staypoints, split at temporal gaps, at least two distinct points), which is all the
reference user-quality filter needs from triplegs and trips (see :mod:`nextloc.preprocessing.quality`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from nextloc.config import StaypointConfig

NAT_NS = np.iinfo(np.int64).min  # NaT as int64 nanoseconds

logger = logging.getLogger(__name__)

_NS_PER_MIN = 60_000_000_000

STAYPOINT_COLUMNS = ["user_id", "started_at", "finished_at", "latitude", "longitude", "elevation", "n_pfs"]


@dataclass(frozen=True)
class UserStaypoints:
    """Staypoints of one user plus what the quality filter needs to know about the user's triplegs."""

    user_id: int
    staypoints: pd.DataFrame
    tripleg_start: pd.Timestamp | None
    tripleg_end: pd.Timestamp | None
    n_pfs: int
    n_duplicates: int


def generate_staypoints(
    positionfixes: pd.DataFrame,
    config: StaypointConfig | None = None,
    *,
    tripleg_gap_threshold_min: float = 15.0,
) -> UserStaypoints:
    """Detect staypoints of a single user with the sliding-window method.

    Args:
        positionfixes: one user's fixes with ``user_id``, ``tracked_at`` (tz-aware UTC), ``latitude``,
            ``longitude`` and ``elevation``, in read order (ties in ``tracked_at`` keep this order).
        config: thresholds; defaults are the reference's (200 m, 30 min, 24 h gap, include_last).
        tripleg_gap_threshold_min: temporal gap that splits triplegs (trackintel default 15 min).

    Returns:
        The staypoints (``started_at``, ``finished_at``, centroid ``latitude``/``longitude``, median
        ``elevation``, number of fixes) and the extent of the user's triplegs.

    Examples:
        >>> result = generate_staypoints(pfs_of_user_42)  # doctest: +SKIP
        >>> result.staypoints[["started_at", "finished_at"]]  # doctest: +SKIP
    """
    cfg = config or StaypointConfig()
    _validate(positionfixes)
    user_ids = positionfixes["user_id"].unique()
    if len(user_ids) > 1:
        raise ValueError(f"generate_staypoints works per user; got users {sorted(user_ids)[:5]}...")
    user_id = int(user_ids[0]) if len(user_ids) else -1

    t = to_ns(positionfixes["tracked_at"])
    lat = positionfixes["latitude"].to_numpy(np.float64)
    lon = positionfixes["longitude"].to_numpy(np.float64)
    elev = positionfixes["elevation"].to_numpy(np.float64)

    # trackintel: drop_duplicates() (keep first), then a stable sort by time.
    order = np.argsort(t, kind="stable")
    t, lat, lon, elev = t[order], lat[order], lon[order], elev[order]
    n_total = len(t)
    if cfg.exclude_duplicate_pfs:
        keep = _first_occurrences(t, lat, lon, elev)
        t, lat, lon, elev = t[keep], lat[keep], lon[keep], elev[keep]
    n_dup = n_total - len(t)

    from nextloc.preprocessing.staypoint_kernels import sliding  # numba: only for positionfixes

    starts, geom_ends, finishes = sliding(
        t,
        lon,
        lat,
        float(cfg.dist_threshold_m),
        int(round(cfg.time_threshold_min * _NS_PER_MIN)),
        int(round(cfg.gap_threshold_min * _NS_PER_MIN)),
        bool(cfg.include_last),
    )
    sp_lat, sp_lon = _centroids(lon, lat, starts, geom_ends)
    sp_elev = np.array(
        [np.median(elev[s:e]) for s, e in zip(starts, geom_ends, strict=True)], dtype=np.float64
    )

    staypoints = pd.DataFrame(
        {
            "user_id": np.full(len(starts), user_id, dtype=np.int32),
            "started_at": pd.to_datetime(t[starts], utc=True),
            "finished_at": pd.to_datetime(t[finishes], utc=True),
            "latitude": sp_lat,
            "longitude": sp_lon,
            "elevation": sp_elev,
            "n_pfs": (geom_ends - starts).astype(np.int32),
        }
    )
    tpl_lo, tpl_hi = _tripleg_bounds(t, lon, lat, starts, geom_ends, tripleg_gap_threshold_min)
    return UserStaypoints(
        user_id=user_id,
        staypoints=staypoints,
        tripleg_start=pd.Timestamp(tpl_lo, tz="UTC") if tpl_lo >= 0 else None,
        tripleg_end=pd.Timestamp(tpl_hi, tz="UTC") if tpl_lo >= 0 else None,
        n_pfs=len(t),
        n_duplicates=n_dup,
    )


def create_activity_flag(staypoints: pd.DataFrame, time_threshold_min: float = 25.0) -> pd.DataFrame:
    """Return a copy with ``is_activity`` = duration strictly above ``time_threshold_min`` minutes.

    Examples:
        >>> sp = create_activity_flag(sp, time_threshold_min=25)  # doctest: +SKIP
    """
    sp = staypoints.copy()
    sp["is_activity"] = activity_mask(to_ns(sp["started_at"]), to_ns(sp["finished_at"]), time_threshold_min)
    return sp


def activity_mask(started_ns: np.ndarray, finished_ns: np.ndarray, time_threshold_min: float) -> np.ndarray:
    """Which stays are activities: lasted strictly more than ``time_threshold_min`` minutes (UTC ns; a stay
    without a start or an end, NaT, is not one)."""
    start, end = np.asarray(started_ns, dtype=np.int64), np.asarray(finished_ns, dtype=np.int64)
    known = (start != NAT_NS) & (end != NAT_NS)
    return known & (end - start > pd.Timedelta(minutes=time_threshold_min).value)


def to_ns(times: pd.Series) -> np.ndarray:
    """Nanoseconds since the epoch (UTC) of a tz-aware datetime column (any unit, any zone)."""
    if not isinstance(times.dtype, pd.DatetimeTZDtype):
        raise TypeError(f"expected tz-aware times, got {times.dtype} (use tz_localize to localize them)")
    return times.to_numpy("datetime64[ns]").view(np.int64)


def _validate(positionfixes: pd.DataFrame) -> None:
    required = ["user_id", "tracked_at", "latitude", "longitude", "elevation"]
    missing = [c for c in required if c not in positionfixes.columns]
    if missing:
        raise ValueError(f"positionfixes lack required columns {missing}")
    tz = getattr(positionfixes["tracked_at"].dtype, "tz", None)
    if tz is None:
        raise ValueError("positionfixes 'tracked_at' must be timezone-aware (UTC)")


def _tripleg_bounds(
    t: np.ndarray, lon: np.ndarray, lat: np.ndarray, starts: np.ndarray, ends: np.ndarray, gap_min: float
) -> tuple[int, int]:
    """The first and last time of the user's triplegs (the fixes outside staypoints); -1 without one."""
    from nextloc.preprocessing.staypoint_kernels import tripleg_extent

    in_sp = np.zeros(len(t), dtype=np.bool_)
    for s, e in zip(starts, ends, strict=True):
        in_sp[s:e] = True
    return tripleg_extent(t, lon, lat, in_sp, int(round(gap_min * _NS_PER_MIN)))


def _first_occurrences(t: np.ndarray, lat: np.ndarray, lon: np.ndarray, elev: np.ndarray) -> np.ndarray:
    """Mask keeping the first of each exact duplicate; input is stably sorted by time."""
    from nextloc.preprocessing.staypoint_kernels import first_occurrences

    return first_occurrences(t, lat, lon, elev)


def _centroids(
    lon: np.ndarray, lat: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """trackintel's ``angle_centroid_multipoints(union_all(points))`` for every staypoint at once.

    ``union_all`` keeps unique points in (x, y) lexicographic order; ``np.bincount`` then sums them in
    that order. Doing exactly the same here gives bit-identical centroids.
    """
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    lengths = ends - starts
    sp_index = np.repeat(np.arange(len(starts)), lengths)
    point_index = (
        np.arange(lengths.sum())
        - np.repeat(np.cumsum(lengths) - lengths, lengths)
        + np.repeat(starts, lengths)
    )
    x, y = lon[point_index], lat[point_index]
    order = np.lexsort((y, x, sp_index))
    sp_index, x, y = sp_index[order], x[order], y[order]
    unique = np.ones(len(x), dtype=bool)
    unique[1:] = (sp_index[1:] != sp_index[:-1]) | (x[1:] != x[:-1]) | (y[1:] != y[:-1])
    sp_index, x, y = sp_index[unique], x[unique], y[unique]
    count = np.bincount(sp_index)
    mean_y = np.bincount(sp_index, weights=y) / count
    x_rad = np.deg2rad(x)
    x_sin = np.bincount(sp_index, weights=np.sin(x_rad)) / count
    x_cos = np.bincount(sp_index, weights=np.cos(x_rad)) / count
    mean_x = np.rad2deg(np.arctan2(x_sin, x_cos))
    return mean_y, mean_x
