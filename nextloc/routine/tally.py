"""A stored routine tally (:meth:`nextloc.routine.features.Routine.tally`), split by index once.

A registered routine kind carries its training users' tally as one table of counts per key and index.
Every request reads the same parts of it (each index's counts, the users it holds, when each user's
tally ends), so :class:`StoredTally` prepares them when the model is loaded: a request then answers
from sorted arrays by binary search instead of filtering the whole table for each index.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from nextloc.preprocessing.sequences import FIRST_PLACE
from nextloc.routine.counts import Snapshot

NO_TALLY_END = np.iinfo(np.int64).min // 4  # before any time: a user the tally does not hold
# the tally table as a bundle stores it (one row per index and key; ``last`` NaN where not kept)
TALLY_SCHEMA = pa.schema(
    [
        ("index", pa.string()),
        ("key", pa.int64()),
        ("count", pa.float64()),
        ("total", pa.float64()),
        ("last", pa.float64()),
    ]
)


@dataclass(frozen=True)
class StoredTally:
    """The tally's counts per index (:class:`~nextloc.routine.counts.Snapshot`), and per user the start of their
    last visit in it.

    Attributes:
        bases: index name -> its counts (an index the table lacks is empty).
        users: ``(U,)`` int64 the users the tally holds, ascending.
        user_end: ``(U,)`` float64 the start of each user's last visit.
    """

    bases: dict[str, Snapshot]
    users: np.ndarray
    user_end: np.ndarray

    @classmethod
    def from_frame(cls, tally: pd.DataFrame) -> StoredTally:
        """From the tally table (``index``, ``key``, ``count``, ``total``, ``last``)."""
        groups = tally.groupby("index", sort=False, observed=True)
        return cls.from_bases({str(name): Snapshot.from_frame(part) for name, part in groups})

    @classmethod
    def from_bases(cls, bases: dict[str, Snapshot]) -> StoredTally:
        """From each index's counts (:func:`read_bases`)."""
        users = bases.get("user", Snapshot.from_frame(None))
        return cls(bases, users.key, users.last)

    def base(self, name: str) -> Snapshot:
        """The counts of index ``name`` (empty if the tally has none)."""
        return self.bases.get(name) or Snapshot.from_frame(None)

    def known_pairs(self, num_places: int) -> np.ndarray:
        """``user << 32 | place`` of every (user, known place) pair the tally counts a visit of."""
        keys = self.base("place").key
        user, place = keys // num_places, keys % num_places
        return (user * (1 << 32) + place)[place >= FIRST_PLACE]

    def end_of(self, users: np.ndarray) -> np.ndarray:
        """Per user, the start of the tally's last visit (:data:`NO_TALLY_END` for a user it lacks)."""
        users = np.asarray(users, dtype=np.int64)
        if not len(self.users):
            return np.full(len(users), NO_TALLY_END, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.users, users), len(self.users) - 1)
        end = np.where(self.users[pos] == users, self.user_end[pos], np.nan)
        return np.where(np.isnan(end), NO_TALLY_END, np.nan_to_num(end)).astype(np.int64)


def read_bases(path: Path) -> dict[str, Snapshot]:
    """Each index's counts in a tally file (:data:`TALLY_SCHEMA`), read a row group at a time: each name is
    read once per group, and only numbers are held beside the counts (a bundle written part by part has one
    row group per index; any grouping reads the same)."""
    rows: dict[str, list[pd.DataFrame]] = {}
    file = pq.ParquetFile(path)
    for group in range(file.num_row_groups):
        table = file.read_row_group(group, columns=list(TALLY_SCHEMA.names))
        names = table.column("index").combine_chunks().dictionary_encode()
        codes = names.indices.to_numpy(zero_copy_only=False)
        numbers = table.drop_columns(["index"]).to_pandas()
        for code, name in enumerate(names.dictionary.to_pylist()):
            rows.setdefault(name, []).append(numbers[codes == code])
    return {name: Snapshot.from_frame(pd.concat(rows.pop(name), ignore_index=True)) for name in list(rows)}
