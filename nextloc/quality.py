"""User tracking-quality filter of the reference protocol.

The reference (``calculate_user_quality``) concatenates every staypoint and trip of a user, cuts them at
midnight, and keeps a user if

1. ``days = (max finished_at - min started_at).days > day_filter`` (50), and
2. the user yields at least one 10-week sliding window (``_get_tracking_quality``): windows are
   ``range(0, days // 7 - window_weeks + 1)``, so a span under 70 days yields none and the user is dropped
   silently. The first window starts at the midnight before the first record and always contains that
   record's first day piece, so any user with a window has a non-empty one.

GeoLife's configuration sets no minimum or mean quality threshold, so the outcome depends only on each
user's overall time extent. Trips are unions of triplegs between activity staypoints, so their extent is
the extent of the (valid) triplegs; that is what :func:`nextloc.staypoints.generate_staypoints` reports.
"""

from __future__ import annotations

import logging

import pandas as pd

from nextloc.config import QualityConfig

logger = logging.getLogger(__name__)


def filter_users_by_quality(user_extents: pd.DataFrame, config: QualityConfig | None = None) -> pd.DataFrame:
    """Apply the reference day filter and 10-week-window rule to per-user tracking extents.

    Args:
        user_extents: one row per user with ``user_id``, ``started_at`` and ``finished_at``: the earliest
            start and latest end over the user's staypoints and triplegs (tz-aware).
        config: ``day_filter`` and ``window_weeks``.

    Returns:
        The rows of the users kept, with their ``days`` and ``weeks`` columns added.

    Examples:
        >>> kept = filter_users_by_quality(extents)  # doctest: +SKIP
    """
    cfg = config or QualityConfig()
    missing = {"user_id", "started_at", "finished_at"} - set(user_extents.columns)
    if missing:
        raise ValueError(f"user_extents lacks columns {sorted(missing)}")
    ext = user_extents.copy()
    ext["days"] = (ext["finished_at"] - ext["started_at"]).dt.days
    ext["weeks"] = ext["days"] // 7
    keep = (ext["days"] > cfg.day_filter) & (ext["weeks"] - cfg.window_weeks + 1 >= 1)
    kept = ext.loc[keep].reset_index(drop=True)
    logger.info("quality filter: %d of %d users kept", len(kept), len(ext))
    return kept


def user_extents(staypoints: pd.DataFrame, tripleg_extents: pd.DataFrame) -> pd.DataFrame:
    """Earliest start / latest end per user over staypoints and triplegs.

    Args:
        staypoints: ``user_id``, ``started_at``, ``finished_at``.
        tripleg_extents: ``user_id``, ``tripleg_start``, ``tripleg_end`` (NaT where a user has none).

    Returns:
        One row per user that has a staypoint or a tripleg, sorted by ``user_id``.
    """
    sp = staypoints.groupby("user_id").agg(
        started_at=("started_at", "min"), finished_at=("finished_at", "max")
    )
    tpl = tripleg_extents.dropna(subset=["tripleg_start"]).set_index("user_id")
    tpl = tpl.rename(columns={"tripleg_start": "started_at", "tripleg_end": "finished_at"})[
        ["started_at", "finished_at"]
    ]
    both = pd.concat([sp, tpl])
    out = both.groupby(level=0).agg(started_at=("started_at", "min"), finished_at=("finished_at", "max"))
    out.index.name = "user_id"
    return out.reset_index().sort_values("user_id", ignore_index=True)
