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
the extent of the (valid) triplegs; that is what :func:`nextloc.preprocessing.staypoints.generate_staypoints` reports.
"""

from __future__ import annotations

import logging

import numpy as np
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


def window_quality(records: pd.DataFrame, extents: pd.DataFrame, window_weeks: int = 10) -> pd.DataFrame:
    """Per-user tracking quality of the reference's sliding windows (``_get_tracking_quality``).

    Window ``i`` of a user covers ``[midnight before the first record + i weeks, + window_weeks weeks)``
    for ``i in range(days // 7 - window_weeks + 1)``; its quality is the tracked time inside it over its
    length. The reference cuts records at midnight and counts the pieces that lie fully inside a window;
    windows start at midnight, so that equals clipping each record to the window. Empty windows are
    skipped, as in the reference.

    Args:
        records: ``user_id``, ``started_at``, ``finished_at`` of the tracked time (staypoints or visits).
        extents: the users to score with ``started_at`` and ``days`` (from :func:`filter_users_by_quality`).
        window_weeks: the window length in weeks.

    Returns:
        ``user_id``, ``min_quality``, ``mean_quality`` (NaN for a user without a non-empty window).
    """
    rows = []
    window = pd.Timedelta(weeks=window_weeks)
    by_user = {u: g for u, g in records.groupby("user_id")}
    for ext in extents.itertuples(index=False):
        recs = by_user.get(ext.user_id)
        qualities = []
        if recs is not None:
            start0 = ext.started_at.floor("D")
            s = recs["started_at"].to_numpy("datetime64[ns]")
            f = recs["finished_at"].to_numpy("datetime64[ns]")
            for i in range(int(ext.days) // 7 - window_weeks + 1):
                lo = (start0 + pd.Timedelta(weeks=i)).tz_localize(None).to_datetime64()
                hi = lo + window.to_timedelta64()
                covered = (np.minimum(f, hi) - np.maximum(s, lo)).astype(np.int64)
                total = covered[covered > 0].sum()
                if total > 0:
                    qualities.append(total / window.value)
        rows.append(
            {
                "user_id": ext.user_id,
                "min_quality": min(qualities) if qualities else np.nan,
                "mean_quality": float(np.mean(qualities)) if qualities else np.nan,
            }
        )
    return pd.DataFrame(rows, columns=["user_id", "min_quality", "mean_quality"])


def apply_quality_thresholds(
    kept: pd.DataFrame, records: pd.DataFrame, config: QualityConfig
) -> pd.DataFrame:
    """Keep the users whose window quality passes ``min_thres`` / ``mean_thres`` (a no-op when both are off)."""
    if config.min_thres is None and config.mean_thres is None:
        return kept
    q = window_quality(records, kept, config.window_weeks)
    keep = q["min_quality"].notna()
    if config.min_thres is not None:
        keep &= q["min_quality"] > config.min_thres
    if config.mean_thres is not None:
        keep &= q["mean_quality"] > config.mean_thres
    out = kept[kept["user_id"].isin(q.loc[keep, "user_id"])].reset_index(drop=True)
    logger.info("quality thresholds: %d of %d users kept", len(out), len(kept))
    return out


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
    both = pd.concat([part for part in (sp, tpl) if len(part)] or [sp])  # visits input has no triplegs
    out = both.groupby(level=0).agg(started_at=("started_at", "min"), finished_at=("finished_at", "max"))
    out.index.name = "user_id"
    return out.reset_index().sort_values("user_id", ignore_index=True)
