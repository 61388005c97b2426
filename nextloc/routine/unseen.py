"""Places outside the vocabulary that the user already visited, told apart: how likely a return to one is.

The routine (:mod:`nextloc.routine.features`) counts every visit to a place outside the train vocabulary as
the one place ``1``, so the ranker never scores a return to one of them; yet many "new place" targets are
such returns (a place first visited after training and visited again). :class:`UnseenPlaces` is a second
routine over *extended* place ids: a known place keeps its id, each place outside the vocabulary gets its own
from ``num_places`` up (first the dataset's, then a request's). Its candidates outside the vocabulary are
scored by the same model as the known ones, and :func:`unseen_share` turns both into the new-place head's
input ``unseen_return_share``: the share of a softmax over every place the user visited before now that
falls on the unseen ones.

A registered model keeps this routine's profile beside the routine's (:func:`join_profiles`), with the number
of unseen places it holds: a request's own unseen places get the ids after them (at most
:data:`REQUEST_CAPACITY`), so that every key stays in the same radix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nextloc.preprocessing.sequences import UNSEEN
from nextloc.routine.features import Queries, Routine, VisitLog
from nextloc.routine.profile import StoredProfile

REQUEST_CAPACITY = 4096  # places outside the vocabulary one request may add to a stored profile's
PREFIX = "unseen:"  # the profile table's indexes of this routine
PLACES_INDEX = "unseen_places"  # one row: ``count`` = the unseen places the profile holds


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
        stored: tuple[StoredProfile, int] | None = None,
    ) -> UnseenPlaces:
        """Over ``log`` (encoded places, ``raw_place`` telling the unseen ones apart); ``stored``: a stored
        profile of this routine (:func:`split_profile`) and the unseen places it holds, whose ids the log's
        unseen places come after.

        Raises:
            ValueError: a log with more unseen places than :data:`REQUEST_CAPACITY` beside a stored profile.
        """
        profile, held = stored if stored is not None else (None, 0)
        unseen = log.place == UNSEEN
        raw, rank = np.unique(log.raw_place[unseen], return_inverse=True)
        if stored is not None and len(raw) > REQUEST_CAPACITY:
            raise ValueError(
                f"{len(raw)} places outside the vocabulary in one request: at most {REQUEST_CAPACITY}"
            )
        place = log.place.copy()
        place[unseen] = num_places + held + rank
        extended = VisitLog(log.user, log.start, log.end, place, log.raw_place, log.staypoint)
        size = num_places + (held if stored is not None else len(raw)) + REQUEST_CAPACITY
        all_centres = np.full((size, 2), np.nan)
        if centres is not None:
            all_centres[: len(centres)] = centres
        held = held if stored is not None else len(raw)
        return cls(Routine(extended, size, all_centres, profile), int(num_places), int(held))

    @property
    def log(self) -> VisitLog:
        """The visits with extended place ids: ask :func:`~nextloc.routine.features.queries_for_targets` (or
        ``queries_after_last``) of this log, so that a question's current place is an extended id too."""
        return self.routine.log

    def candidate_features(self, queries: Queries) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(query row, place, features)`` of the places outside the vocabulary each question's user visited
        before now (:meth:`~nextloc.routine.features.Routine.candidate_features`, their rows only)."""
        query, place, features = self.routine.candidate_features(queries)
        keep = place >= self.num_places
        return query[keep], place[keep], features[keep]

    def profile(self) -> pd.DataFrame:
        """This routine's profile, its indexes named ``unseen:<index>``, and the number of unseen places."""
        table = self.routine.profile()
        table["index"] = PREFIX + table["index"].astype(str)
        held = pd.DataFrame({"index": [PREFIX + PLACES_INDEX], "key": [0], "count": [float(self.held)]})
        return pd.concat([table, held.assign(total=0.0, last=np.nan)], ignore_index=True)


def join_profiles(routine: pd.DataFrame, unseen: pd.DataFrame) -> pd.DataFrame:
    """One profile table: the routine's indexes and :meth:`UnseenPlaces.profile`'s."""
    return pd.concat([routine, unseen], ignore_index=True)


def split_profile(table: pd.DataFrame) -> tuple[pd.DataFrame, tuple[StoredProfile, int] | None]:
    """The routine's part of a profile table, and its unseen places' part with the number of unseen places
    (None: a profile stored without it)."""
    index = table["index"].astype(str)
    mine = index.str.startswith(PREFIX)
    if not mine.any():
        return table, None
    part = table[mine].assign(index=index[mine].str.slice(len(PREFIX)))
    held = part["index"] == PLACES_INDEX
    count = int(part.loc[held, "count"].iloc[0]) if held.any() else 0
    return table[~mine].reset_index(drop=True), (StoredProfile.from_frame(part[~held]), count)


def unseen_share(
    known: tuple[np.ndarray, np.ndarray],
    unseen: tuple[np.ndarray, np.ndarray],
    n: int,
    temperature: float = 1.0,
) -> np.ndarray:
    """``(n,)`` per question: the share of the softmax (scores over ``temperature``) over its known candidates
    and its unseen ones that goes to the unseen ones (0 without any).

    Args:
        known, unseen: ``(query row, score)`` of each candidate.
        n: the number of questions.
    """
    query = np.concatenate([known[0], unseen[0]]).astype(np.int64)
    scores = np.concatenate([known[1], unseen[1]]).astype(np.float64) / temperature
    is_unseen = np.concatenate([np.zeros(len(known[0])), np.ones(len(unseen[0]))])
    if not len(query):
        return np.zeros(n)
    top = np.full(n, -np.inf)
    np.maximum.at(top, query, scores)
    z = np.exp(scores - top[query])
    total = np.bincount(query, weights=z, minlength=n)
    return np.bincount(query, weights=z * is_unseen, minlength=n) / np.maximum(total, 1e-300)
