"""Counts of keyed events before a time: how many, their summed value and the latest, by binary search.

:class:`EventCounts` answers "how many events of key ``k`` started before ``t``?" for many ``(k, t)`` at
once: events are sorted by ``(key, time)`` once, and each question is two binary searches. An optional
*base* (a :meth:`EventCounts.snapshot` of earlier events, one row per key: count, summed value, latest
time) is added to every answer: that is how a stored profile of a user's past extends the visits of a
request without keeping the past visits themselves.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SNAPSHOT_COLUMNS = ("key", "count", "total", "last")


class EventCounts:
    """Events grouped by an integer key, sorted by time within each key.

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
        base: pd.DataFrame | None = None,
    ) -> None:
        times = np.asarray(times, dtype=np.int64)
        self.t0 = int(times.min()) if len(times) else 0
        self.span = int(times.max()) - self.t0 + 2 if len(times) else 1
        self.keys, dense = np.unique(np.asarray(keys, dtype=np.int64), return_inverse=True)
        code = dense.astype(np.int64) * self.span + (times - self.t0)
        order = np.argsort(code, kind="stable")
        self.code = code[order]
        self.times = times[order]
        weights = np.zeros(len(times)) if values is None else np.asarray(values, dtype=np.float64)[order]
        self.cumsum = np.concatenate([[0.0], np.cumsum(weights)])
        empty = pd.DataFrame(
            {c: np.zeros(0, dtype=np.int64 if c == "key" else np.float64) for c in SNAPSHOT_COLUMNS}
        )
        self.base = (empty if base is None else base).sort_values("key", kind="stable").reset_index(drop=True)

    def _bounds(self, keys: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = np.asarray(keys, dtype=np.int64)
        if not len(self.keys):
            empty = np.zeros(len(keys), dtype=np.int64)
            return empty, empty
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        found = self.keys[pos] == keys
        rel = np.clip(np.asarray(times, dtype=np.int64) - self.t0, 0, self.span - 1)
        lo = np.searchsorted(self.code, pos * self.span, side="left")
        hi = np.searchsorted(self.code, pos * self.span + rel, side="left")
        return lo, np.where(found, hi, lo)

    def _base(self, keys: np.ndarray, column: str, missing: float) -> np.ndarray:
        base_keys = self.base["key"].to_numpy(np.int64)
        if not len(base_keys):
            return np.full(len(keys), missing)
        pos = np.minimum(np.searchsorted(base_keys, keys), len(base_keys) - 1)
        return np.where(base_keys[pos] == keys, self.base[column].to_numpy(np.float64)[pos], missing)

    def count(self, keys: np.ndarray, times: np.ndarray, cutoff: np.ndarray | None = None) -> np.ndarray:
        """``(N,)`` float64: events of each key that started strictly before its time, plus the base's.

        ``cutoff`` (per key): the events before it are taken to be in the base already and are not added
        again; they still tell a count before ``times`` from one before an earlier time (a window).
        """
        lo, hi = self._bounds(keys, times)
        out = (hi - lo) + self._base(keys, "count", 0.0)
        if cutoff is not None:
            lo, hi = self._bounds(keys, cutoff)
            out -= hi - lo
        return out

    def total(self, keys: np.ndarray, times: np.ndarray, cutoff: np.ndarray | None = None) -> np.ndarray:
        """``(N,)`` float64: the summed values of those events (``cutoff`` as in :meth:`count`)."""
        lo, hi = self._bounds(keys, times)
        out = self.cumsum[hi] - self.cumsum[lo] + self._base(keys, "total", 0.0)
        if cutoff is not None:
            lo, hi = self._bounds(keys, cutoff)
            out -= self.cumsum[hi] - self.cumsum[lo]
        return out

    def last(self, keys: np.ndarray, times: np.ndarray) -> np.ndarray:
        """``(N,)`` float64: the time of the latest of those events (NaN: none)."""
        lo, hi = self._bounds(keys, times)
        out = self._base(keys, "last", np.nan)
        has = hi > lo
        out[has] = self.times[hi[has] - 1]
        return out

    def snapshot(self, with_last: bool = True) -> pd.DataFrame:
        """Every event (and the base) as one row per key: ``key``, ``count``, ``total``, ``last`` (NaN
        without ``with_last``): the base of a later :class:`EventCounts`."""
        dense = (self.code // self.span).astype(np.int64) if len(self.code) else np.zeros(0, dtype=np.int64)
        events = pd.DataFrame(
            {
                "key": self.keys[dense],
                "count": np.ones(len(dense)),
                "total": np.diff(self.cumsum),
                "last": self.times.astype(np.float64),
            }
        )
        both = pd.concat([self.base, events], ignore_index=True) if len(self.base) else events
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
