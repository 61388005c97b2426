"""From merged staypoints to 7-day history samples (reference steps 9-18), vectorised.

The reference builds both the valid-target list and the samples with an O(n^2) ``iterrows`` loop. Rows of a
(user, split) group are sorted by ``start_day``, so the history window of row ``i`` is the index range
``[searchsorted(start_day, start_day[i] - previous_days), i)``; everything here is array arithmetic on that.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from nextloc.config import Protocol, SampleConfig, SplitConfig
from nextloc.preprocessing.staypoints import to_ns

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
# Location encoding: 0 pads, 1 is a location not seen in the train split, known places are 2, 3, ...
PAD, UNSEEN, FIRST_PLACE = 0, 1, 2

HISTORY_FIELDS = {
    "loc_hist": "location_id",
    "user_hist": "user",
    "weekday_hist": "weekday",
    "start_min_hist": "start_min",
    "duration_hist": "duration_capped",
}


MINUTE_NS = 60_000_000_000
DAY_NS = 1440 * MINUTE_NS
EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday (Monday = 0)


def wall_clock_ns(utc_ns: np.ndarray, timezone: str = "UTC") -> np.ndarray:
    """UTC nanoseconds since the epoch as wall-clock nanoseconds in ``timezone`` (int64): the one conversion
    behind every wall-clock feature (minute of the day, weekday, local day)."""
    ns = np.asarray(utc_ns, dtype=np.int64)
    if timezone == "UTC":
        return ns
    local = pd.DatetimeIndex(ns.view("datetime64[ns]")).tz_localize("UTC").tz_convert(timezone)
    return local.tz_localize(None).asi8


@dataclass(frozen=True)
class WallTimes:
    """A visit's wall-clock features in a timezone, from its UTC start and end (int64 arrays).

    ``start_date``/``end_date``: days since 1970-01-01 of the wall-clock dates; ``start_min``/``end_min``:
    minutes of the day (``end_min`` 0 is 1440); ``weekday``: Mon=0; ``duration``: whole minutes, floored.
    """

    start_date: np.ndarray
    end_date: np.ndarray
    start_min: np.ndarray
    end_min: np.ndarray
    weekday: np.ndarray
    duration: np.ndarray

    @classmethod
    def of(cls, started_ns: np.ndarray, finished_ns: np.ndarray, timezone: str = "UTC") -> WallTimes:
        start = wall_clock_ns(started_ns, timezone)
        end = wall_clock_ns(finished_ns, timezone)
        end_min = end // MINUTE_NS % 1440
        seconds = (np.asarray(finished_ns, dtype=np.int64) - np.asarray(started_ns, dtype=np.int64)) / 1e9
        return cls(
            start_date=start // DAY_NS,
            end_date=end // DAY_NS,
            start_min=start // MINUTE_NS % 1440,
            end_min=np.where(end_min != 0, end_min, 1440),
            weekday=(start // DAY_NS + EPOCH_WEEKDAY) % 7,
            duration=(seconds // 60).astype(np.int64),  # as pandas' total_seconds() // 60
        )


def add_time_features(staypoints: pd.DataFrame, timezone: str = "UTC") -> pd.DataFrame:
    """Reference ``enrich_time_info``: day indices, minutes of day, weekday, and a new sorted ``id``.

    Wall-clock values are taken in ``timezone`` (the reference uses UTC, :class:`WallTimes`).
    ``start_day``/``end_day`` count days from the date of the user's first staypoint; ``end_min`` 0 becomes
    1440; ``weekday`` is Mon=0. ``duration`` is whole minutes, floored, before any cap.

    Args:
        staypoints: merged staypoints with ``user_id``, ``started_at``, ``finished_at`` (tz-aware).
        timezone: IANA zone for the wall-clock features.

    Returns:
        A new frame sorted by (user_id, start_day, start_min) with ``id`` = 0..N-1.

    Examples:
        >>> sp = add_time_features(merged, timezone="UTC")  # doctest: +SKIP
    """
    sp = staypoints.copy()
    wall = WallTimes.of(to_ns(sp["started_at"]), to_ns(sp["finished_at"]), timezone)
    first_date = pd.Series(wall.start_date).groupby(sp["user_id"].to_numpy()).transform("min").to_numpy()
    sp["duration"] = wall.duration
    sp["start_day"] = wall.start_date - first_date
    sp["end_day"] = wall.end_date - first_date
    sp["start_min"] = wall.start_min
    sp["end_min"] = wall.end_min
    sp["weekday"] = wall.weekday
    sp = sp.sort_values(["user_id", "start_day", "start_min"], kind="stable").reset_index(drop=True)
    sp.insert(0, "id", np.arange(len(sp), dtype=np.int64))
    return sp


def assign_split(staypoints: pd.DataFrame, config: SplitConfig | None = None) -> pd.DataFrame:
    """Per-user chronological split by day index: train < 0.6*maxDay <= val < 0.8*maxDay <= test.

    Returns a copy with a categorical-like string column ``split`` in {"train", "val", "test"}.
    """
    sp = staypoints.copy()
    sp["split"] = split_of_days(sp["user_id"].to_numpy(), sp["start_day"].to_numpy(), config)
    return sp


def split_of_days(
    user_id: np.ndarray, start_day: np.ndarray, config: SplitConfig | None = None
) -> np.ndarray:
    """:func:`assign_split`'s rule on arrays: each row's split from its start day and its user's last one."""
    cfg = config or SplitConfig()
    max_day = pd.Series(start_day).groupby(np.asarray(user_id)).transform("max").to_numpy(np.float64)
    day = np.asarray(start_day)
    train_end = max_day * cfg.train
    val_end = max_day * (cfg.train + cfg.val)
    return np.where(day < train_end, "train", np.where(day < val_end, "val", "test"))


def question_days(staypoints: pd.DataFrame, protocol: Protocol = "reference") -> np.ndarray:
    """The day each row's question is asked on, which its history window and ``diff_hist`` count from.

    ``reference``: the row's own start day (the target's day, as the reference samples have it);
    ``deployment``: now, leaving the visit before it, i.e. that visit's end day (what a live answer counts
    from, :mod:`nextloc.predict.histories`). A (user, split) group's first row has no history: its own day.
    """
    day = staypoints["start_day"].to_numpy(np.int64)
    if protocol == "reference":
        return day
    group = _group_ids(staypoints)
    end = staypoints["end_day"].to_numpy(np.int64)
    first = np.r_[True, group[1:] != group[:-1]] if len(group) else np.zeros(0, bool)
    return np.where(first, day, np.r_[day[:1], end[:-1]])


def history_windows(
    staypoints: pd.DataFrame, previous_days: int = 7, protocol: Protocol = "reference"
) -> tuple[np.ndarray, np.ndarray]:
    """For each row, the start of its history window and its question day's offset within its (user, split)
    group.

    Rows must be sorted by (user_id, start_day, start_min) and carry ``split``. The history of row ``i``
    is the rows ``[lo[i], i)``: same user, same split, earlier in order, ``start_day >= q_i - previous_days``
    where ``q_i`` is the question's day (:func:`question_days`).

    Returns:
        ``(lo, diff_day)`` arrays aligned with the rows (``diff_day``: the question day minus the group's
        first start day).
    """
    group = _group_ids(staypoints)
    day = staypoints["start_day"].to_numpy(np.int64)
    asked = question_days(staypoints, protocol)
    # key is monotone within a group and groups are contiguous: offset each group far apart
    span = int(max(day.max(), asked.max()) - day.min() + previous_days + 2) if len(day) else 1
    key = group * span + (day - (day.min() if len(day) else 0))
    asked_key = group * span + (asked - (day.min() if len(day) else 0))
    lo = np.searchsorted(key, asked_key - previous_days, side="left")
    group_start = np.searchsorted(group, group, side="left")
    lo = np.minimum(np.maximum(lo, group_start), np.arange(len(day)))
    diff_day = asked - day[group_start]
    return lo, diff_day


def valid_targets(
    staypoints: pd.DataFrame, config: SampleConfig | None = None, protocol: Protocol = "reference"
) -> np.ndarray:
    """Reference ``get_valid_sequence``: boolean mask of rows that can be prediction targets.

    A row is valid if its question day lies at least ``previous_days`` after the first day of its
    (user, split) group and it has at least ``min_history`` history rows in its window
    (:func:`history_windows`; under ``deployment`` both are decided at now, without the target).
    """
    cfg = config or SampleConfig()
    lo, diff_day = history_windows(staypoints, cfg.previous_days, protocol)
    n_hist = np.arange(len(staypoints)) - lo
    return (diff_day >= cfg.previous_days) & (n_hist >= cfg.min_history)


def filter_users_with_targets(staypoints: pd.DataFrame, valid: np.ndarray) -> pd.DataFrame:
    """Keep users with at least one valid target in each of train, val and test."""
    per_split = pd.DataFrame({"user_id": staypoints["user_id"], "split": staypoints["split"], "valid": valid})
    counts = per_split[per_split["valid"]].groupby("user_id")["split"].nunique()
    keep = counts[counts == len(SPLITS)].index
    out = staypoints[staypoints["user_id"].isin(keep)].reset_index(drop=True)
    logger.info(
        "user filter: %d of %d users have targets in every split", len(keep), staypoints["user_id"].nunique()
    )
    return out


def encode(staypoints: pd.DataFrame, duration_cap_min: int = 2879) -> tuple[pd.DataFrame, dict[str, int]]:
    """Encode locations (0 pad, 1 unseen, 2.. train vocabulary) and users (1..U); cap durations.

    The location vocabulary is fit on the train split of all kept users (sorted raw ids, like sklearn's
    ``OrdinalEncoder``); val/test locations absent from train become 1, and so does every negative raw id
    (a place the deployment protocol's locations do not know, :mod:`nextloc.preprocessing.deployment`).

    Returns:
        The encoded copy (``location_id`` replaced, raw id kept as ``raw_location_id``; ``user`` added;
        ``duration_capped`` added) and vocabulary sizes ``total_loc_num`` / ``total_user_num``.
    """
    sp = staypoints.copy()
    raw = sp["location_id"].to_numpy(np.int64)
    vocab = np.unique(raw[(sp["split"] == "train").to_numpy() & (raw >= 0)])
    pos = np.searchsorted(vocab, raw)
    pos_clipped = np.minimum(pos, len(vocab) - 1)
    known = (pos < len(vocab)) & (vocab[pos_clipped] == raw)
    sp["raw_location_id"] = raw
    sp["location_id"] = np.where(known, pos_clipped + FIRST_PLACE, UNSEEN).astype(np.int64)
    users = np.unique(sp["user_id"].to_numpy())
    sp["user"] = (np.searchsorted(users, sp["user_id"].to_numpy()) + 1).astype(np.int64)
    sp["duration_capped"] = np.minimum(sp["duration"].to_numpy(np.int64), duration_cap_min)
    sizes = {
        "total_loc_num": int(len(vocab) + 2),
        "total_user_num": int(len(users) + 1),
        "n_train_locations": int(len(vocab)),
    }
    return sp, sizes


@dataclass(frozen=True)
class Samples:
    """Samples of one split as an Arrow table (one row per target)."""

    split: str
    table: pa.Table


def build_samples(
    staypoints: pd.DataFrame, valid: np.ndarray, previous_days: int = 7, protocol: Protocol = "reference"
) -> dict[str, pa.Table]:
    """One sample per valid target: its history window as list columns, its location and time features.

    Args:
        staypoints: encoded staypoints sorted by (user_id, start_day, start_min), with ``split``.
        valid: mask from :func:`valid_targets`, aligned with ``staypoints``.
        previous_days: the history window (must match the one ``valid`` was computed with).
        protocol: which day the window and ``diff_hist`` count from (:func:`question_days`).

    Returns:
        ``{"train": table, "val": table, "test": table}``; columns: ``staypoint_id``, ``user_id`` (raw),
        ``user``, ``loc_hist``, ``user_hist``, ``weekday_hist``, ``start_min_hist``, ``duration_hist``
        (capped minutes), ``diff_hist`` (question day minus history day, 0..previous_days), ``target_loc``,
        ``target_weekday``, ``target_start_min``, ``target_day``, ``hist_len``.
    """
    lo, diff_day = history_windows(staypoints, previous_days, protocol)
    group, day = _group_ids(staypoints), staypoints["start_day"].to_numpy(np.int64)
    start_day = day - day[np.searchsorted(group, group, side="left")]  # each history day's offset
    idx = np.flatnonzero(valid)
    split = staypoints["split"].to_numpy()
    out: dict[str, pa.Table] = {}
    for name in SPLITS:
        rows = idx[split[idx] == name]
        starts, ends = lo[rows], rows
        lengths = ends - starts
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        hist = _ranges(starts, lengths)
        cols: dict[str, pa.Array] = {
            "staypoint_id": pa.array(staypoints["id"].to_numpy(np.int64)[rows]),
            "user_id": pa.array(staypoints["user_id"].to_numpy(np.int32)[rows]),
            "user": pa.array(staypoints["user"].to_numpy(np.int32)[rows]),
        }
        for col, source in HISTORY_FIELDS.items():
            values = staypoints[source].to_numpy(np.int32)[hist]
            cols[col] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        diff = (np.repeat(diff_day[rows], lengths) - start_day[hist]).astype(np.int32)
        cols["diff_hist"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(diff))
        cols["target_loc"] = pa.array(staypoints["location_id"].to_numpy(np.int32)[rows])
        cols["target_weekday"] = pa.array(staypoints["weekday"].to_numpy(np.int32)[rows])
        cols["target_start_min"] = pa.array(staypoints["start_min"].to_numpy(np.int32)[rows])
        cols["target_day"] = pa.array(staypoints["start_day"].to_numpy(np.int32)[rows])
        cols["hist_len"] = pa.array(lengths.astype(np.int32))
        out[name] = pa.table(cols)
    return out


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``range(s, s + n)`` for each (s, n), without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    seg_start = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) - np.repeat(seg_start - starts, lengths)


def _group_ids(staypoints: pd.DataFrame) -> np.ndarray:
    """Contiguous id per (user, split) run; rows of a group must be contiguous (they are, once sorted)."""
    user = staypoints["user_id"].to_numpy()
    split = staypoints["split"].to_numpy()
    if len(user) == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.r_[True, (user[1:] != user[:-1]) | (split[1:] != split[:-1])]
    return np.cumsum(change) - 1
