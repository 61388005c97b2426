"""Dataset-level DBSCAN locations and staypoint merging (trackintel semantics)."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
from sklearn.cluster import DBSCAN

from nextloc.config import LocationConfig
from nextloc.staypoints import EARTH_RADIUS_M, to_ns

logger = logging.getLogger(__name__)


def generate_locations(staypoints: pd.DataFrame, config: LocationConfig | None = None) -> pd.DataFrame:
    """Cluster all users' staypoints jointly into locations with haversine DBSCAN.

    Reproduces trackintel ``generate_locations(method="dbscan", distance_metric="haversine",
    agg_level="dataset")``: ``DBSCAN(eps=epsilon_m / 6371000, min_samples, algorithm="ball_tree",
    metric="haversine")`` fitted on the staypoints in the given order. With the reference
    ``coordinate_order="lon_lat"`` the radians are fed as ``[lon, lat]`` (sklearn expects ``[lat, lon]``),
    so the radius is really about 45 m north-south and 15 m east-west in Beijing.

    Args:
        staypoints: ``latitude`` and ``longitude`` columns (degrees), ordered by user then start time.
        config: ``epsilon_m``, ``min_samples`` and ``coordinate_order``.

    Returns:
        A copy with ``location_id`` (nullable Int64; ``<NA>`` marks noise).

    Examples:
        >>> sp = generate_locations(sp, LocationConfig(epsilon_m=20, min_samples=2))  # doctest: +SKIP
    """
    cfg = config or LocationConfig()
    sp = staypoints.copy()
    if len(sp) == 0:
        sp["location_id"] = pd.array([], dtype="Int64")
        return sp
    lat = sp["latitude"].to_numpy(np.float64)
    lon = sp["longitude"].to_numpy(np.float64)
    coords = np.column_stack([lon, lat] if cfg.coordinate_order == "lon_lat" else [lat, lon])
    db = DBSCAN(
        eps=cfg.epsilon_m / EARTH_RADIUS_M,
        min_samples=cfg.min_samples,
        algorithm="ball_tree",
        metric="haversine",
    )
    labels = db.fit_predict(np.deg2rad(coords))
    sp["location_id"] = pd.array(np.where(labels < 0, pd.NA, labels), dtype="Int64")
    logger.info(
        "DBSCAN: %d staypoints -> %d locations, %d noise", len(sp), labels.max() + 1, int((labels < 0).sum())
    )
    return sp


def merge_staypoints(staypoints: pd.DataFrame, max_time_gap_min: float = 1.0) -> pd.DataFrame:
    """Merge consecutive staypoints of a user at the same location separated by at most a small gap.

    trackintel ``merge_staypoints(triplegs=<empty>, max_time_gap, agg={"location_id": "first"})``: rows
    sorted by (user, start); row *i* joins row *i+1* when both have the same user and location and
    ``started_at[i+1] - finished_at[i] <= max_time_gap``; chains merge into one row with the first start,
    the last end and the first location.

    Args:
        staypoints: ``user_id``, ``started_at``, ``finished_at``, ``location_id`` (no noise rows).
        max_time_gap_min: the gap in minutes.

    Returns:
        The merged staypoints (columns of the first row of each run, ``finished_at`` of the last), sorted.
    """
    sp = staypoints.sort_values(["user_id", "started_at"], kind="stable").reset_index(drop=True)
    if len(sp) == 0:
        return sp
    user = sp["user_id"].to_numpy()
    loc = sp["location_id"].to_numpy()
    gap_ns = to_ns(sp["started_at"])[1:] - to_ns(sp["finished_at"])[:-1]
    joins_next = (user[1:] == user[:-1]) & (loc[1:] == loc[:-1]) & (gap_ns <= round(max_time_gap_min * 60e9))
    run_id = np.concatenate([[0], np.cumsum(~joins_next)])
    last_of_run = np.r_[run_id[1:] != run_id[:-1], True]
    first_of_run = np.r_[True, run_id[1:] != run_id[:-1]]
    merged = sp.loc[first_of_run].reset_index(drop=True)
    merged["finished_at"] = sp.loc[last_of_run, "finished_at"].to_numpy()
    logger.info("merge: %d -> %d staypoints", len(sp), len(merged))
    return merged
