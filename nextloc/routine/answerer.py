"""A registered routine kind answering a request: the users' stored tally, extended by the request's visits.

The tally (:meth:`nextloc.routine.features.Routine.tally`, and :class:`~nextloc.routine.unseen.UnseenPlaces`'
beside it) holds counts, not visits; :class:`RoutineAnswerer` adds a request's visits to them and asks the
model (:mod:`nextloc.routine.ranking`) where each history's user goes next.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nextloc.preprocessing.staypoints import to_ns
from nextloc.routine.features import Routine
from nextloc.routine.ranking import CandidateScorer, CandidateSet, log_probabilities
from nextloc.routine.tally import StoredTally
from nextloc.routine.unseen import StoredUnseen, UnseenPlaces, unseen_centres
from nextloc.routine.visits import VisitLog, queries_after_last, wall_minutes


@dataclass(frozen=True)
class RoutineAnswerer:
    """A registered routine kind answering a request: its model, and the users' tally as of training.

    A request's visits extend the tally (its visits before the end of a known user's tally are taken
    to be in the tally already, and only mark the 7-day window); a user the tally does not hold, or a
    second history of the same user in one request, is answered from the request's visits alone. With
    ``unseen`` (the stored tally of :class:`~nextloc.routine.unseen.UnseenPlaces`), the explore features
    end with ``unseen_return_share``; a model registered before it was kept answers without it.
    """

    model: CandidateScorer
    tally: StoredTally
    num_places: int
    centres: np.ndarray
    popularity: np.ndarray
    timezone: str
    unseen: StoredUnseen | None = None

    def answer(self, visits: pd.DataFrame, users: np.ndarray, at: pd.Series) -> tuple[np.ndarray, np.ndarray]:
        """Answers to one question per history.

        Args:
            visits: one row per visit: ``history`` (0..H-1), ``started_at``, ``finished_at`` (tz-aware),
                ``place`` (encoded: 1 for a place outside the vocabulary), ``raw_place`` (an id that
                tells the request's places apart), and optionally ``latitude`` and ``longitude``.
            users: ``(H,)`` each history's encoded user (0: unknown).
            at: ``(H,)`` each question's time (tz-aware).

        Returns:
            ``(H, V)`` float32 log-probabilities and ``(H, E)`` explore features (then
            ``unseen_return_share`` with :attr:`unseen`), in history order.
        """
        h = visits["history"].to_numpy(np.int64)
        n = len(users)
        users = np.asarray(users, dtype=np.int64)
        first_of_user = np.zeros(n, dtype=bool)
        first_of_user[np.unique(users, return_index=True)[1]] = True
        known = self.tally.users
        in_tally = first_of_user & np.isin(users, known)
        fresh = int(max(int(known.max()) if len(known) else 0, int(users.max()) if n else 0)) + 1
        routine_user = np.where(in_tally, users, fresh + np.arange(n))
        log = VisitLog.of(
            routine_user[h],
            to_ns(visits["started_at"]),
            to_ns(visits["finished_at"]),
            visits["place"].to_numpy(np.int64),
            visits["raw_place"].to_numpy(np.int64),
            np.arange(len(visits)),
            self.timezone,
        )
        order = np.argsort(routine_user, kind="stable")  # queries_after_last answers users ascending
        now = wall_minutes(pd.Series(at).iloc[order], self.timezone)
        queries = queries_after_last(log, now)
        routine = Routine(log, self.num_places, self.centres, self.tally)
        candidates = CandidateSet.build(routine, queries)
        scores = self.model.scores(candidates)
        logp = log_probabilities(candidates, scores, self.popularity, self.model.calibration)
        explore = candidates.explore
        if self.unseen is not None:
            explore = np.column_stack([explore, self._unseen_share(visits, log, now)])
        back = np.empty(n, dtype=np.int64)
        back[order] = np.arange(n)
        return logp[back], explore[back]

    def _unseen_share(self, visits: pd.DataFrame, log: VisitLog, now: np.ndarray) -> np.ndarray:
        """``unseen_return_share`` of each question (users ascending, as ``queries_after_last``)."""
        places = UnseenPlaces.build(log, self.num_places, self.centres, unseen_centres(visits), self.unseen)
        candidates = CandidateSet.build(places.routine, queries_after_last(places.log, now))
        return places.share(candidates, self.model.scores(candidates), self.model.calibration.temperature)
