"""Counts of keyed events before a time: how many, their summed value and the latest, by binary search.

:class:`EventCounts` answers "how many events of key ``k`` started before ``t``?" for many ``(k, t)`` at
once: events are sorted by ``(key, time)`` once, and each question is two binary searches. An optional
*base* (a :meth:`EventCounts.snapshot` of earlier events, one row per key: count, summed value, latest
time) is added to every answer: that is how a stored tally of a user's past extends the visits of a
request without keeping the past visits themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

SNAPSHOT_COLUMNS = ("key", "count", "total", "last")


@dataclass(frozen=True)
class Snapshot:
    """A snapshot (:data:`SNAPSHOT_COLUMNS`) as arrays sorted by key: read by binary search, so that a base
    is converted once (when a model is loaded), not at every request."""

    key: np.ndarray  # int64, ascending
    count: np.ndarray  # float64
    total: np.ndarray  # float64
    last: np.ndarray  # float64 (NaN: not kept)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame | None) -> Snapshot:
        """From a snapshot DataFrame (any row order; None: empty)."""
        if frame is None:
            return cls(*(np.zeros(0, dtype=np.int64 if c == "key" else np.float64) for c in SNAPSHOT_COLUMNS))
        keys = frame["key"].to_numpy(np.int64)
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], *(frame[c].to_numpy(np.float64)[order] for c in SNAPSHOT_COLUMNS[1:]))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({c: getattr(self, c) for c in SNAPSHOT_COLUMNS})

    def lookup(self, keys: np.ndarray, column: str, missing: float) -> np.ndarray:
        """``(N,)`` float64: ``column`` of each key (``missing`` where the snapshot has no such key)."""
        if not len(self.key):
            return np.full(len(keys), missing)
        pos = np.minimum(np.searchsorted(self.key, keys), len(self.key) - 1)
        return np.where(self.key[pos] == keys, getattr(self, column)[pos], missing)


class EventCounts:
    """Events grouped by an integer key, sorted by time within each key.

    One int64 per event (``code``: the key's rank and the time, from which both are read back), and for an
    index with values two float64 more (each value and its key's running sum): the routine's indexes hold
    every visit of a dataset, most of them without values.

    Args:
        keys: ``(N,)`` int64 key of each event.
        times: ``(N,)`` int64 time of each event.
        values: ``(N,)`` a value per event to sum (default: none, the sums are 0).
        base: earlier events as a snapshot (:data:`SNAPSHOT_COLUMNS`), counted as before every time.
    """

    def __init__(
        self,
        keys: np.ndarray,
        times: np.ndarray,
        values: np.ndarray | None = None,
        base: pd.DataFrame | Snapshot | None = None,
    ) -> None:
        times = np.asarray(times, dtype=np.int64)
        self.t0 = int(times.min()) if len(times) else 0
        self.span = int(times.max()) - self.t0 + 2 if len(times) else 1
        self.keys, dense = np.unique(np.asarray(keys, dtype=np.int64), return_inverse=True)
        code = dense.astype(np.int64) * self.span + (times - self.t0)
        order = np.argsort(code, kind="stable")
        self.code = code[order]
        del code, dense
        self.values = self.running = np.zeros(0)  # no values: every sum is 0
        if values is not None:
            self.values = np.asarray(values, dtype=np.float64)[order]
            # each key's running sum of its own events alone: a sum before a time reads nothing of later
            # events, nor of other keys', to the last bit
            self.running = pd.Series(self.values).groupby(self.code // self.span).cumsum().to_numpy()
        self.base = base if isinstance(base, Snapshot) else Snapshot.from_frame(base)

    def times_at(self, positions: np.ndarray) -> np.ndarray:
        """``(N,)`` int64: the times of the events at ``positions`` (read back from their codes)."""
        return self.code[positions] % self.span + self.t0

    def _bounds(
        self, keys: np.ndarray, times: np.ndarray, cutoff: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Each key's events as positions ``lo:hi`` (those before ``times``) and ``lo:below`` (before
        ``cutoff``, None without one): the key's place is searched once for both."""
        if not len(self.keys):
            empty = np.zeros(len(keys), dtype=np.int64)
            return empty, empty, None if cutoff is None else empty
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        found = self.keys[pos] == keys
        first = pos * self.span
        lo = np.searchsorted(self.code, first, side="left")

        def before(at: np.ndarray) -> np.ndarray:
            rel = np.minimum(np.maximum(np.asarray(at, dtype=np.int64) - self.t0, 0), self.span - 1)
            return np.where(found, np.searchsorted(self.code, first + rel, side="left"), lo)

        return lo, before(times), None if cutoff is None else before(cutoff)

    def _base(self, keys: np.ndarray, column: str, missing: float) -> np.ndarray:
        return self.base.lookup(keys, column, missing)

    def count(self, keys: np.ndarray, times: np.ndarray, cutoff: np.ndarray | None = None) -> np.ndarray:
        """``(N,)`` float64: events of each key that started strictly before its time, plus the base's.

        ``cutoff`` (per key): the events before it are taken to be in the base already and are not added
        again; they still tell a count before ``times`` from one before an earlier time (a window).
        """
        keys = np.asarray(keys, dtype=np.int64)
        lo, hi, below = self._bounds(keys, times, cutoff)
        out = (hi - lo) + self._base(keys, "count", 0.0)
        if below is not None:
            out -= below - lo
        return out

    def total(self, keys: np.ndarray, times: np.ndarray, cutoff: np.ndarray | None = None) -> np.ndarray:
        """``(N,)`` float64: the summed values of those events (``cutoff`` as in :meth:`count`)."""
        keys = np.asarray(keys, dtype=np.int64)
        lo, hi, below = self._bounds(keys, times, cutoff)
        out = self._sum(lo, hi) + self._base(keys, "total", 0.0)
        if below is not None:
            out -= self._sum(lo, below)
        return out

    def _sum(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """The summed values of the events ``lo:hi`` of one key each (``lo`` its first)."""
        if not len(self.running):
            return np.zeros(len(lo))
        return np.where(hi > lo, self.running[np.maximum(hi - 1, 0)], 0.0)

    def last(self, keys: np.ndarray, times: np.ndarray) -> np.ndarray:
        """``(N,)`` float64: the time of the latest of those events (NaN: none)."""
        keys = np.asarray(keys, dtype=np.int64)
        lo, hi, _ = self._bounds(keys, times)
        out = self._base(keys, "last", np.nan)
        has = hi > lo
        out[has] = self.times_at(hi[has] - 1)
        return out

    def snapshot(self, with_last: bool = True) -> pd.DataFrame:
        """Every event (and the base) as one row per key: ``key``, ``count``, ``total``, ``last`` (NaN
        without ``with_last``): the base of a later :class:`EventCounts`."""
        dense = (self.code // self.span).astype(np.int64) if len(self.code) else np.zeros(0, dtype=np.int64)
        events = pd.DataFrame(
            {
                "key": self.keys[dense],
                "count": np.ones(len(dense)),
                "total": self.values if len(self.values) else np.zeros(len(dense)),
                "last": self.times_at(np.arange(len(dense))).astype(np.float64),
            }
        )
        both = pd.concat([self.base.frame(), events], ignore_index=True) if len(self.base.key) else events
        out = both.groupby("key", sort=True).agg(
            count=("count", "sum"), total=("total", "sum"), last=("last", "max")
        )
        out = out.reset_index()
        if not with_last:
            out["last"] = np.nan
        return out[list(SNAPSHOT_COLUMNS)]


def composite_key(*columns: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    """One int64 key per row for a tuple of small non-negative integer columns (mixed radix, ``sizes``
    the radix of each column; the first column's size bounds nothing and may be any value)."""
    key = np.zeros(len(columns[0]), dtype=np.int64)
    for column, size in zip(columns, sizes, strict=True):
        key = key * size + np.asarray(column, dtype=np.int64)
    return key


def rank_within(group: np.ndarray, value: np.ndarray) -> np.ndarray:
    """1 + how many rows of the same group have a smaller ``value``: ties share the smallest rank (pandas'
    ``groupby(group).rank(method="min")`` for values without NaN)."""
    order = np.lexsort((value, group))
    g, v = np.asarray(group)[order], np.asarray(value)[order]
    new_value = np.r_[True, (g[1:] != g[:-1]) | (v[1:] != v[:-1])] if len(g) else np.zeros(0, dtype=bool)
    new_group = np.r_[True, g[1:] != g[:-1]] if len(g) else np.zeros(0, dtype=bool)
    position = np.arange(len(g))
    tie_start = np.maximum.accumulate(np.where(new_value, position, 0))
    group_start = np.maximum.accumulate(np.where(new_group, position, 0))
    rank = np.empty(len(g), dtype=np.float64)
    rank[order] = tie_start - group_start + 1
    return rank


def grouped_softmax(
    group: np.ndarray, scores: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A softmax of ``scores`` within each of ``n`` groups, as its parts: ``(top, z, total)``, each group's
    largest score ``(n,)`` (-inf for an empty group), each row's ``exp(score - top[group])`` ``(R,)`` and each
    group's sum of those ``(n,)``. The softmax is ``z / total[group]``, its log
    ``scores - top[group] - log(total[group])``."""
    top = np.full(n, -np.inf)
    np.maximum.at(top, group, scores)
    z = np.exp(scores - top[group])
    return top, z, np.bincount(group, weights=z, minlength=n)


def first_of_pairs(first: np.ndarray, second: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each ``(first, second)`` pair's earliest ``start``, pairs ascending: ``(first, second, start)`` (as a
    pandas ``groupby([first, second], sort=True).min()``, without pandas: a request's few rows)."""
    order = np.lexsort((start, second, first))
    u, r = np.asarray(first, dtype=np.int64)[order], np.asarray(second, dtype=np.int64)[order]
    first = np.r_[True, (u[1:] != u[:-1]) | (r[1:] != r[:-1])] if len(u) else np.zeros(0, dtype=bool)
    return u[first], r[first], np.asarray(start, dtype=np.int64)[order][first]
