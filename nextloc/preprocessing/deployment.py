"""Locations of the deployment protocol: only those that could be known before validation and test.

The reference protocol clusters every staypoint of every split at once, so whether a staypoint is a place,
or noise dropped from the data, depends on visits after it. Here (``protocol: deployment``):

1. Each user's train period is cut as the reference split cuts it (:func:`~nextloc.preprocessing.sequences.
   split_of_days`: the days of the user's activity staypoints, counted from the user's first day).
2. Dataset-level DBSCAN (the reference's, :func:`~nextloc.preprocessing.locations.generate_locations`,
   tiles included) runs on the train periods' staypoints alone; its noise stays, each staypoint a place of
   its own that no model knows.
3. Every later staypoint is the train location with the nearest centre (the mean of its train staypoints)
   within ``locations.match_radius_m`` metres (haversine, :func:`~nextloc.preprocessing.vocabulary.
   nearest_locations`): the rule and radius a live answer matches visits with, else a new place of its own.

A place of its own has a negative raw id (``-1 - row``), unique, so it never merges with another visit and
never enters the vocabulary (:func:`~nextloc.preprocessing.sequences.encode`): as a target it is a new place
(``1``), a miss for the place metrics and a positive for P(new place).
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from nextloc.config import PreprocessConfig
from nextloc.preprocessing.locations import MapFn, generate_locations
from nextloc.preprocessing.sequences import FIRST_PLACE, WallTimes, split_of_days
from nextloc.preprocessing.staypoints import to_ns
from nextloc.preprocessing.vocabulary import location_centres, nearest_locations

logger = logging.getLogger(__name__)


def period_splits(staypoints: pd.DataFrame, config: PreprocessConfig) -> np.ndarray:
    """Each staypoint's split by the reference's day cut-off, on these staypoints (``user_id``,
    ``started_at``, ``finished_at``): day indices from the user's first start date in ``config.timezone``."""
    wall = WallTimes.of(to_ns(staypoints["started_at"]), to_ns(staypoints["finished_at"]), config.timezone)
    user = staypoints["user_id"].to_numpy()
    first = pd.Series(wall.start_date).groupby(user).transform("min").to_numpy()
    return split_of_days(user, wall.start_date - first, config.split)


def deployment_locations(
    staypoints: pd.DataFrame,
    config: PreprocessConfig,
    dbscan_tiles: int = 0,
    map_fn: MapFn | None = None,
) -> pd.DataFrame:
    """Locations fitted on the train periods, later staypoints matched to them (see the module docstring).

    Args:
        staypoints: the quality-filtered users' activity staypoints, sorted by user then start.
        config: the preprocessing configuration (``split``, ``locations``, ``timezone``).
        dbscan_tiles: DBSCAN by this many spatial tiles (0: one machine).
        map_fn: runs the tiles.

    Returns:
        A copy with ``split`` (the period each staypoint is in), ``location_id`` (int64: a DBSCAN id, or a
        negative id of its own for a place no train location holds) and ``fitted`` (True for the train
        periods' staypoints DBSCAN ran on).
    """
    sp = staypoints.reset_index(drop=True)
    sp = sp.assign(split=period_splits(sp, config))
    fitted = (sp["split"] == "train").to_numpy()
    labels = np.full(len(sp), -1, dtype=np.int64)
    train = generate_locations(sp[fitted], config.locations, dbscan_tiles, map_fn)
    labels[fitted] = train["location_id"].fillna(-1).to_numpy(np.int64)
    centres = location_centres(train[train["location_id"].notna()].astype({"location_id": np.int64}))
    vocabulary = pd.DataFrame(
        {
            "loc_index": centres.index.to_numpy(np.int64) + FIRST_PLACE,
            "latitude": centres["latitude"].to_numpy(np.float64),
            "longitude": centres["longitude"].to_numpy(np.float64),
        }
    )
    later = ~fitted
    matched = nearest_locations(
        sp["latitude"].to_numpy(np.float64)[later],
        sp["longitude"].to_numpy(np.float64)[later],
        vocabulary,
        config.locations.match_radius_m,
    )
    labels[later] = np.where(matched >= FIRST_PLACE, matched - FIRST_PLACE, -1)
    own = labels < 0
    labels[own] = -1 - np.flatnonzero(own)
    logger.info(
        "deployment locations: %d train-period staypoints -> %d locations (%d noise); %d later, %d matched",
        int(fitted.sum()),
        len(centres),
        int((own & fitted).sum()),
        int(later.sum()),
        int((matched >= FIRST_PLACE).sum()),
    )
    return sp.assign(location_id=labels, fitted=fitted)
