"""The visit log the routine counts, the questions asked of it, and each question's window of visits.

A :class:`VisitLog` holds every visit (a final staypoint) sorted by (user, start), in wall-clock minutes of
the dataset's timezone, with its coordinates when they are known. A :class:`Queries` row is the question
"where does ``user`` go next, leaving ``current`` at ``now``?"; :func:`queries_for_targets` asks it of each
evaluation target, :func:`queries_after_last` of a request. :func:`window_places` gives each question's 7-day
window of places anchored at ``now`` (the window an answer reads, :mod:`nextloc.predict.histories`), not at
the target's day as the reference samples' window is (:mod:`nextloc.preprocessing.sequences`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from nextloc.preprocessing.sequences import PAD, wall_clock_ns
from nextloc.preprocessing.staypoints import to_ns

MINUTES_PER_DAY = 1440


@dataclass(frozen=True)
class VisitLog:
    """Every visit, one row each, sorted by (user, start); times are wall-clock minutes since 1970-01-01.

    Wall clock means in the dataset's timezone, the one its samples' ``start_min`` and ``weekday`` use, so
    ``start % 1440`` is the minute of the day. ``latitude``/``longitude``: each visit's coordinates (None:
    not known; the places' centres then come from elsewhere or are unknown).
    """

    user: np.ndarray  # int64 encoded user
    start: np.ndarray  # int64
    end: np.ndarray  # int64
    place: np.ndarray  # int64 encoded location (1 outside the train vocabulary, 2.. known)
    raw_place: np.ndarray  # int64 dataset-level location id
    staypoint: np.ndarray  # int64 staypoint id
    latitude: np.ndarray | None = None  # float64
    longitude: np.ndarray | None = None  # float64

    @classmethod
    def from_staypoints(cls, staypoints: pd.DataFrame, timezone: str = "UTC") -> VisitLog:
        """From ``staypoints.parquet``'s columns ``id``, ``user``, ``location_id``, ``raw_location_id``,
        ``started_at``, ``finished_at`` (tz-aware), and ``latitude``/``longitude`` when it has them."""
        located = {"latitude", "longitude"} <= set(staypoints.columns)
        return cls.of(
            staypoints["user"].to_numpy(np.int64),
            to_ns(staypoints["started_at"]),
            to_ns(staypoints["finished_at"]),
            staypoints["location_id"].to_numpy(np.int64),
            staypoints["raw_location_id"].to_numpy(np.int64),
            staypoints["id"].to_numpy(np.int64),
            timezone,
            staypoints[["latitude", "longitude"]].to_numpy(np.float64) if located else None,
        )

    @classmethod
    def of(
        cls,
        user: np.ndarray,
        started_ns: np.ndarray,
        finished_ns: np.ndarray,
        place: np.ndarray,
        raw_place: np.ndarray,
        staypoint: np.ndarray,
        timezone: str = "UTC",
        coordinates: np.ndarray | None = None,
    ) -> VisitLog:
        """From arrays in any order (times in UTC nanoseconds; ``coordinates`` ``(N, 2)`` latitude and
        longitude, or None): sorted by (user, start, staypoint)."""
        order = np.lexsort((staypoint, started_ns, user))
        located = coordinates is not None
        return cls(
            user=np.asarray(user, dtype=np.int64)[order],
            start=_wall_minutes_ns(np.asarray(started_ns)[order], timezone),
            end=_wall_minutes_ns(np.asarray(finished_ns)[order], timezone),
            place=np.asarray(place, dtype=np.int64)[order],
            raw_place=np.asarray(raw_place, dtype=np.int64)[order],
            staypoint=np.asarray(staypoint, dtype=np.int64)[order],
            latitude=np.asarray(coordinates, dtype=np.float64)[order, 0] if located else None,
            longitude=np.asarray(coordinates, dtype=np.float64)[order, 1] if located else None,
        )

    def __len__(self) -> int:
        return len(self.user)

    @property
    def located(self) -> bool:
        """Whether the visits' coordinates are known."""
        return self.latitude is not None and self.longitude is not None

    def take(self, rows: np.ndarray) -> VisitLog:
        """The visits at ``rows`` (a boolean mask or sorted positions), still sorted."""
        columns = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return VisitLog(**{name: None if c is None else c[rows] for name, c in columns.items()})


@dataclass(frozen=True)
class Queries:
    """Questions "where does ``user`` go next, leaving ``current`` at ``now``?", one per sample."""

    user: np.ndarray  # int64
    now: np.ndarray  # int64 wall-clock minutes
    current: np.ndarray  # int64 encoded place the user is leaving
    previous: np.ndarray  # int64 encoded place before that (0: none)
    arrived: np.ndarray  # int64 wall-clock minute the user arrived at the current place

    def __len__(self) -> int:
        return len(self.user)


def wall_minutes(times: pd.Series, timezone: str = "UTC") -> np.ndarray:
    """Tz-aware timestamps as wall-clock minutes since 1970-01-01 in ``timezone`` (int64, floored)."""
    return _wall_minutes_ns(to_ns(times), timezone)


def _wall_minutes_ns(utc_ns: np.ndarray, timezone: str) -> np.ndarray:
    local = wall_clock_ns(utc_ns, timezone).view("datetime64[ns]")
    return local.astype("datetime64[m]").astype(np.int64)


def queries_for_targets(log: VisitLog, staypoint_ids: np.ndarray) -> Queries:
    """The question each target staypoint answers: its user, leaving the visit just before it.

    Raises:
        ValueError: a staypoint id that is not in the log, or a target that is its user's first visit.
    """
    ids = np.asarray(staypoint_ids, dtype=np.int64)
    order = np.argsort(log.staypoint, kind="stable")
    pos = np.minimum(np.searchsorted(log.staypoint[order], ids), max(len(order) - 1, 0))
    if not len(order) or not np.array_equal(log.staypoint[order][pos], ids):
        missing = ids[~np.isin(ids, log.staypoint)]
        raise ValueError(f"staypoint ids {missing[:5].tolist()} are not in the visit log")
    rows = order[pos]
    if np.any(rows == 0) or np.any(log.user[np.maximum(rows - 1, 0)] != log.user[rows]):
        raise ValueError("a target is its user's first visit: there is no place the user is leaving")
    # visits may overlap (a visit logged before the previous one ended): now never passes the target
    return _leaving(log, rows - 1, np.minimum(log.end[rows - 1], log.start[rows]))


def queries_after_last(log: VisitLog, now: np.ndarray | None = None) -> Queries:
    """One question per user of ``log`` (ascending): leaving the user's last visit, at ``now`` (one per
    user; default: the end of that visit)."""
    last = np.flatnonzero(np.r_[log.user[1:] != log.user[:-1], True]) if len(log) else np.zeros(0, int)
    return _leaving(log, last, log.end[last] if now is None else np.asarray(now, dtype=np.int64))


def _leaving(log: VisitLog, rows: np.ndarray, now: np.ndarray) -> Queries:
    earlier = np.maximum(rows - 1, 0)
    came_from = (rows >= 1) & (log.user[earlier] == log.user[rows])
    return Queries(
        user=log.user[rows],
        now=np.asarray(now, dtype=np.int64),
        current=log.place[rows],
        previous=np.where(came_from, log.place[earlier], 0),
        arrived=log.start[rows],
    )


def window_places(log: VisitLog, queries: Queries, previous_days: int = 7) -> np.ndarray:
    """``(N, T)`` int64: each question's window, the places of its user's visits that started before
    ``now`` on a day at most ``previous_days`` before now's (wall-clock dates), oldest first, right-padded
    with :data:`~nextloc.preprocessing.sequences.PAD`: what an answer's window holds
    (:func:`nextloc.predict.histories.encode_visits`), and nothing after now."""
    origin = int(log.start.min()) if len(log) else 0
    span = (int(log.start.max()) - origin + 2) if len(log) else 1
    key = log.user * span + (log.start - origin)  # ascending: the log is sorted by (user, start)
    now = np.asarray(queries.now, dtype=np.int64)
    first = (now // MINUTES_PER_DAY - previous_days) * MINUTES_PER_DAY

    def position(user: np.ndarray, minute: np.ndarray) -> np.ndarray:
        return np.searchsorted(key, user * span + np.clip(minute - origin, 0, span - 1), side="left")

    hi, lo = position(queries.user, now), position(queries.user, first)
    lengths = hi - lo
    out = np.full((len(now), int(lengths.max()) if len(now) else 0), PAD, dtype=np.int64)
    rows = np.repeat(np.arange(len(now)), lengths)
    column = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[rows, column] = log.place[lo[rows] + column]
    return out
