"""Dataset-level steps of the reference protocol, chained: quality filter -> locations -> samples.

Each step is its own pure function (``filter_users_by_quality``, ``generate_locations``,
``merge_staypoints``, ``add_time_features``, ``assign_split``, ``valid_targets``,
``filter_users_with_targets``, ``encode``, ``build_samples``); this module only wires them in the
reference order and gathers the statistics that ``metadata.json`` reports.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from nextloc.config import PreprocessConfig
from nextloc.preprocessing.deployment import deployment_locations
from nextloc.preprocessing.locations import MapFn, generate_locations, merge_staypoints
from nextloc.preprocessing.quality import apply_quality_thresholds, filter_users_by_quality, user_extents
from nextloc.preprocessing.sequences import (
    SPLITS,
    add_time_features,
    assign_split,
    build_samples,
    encode,
    filter_users_with_targets,
    valid_targets,
)
from nextloc.preprocessing.staypoints import create_activity_flag

logger = logging.getLogger(__name__)

STAYPOINTS_OUTPUT_COLUMNS = [
    "id",
    "user_id",
    "user",
    "location_id",
    "raw_location_id",
    "started_at",
    "finished_at",
    "start_day",
    "end_day",
    "start_min",
    "end_min",
    "duration",
    "weekday",
    "split",
    "is_target",
    "latitude",
    "longitude",
]


@dataclass
class LocatedStaypoints:
    """Activity staypoints of the quality-filtered users with their DBSCAN location (noise dropped)."""

    staypoints: pd.DataFrame
    stats: dict[str, int] = field(default_factory=dict)


@dataclass
class Dataset:
    """The final staypoints, the samples per split, and the numbers ``metadata.json`` reports."""

    staypoints: pd.DataFrame
    samples: dict[str, pa.Table]
    stats: dict


def locate_staypoints(
    staypoints: pd.DataFrame,
    tripleg_extents: pd.DataFrame,
    config: PreprocessConfig,
    dbscan_tiles: int = 0,
    map_fn: MapFn | None = None,
) -> LocatedStaypoints:
    """Reference steps 3-7: activity flag, user quality filter, dataset-level DBSCAN, drop noise.

    Under ``config.protocol == "deployment"`` the locations are those of the train periods and nothing is
    dropped (:func:`nextloc.preprocessing.deployment.deployment_locations`).

    Args:
        staypoints: all users' staypoints (``user_id``, ``started_at``, ``finished_at``, ``latitude``,
            ``longitude``) sorted by user then start.
        tripleg_extents: per user ``tripleg_start`` / ``tripleg_end`` (NaT when none).
        config: the preprocessing configuration.
        dbscan_tiles: 0 runs DBSCAN on one machine; ``n > 0`` by ``n`` spatial tiles (same labels;
            :func:`nextloc.preprocessing.locations.partitioned_dbscan`).
        map_fn: runs the tiles (default: the builtin ``map``).

    Returns:
        The located staypoints and counts for each step.
    """
    sp = create_activity_flag(staypoints, config.staypoints.activity_time_threshold_min)
    extents = user_extents(sp, tripleg_extents)
    kept = filter_users_by_quality(extents, config.quality)
    kept = apply_quality_thresholds(kept, staypoints, config.quality)
    sp = sp[sp["user_id"].isin(kept["user_id"]) & sp["is_activity"]].reset_index(drop=True)
    n_activity = len(sp)
    if config.protocol == "deployment":
        sp = deployment_locations(sp, config, dbscan_tiles, map_fn)
    else:
        sp = generate_locations(sp, config.locations, dbscan_tiles, map_fn)
        sp = sp[sp["location_id"].notna()].reset_index(drop=True)
    stats = {
        "users_read": int(staypoints["user_id"].nunique()),
        "users_quality": int(len(kept)),
        "staypoints_activity": n_activity,
        "staypoints_located": int(len(sp)),
        "locations": int(sp["location_id"].nunique()),
    }
    if config.protocol == "deployment":
        known = sp["location_id"].to_numpy() >= 0
        stats["locations"] = int(sp.loc[known, "location_id"].nunique())
        stats["staypoints_new_place"] = int((~known).sum())
    logger.info("located staypoints: %s", stats)
    return LocatedStaypoints(sp, stats)


def build_dataset(located: pd.DataFrame, config: PreprocessConfig) -> Dataset:
    """Reference steps 8-18: merge, time features, split, valid targets, user filter, encodings, samples.

    Under ``config.protocol == "deployment"`` each staypoint keeps the period its location was decided in
    (``located``'s ``split``; a merged one its first staypoint's), and a sample's window counts from now
    (:func:`nextloc.preprocessing.sequences.question_days`).

    Args:
        located: output of :func:`locate_staypoints`.
        config: the preprocessing configuration.

    Returns:
        The final staypoints (kept users only, one row per merged staypoint), samples per split and stats.
    """
    # a merged staypoint keeps its first staypoint's coordinates (trackintel's agg={"geom": "first"})
    deployment = config.protocol == "deployment"
    columns = ["user_id", "started_at", "finished_at", "location_id", "latitude", "longitude"]
    if deployment:
        columns.append("split")  # the period each staypoint's location was decided in
    merged = merge_staypoints(located[columns], config.locations.merge_max_gap_min)
    merged["location_id"] = merged["location_id"].astype(np.int64)
    sp = add_time_features(merged, config.timezone)
    sp = sp if deployment else assign_split(sp, config.split)
    valid = valid_targets(sp, config.samples, config.protocol)
    n_users_merged = int(sp["user_id"].nunique())
    sp = sp.assign(is_target=valid)
    sp = filter_users_with_targets(sp, sp["is_target"].to_numpy())
    if sp.empty:
        raise ValueError(
            f"no user has a valid target in every split ({n_users_merged} users after merging): the data is too "
            "small or too sparse for samples.previous_days/min_history and the split ratios"
        )
    sp, sizes = encode(sp, config.samples.duration_cap_min)
    samples = build_samples(sp, sp["is_target"].to_numpy(), config.samples.previous_days, config.protocol)

    by_split = {s: sp[sp["split"] == s] for s in SPLITS}
    max_hist = max(
        (int(np.max(t.column("hist_len").to_numpy())) if t.num_rows else 0) for t in samples.values()
    )
    stats = {
        "n_staypoints_merged": int(len(merged)),
        "n_users_merged": n_users_merged,
        "n_valid_targets_before_user_filter": int(valid.sum()),
        "n_users": {s: int(by_split[s]["user_id"].nunique()) for s in SPLITS},
        "n_staypoints": {s: int(len(by_split[s])) for s in SPLITS},
        "n_samples": {s: int(samples[s].num_rows) for s in SPLITS},
        "n_unseen_targets": {s: int((samples[s].column("target_loc").to_numpy() == 1).sum()) for s in SPLITS},
        "max_hist_len": max_hist,
        **sizes,
    }
    logger.info("dataset: %s", stats)
    return Dataset(sp[STAYPOINTS_OUTPUT_COLUMNS].reset_index(drop=True), samples, stats)
