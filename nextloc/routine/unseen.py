"""Places outside the vocabulary that the user already visited, told apart: how likely a return to one is.

The routine (:mod:`nextloc.routine.features`) counts every visit to a place outside the train vocabulary as
the one place ``1``, so the ranker never scores a return to one of them; yet many "new place" targets are
such returns (a place first visited after training and visited again). :class:`UnseenPlaces` is a second
routine over *extended* place ids: a known place keeps its id, each place outside the vocabulary gets its own
from ``num_places`` up (first the dataset's, then a request's), with its centre (the mean of the coordinates
of its visits before now, as every place's in :mod:`nextloc.routine.features`; a registered model's fixed
ones), so that distances from and to it are known. The kind's model scores every place of this
routine, known or not, and :func:`unseen_share` gives the new-place head's input ``unseen_return_share``:
the share of the calibrated softmax over every place the user visited before now that falls on the unseen
ones. (Scored in the routine itself, where an unseen current place has a centre, a known candidate's
distance is known too; why not mixed with the routine's own scores: BENCHMARKS.md.)

A registered model keeps this routine's tally beside the routine's (:func:`join_tallies`), with the
unseen places it holds and their centres: a request's own unseen places get the ids after them (at most
:data:`REQUEST_CAPACITY`), so that every key stays in the same radix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from nextloc.preprocessing.sequences import UNSEEN
from nextloc.routine.counts import Snapshot, grouped_softmax
from nextloc.routine.features import Routine
from nextloc.routine.tally import StoredTally, read_bases
from nextloc.routine.visits import VisitLog

REQUEST_CAPACITY = 4096  # places outside the vocabulary one request may add to a stored tally's
PREFIX = "unseen:"  # the tally table's indexes of this routine
CENTRES_INDEX = "centres"  # one row per unseen place the tally holds: key its id, count/total its lat/lon
END_OF_TIME = np.iinfo(np.int64).max // 4  # wall-clock minutes after every visit


class Candidates(Protocol):
    """What :meth:`UnseenPlaces.share` reads of a :class:`nextloc.routine.ranking.CandidateSet` (which
    imports this module)."""

    query: np.ndarray
    place: np.ndarray
    n: int


@dataclass(frozen=True)
class StoredUnseen:
    """The stored tally of :class:`UnseenPlaces` (:func:`split_tally`): its counts, and the ``(held, 2)``
    centres of the unseen places it holds (ids ``num_places`` to ``num_places + held - 1``)."""

    tally: StoredTally
    centres: np.ndarray

    @property
    def held(self) -> int:
        return len(self.centres)


@dataclass(frozen=True)
class UnseenPlaces:
    """The routine over extended place ids (ids ``>= num_places``: places outside the vocabulary).

    Build it with :meth:`build`; ``held`` is the number of unseen places its ids cover before a request's.
    """

    routine: Routine
    num_places: int
    held: int

    @classmethod
    def build(
        cls,
        log: VisitLog,
        num_places: int,
        centres: np.ndarray | None = None,
        unseen_centres: np.ndarray | None = None,
        stored: StoredUnseen | None = None,
        centre_log: VisitLog | None = None,
    ) -> UnseenPlaces:
        """Over ``log`` (encoded places, ``raw_place`` telling the unseen ones apart).

        Args:
            num_places: the encoded place vocabulary's size.
            centres: ``(num_places, 2)`` the known places' fixed latitude/longitude (a registered model's
                answer); None: every place's centre as of each question's now, from the log's coordinates
                (evaluation: :class:`~nextloc.routine.features.Routine`).
            unseen_centres: with ``centres``, ``(K, 2)`` those of the log's unseen places, by ascending
                ``raw_place`` (:func:`unseen_centres`; None: unknown).
            stored: a stored tally of this routine, whose unseen places the log's come after.
            centre_log: without ``centres``, the visits whose coordinates give every place's centre as of
                now (encoded places, ``raw_place`` as the log's; default: the log): its unseen places take
                the log's extended ids, and one the log never visits is left out.

        Raises:
            ValueError: a log with more unseen places than :data:`REQUEST_CAPACITY` beside a stored tally.
        """
        num_places = int(num_places)
        unseen = log.place == UNSEEN
        raw, rank = np.unique(log.raw_place[unseen], return_inverse=True)
        if stored is not None and len(raw) > REQUEST_CAPACITY:
            raise ValueError(
                f"{len(raw)} places outside the vocabulary in one request: at most {REQUEST_CAPACITY}"
            )
        held = stored.held if stored is not None else len(raw)
        first = num_places + (held if stored is not None else 0)  # the log's unseen places' first id
        place = log.place.copy()
        place[unseen] = first + rank
        extended = dataclasses.replace(log, place=place)
        size = num_places + held + REQUEST_CAPACITY
        all_centres = None
        if centres is not None:
            all_centres = np.full((size, 2), np.nan)
            all_centres[:num_places] = centres
            if stored is not None:
                all_centres[num_places:first] = stored.centres
            if unseen_centres is not None:
                all_centres[first : first + len(raw)] = unseen_centres
        tally = stored.tally if stored is not None else None
        by_centre = None if centre_log is None else _extended(centre_log, raw, first)
        return cls(Routine(extended, size, all_centres, tally, by_centre), num_places, int(held))

    def share(
        self,
        candidates: Candidates,
        scores: np.ndarray,
        temperature: float = 1.0,
        keep: np.ndarray | None = None,
    ) -> np.ndarray:
        """``unseen_return_share`` of each question of ``candidates`` (this routine's, scored ``scores``):
        :func:`unseen_share` of its places outside the vocabulary (``keep`` ``(R,)``: among these
        candidates only, default all)."""
        query, place, scores = candidates.query, candidates.place, np.asarray(scores)
        if keep is not None:
            query, place, scores = query[keep], place[keep], scores[keep]
        return unseen_share(query, scores, place >= self.num_places, candidates.n, temperature)

    @property
    def log(self) -> VisitLog:
        """The visits with extended place ids: ask :func:`~nextloc.routine.features.queries_for_targets` (or
        ``queries_after_last``) of this log, so that a question's current place is an extended id too."""
        return self.routine.log

    def tally(self) -> pd.DataFrame:
        """This routine's tally, its indexes named ``unseen:<index>``, and the centres of its unseen places
        (of all their visits: what a registered model answers with)."""
        return pd.concat(list(self.tally_parts()), ignore_index=True)

    def tally_parts(self) -> Iterator[pd.DataFrame]:
        """:meth:`tally` index by index, the centres last."""
        yield from self.routine.tally_parts(PREFIX)
        ids = np.arange(self.num_places, self.num_places + self.held)
        after_all = np.full(len(ids), END_OF_TIME)  # every visit, the centre log's included
        lat, lon = self.routine.centre(ids, after_all).T
        centres = pd.DataFrame({"index": PREFIX + CENTRES_INDEX, "key": ids, "count": lat, "total": lon})
        yield centres.assign(last=np.nan)


def unseen_centres(
    visits: pd.DataFrame, place: str = "place", raw_place: str = "raw_place"
) -> np.ndarray | None:
    """``(K, 2)`` the mean ``latitude``/``longitude`` of each place outside the vocabulary (column ``place``
    1) of ``visits``, by ascending ``raw_place``: :meth:`UnseenPlaces.build`'s ``unseen_centres`` (None:
    visits without coordinates)."""
    if not {"latitude", "longitude"} <= set(visits.columns):
        return None
    unseen = visits[visits[place].to_numpy() == UNSEEN]
    coordinates = unseen[["latitude", "longitude"]].astype(np.float64)
    return coordinates.groupby(unseen[raw_place].to_numpy(), sort=True).mean().to_numpy()


def _extended(log: VisitLog, raw: np.ndarray, first: int) -> VisitLog:
    """``log`` with each unseen place at its extended id (``first`` + its rank in ``raw``, the ascending raw
    ids of the unseen places that have one); the unseen visits of any other place left out."""
    unseen = log.place == UNSEEN
    rank = np.searchsorted(raw, log.raw_place)
    found = rank < len(raw)
    found[found] = raw[rank[found]] == log.raw_place[found]
    place = np.where(unseen, first + rank, log.place)
    return dataclasses.replace(log, place=place).take(~unseen | found)


def join_tallies(routine: pd.DataFrame, unseen: pd.DataFrame) -> pd.DataFrame:
    """One tally table: the routine's indexes and :meth:`UnseenPlaces.tally`'s."""
    return pd.concat([routine, unseen], ignore_index=True)


def split_tally(table: pd.DataFrame) -> tuple[pd.DataFrame, StoredUnseen | None]:
    """The routine's part of a tally table, and the unseen places' part (None: a tally stored without
    it). The index names are read once each (as categories), not row by row."""
    index = table["index"].astype("category")
    mine = np.asarray(index.cat.categories.str.startswith(PREFIX))[index.cat.codes.to_numpy()]
    if not mine.any():
        return table, None
    groups = table[mine].groupby(index[mine], sort=False, observed=True)
    unseen = {str(name)[len(PREFIX) :]: Snapshot.from_frame(part) for name, part in groups}
    return table[~mine].reset_index(drop=True), _stored_unseen(unseen)


def read_tally(path: Path) -> tuple[StoredTally, StoredUnseen | None]:
    """A bundle's tally file as :func:`split_tally` splits it, stored: read by :func:`read_bases` (a row group
    at a time), never as one table with a name per row."""
    bases = read_bases(path)
    unseen = {name[len(PREFIX) :]: bases.pop(name) for name in list(bases) if name.startswith(PREFIX)}
    return StoredTally.from_bases(bases), _stored_unseen(unseen) if unseen else None


def _stored_unseen(bases: dict[str, Snapshot]) -> StoredUnseen:
    """The unseen places' indexes (names without :data:`PREFIX`) and their centres' rows."""
    centres = bases.pop(CENTRES_INDEX, None) or Snapshot.from_frame(None)
    return StoredUnseen(StoredTally.from_bases(bases), np.column_stack([centres.count, centres.total]))


def unseen_share(
    query: np.ndarray, scores: np.ndarray, is_unseen: np.ndarray, n: int, temperature: float = 1.0
) -> np.ndarray:
    """``(n,)`` per question: the share of the softmax of its candidates' ``scores`` (over ``temperature``)
    that goes to the unseen ones (0 without any candidate).

    Args:
        query: ``(R,)`` each candidate's question; scores: ``(R,)``; is_unseen: ``(R,)`` bool.
        n: the number of questions.
    """
    query = np.asarray(query, dtype=np.int64)
    if not len(query):
        return np.zeros(n)
    _, z, total = grouped_softmax(query, np.asarray(scores, dtype=np.float64) / temperature, n)
    return np.bincount(query, weights=z * is_unseen, minlength=n) / np.maximum(total, 1e-300)
