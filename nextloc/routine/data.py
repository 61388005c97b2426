"""A dataset's routine and each split's questions: what the routine kinds are fit, chosen and tested on.

:meth:`RoutineData.build` indexes every staypoint once (:class:`~nextloc.routine.features.Routine`, and the
unseen places' routine, :mod:`nextloc.routine.unseen`), with each place's centre as of each question's now
(the mean of the coordinates of its visits that started before it); asks each split's questions; and gives
each validation and test question the window of places the new-place head reads: the 7 days before its
now (:func:`~nextloc.routine.visits.window_places`), not the reference samples' window, which is anchored on
the target's day (the samples stay as they are for the reference protocol and the neural kinds).

:meth:`RoutineData.refit` is ``ranker_refit``'s cross-fitting: validation's questions are cut into
user-time blocks (each user's questions in time order, in :data:`REFIT_FOLDS` runs); each block is answered
by a ranker whose number of trees is chosen (early stopping) on validation without the block and whose
trees are refit on train and validation without the block, the same user's questions within
``gap_days`` of the block left out of both.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from nextloc.preprocessing.sequences import UNSEEN
from nextloc.preprocessing.staypoints import to_ns
from nextloc.preprocessing.vocabulary import place_popularity
from nextloc.routine.calibration import Calibration
from nextloc.routine.features import Routine
from nextloc.routine.ranking import (
    CandidateScorer,
    CandidateSet,
    RoutineRanker,
    RoutineRule,
    log_probabilities,
    question_rows,
)
from nextloc.routine.sparse import SparseAnswers, Tail
from nextloc.routine.unseen import UnseenPlaces
from nextloc.routine.visits import MINUTES_PER_DAY, Queries, VisitLog, queries_for_targets, window_places

if TYPE_CHECKING:
    from nextloc.models.batch import SampleTensors

logger = logging.getLogger(__name__)

REFIT_FOLDS = (
    5  # ranker_refit: validation's user-time blocks, each answered by trees chosen and refit without it
)
# the reference DBSCAN's min_samples: an unseen place with fewer visits before now than this is noise to a
# DBSCAN over the past alone (docs/protocol.md: the protocol's DBSCAN effect)
MIN_PAST_VISITS = 2


@dataclass(frozen=True)
class RoutineData:
    """A dataset's routine (every visit indexed once) and each split's questions with their candidates.

    Args:
        routine: the routine over every staypoint of the dataset (centres as of each question's now).
        candidates: ``split -> CandidateSet``, questions in split order (train's: only the questions whose
            target is a candidate keep theirs, :meth:`CandidateSet.answerable`, what a ranker is fit on).
        targets: ``split -> (N,)`` the target place of each question.
        popularity: ``(V,)`` each place's visits in train (the fallback weights).
        unseen_places: the routine over extended ids (:mod:`nextloc.routine.unseen`).
        unseen: ``split -> CandidateSet`` each question's places in that routine, known or not (every
            split but train).
        queries: ``split -> Queries`` each question.
        windows: ``split -> (N, T)`` each question's places of the 7 days before its now: the new-place
            head's window (every split but train).
        spill: the folder the candidates' features are in when they are not held (:meth:`build`); it
            goes with the last copy of this data that holds it.
    """

    routine: Routine
    candidates: dict[str, CandidateSet]
    targets: dict[str, np.ndarray]
    popularity: np.ndarray
    unseen_places: UnseenPlaces
    unseen: dict[str, CandidateSet]
    queries: dict[str, Queries]
    windows: dict[str, np.ndarray]
    spill: tempfile.TemporaryDirectory | None = None

    @classmethod
    def build(
        cls,
        staypoints: pd.DataFrame,
        locations: pd.DataFrame,
        samples: dict[str, SampleTensors],
        num_places: int,
        timezone: str = "UTC",
        previous_days: int = 7,
        located: pd.DataFrame | None = None,
        spill: tempfile.TemporaryDirectory | None = None,
    ) -> RoutineData:
        """From ``staypoints.parquet`` (with its coordinates), ``vocabulary/locations.parquet`` (the places'
        train visits) and each split's samples (their ``staypoint_id`` names the target).

        ``located``: the dataset's located staypoints (``03_locations/staypoints_located.parquet``: raw
        ``location_id``, ``started_at``, ``latitude``, ``longitude``), every user's before merging, whose
        coordinates give the places' centres as of now, as the vocabulary's centres come from all of them
        (None: the final staypoints' coordinates). ``spill``: a folder every split's candidate features
        are written to rather than held (:meth:`CandidateSet.build`: a ``ranker``'s; ``ranker_refit`` cuts
        and joins validation's and train's, and ``routine`` reads columns many times: held), removed
        with the last copy of this data."""
        log = VisitLog.from_staypoints(staypoints, timezone)
        centre_log = None if located is None else located_log(located, locations, timezone)
        routine = Routine(log, num_places, centre_log=centre_log)
        places = UnseenPlaces.build(log, num_places, centre_log=centre_log)
        candidates, targets, unseen, queries, windows = {}, {}, {}, {}, {}
        for split, data in samples.items():
            ids = data.table.column("staypoint_id").to_numpy()
            queries[split] = queries_for_targets(log, ids)
            targets[split] = data.target_np
            # train is only fit on: its rows that carry a ranking signal (the others are never read)
            answerable = targets[split] if split == "train" else None
            folder = _folder(spill, split)
            candidates[split] = CandidateSet.build(routine, queries[split], answerable, folder)
            if split == "train":
                continue
            # the head is fit on validation and read on test: train's window and unseen places are never asked
            windows[split] = window_places(log, queries[split], previous_days)
            unseen_queries, folder = queries_for_targets(places.log, ids), _folder(spill, f"unseen-{split}")
            unseen[split] = CandidateSet.build(places.routine, unseen_queries, spill=folder)
        popularity = place_popularity(locations, num_places)
        return cls(routine, candidates, targets, popularity, places, unseen, queries, windows, spill)

    def index_only(self) -> RoutineData:
        """The routine and the unseen places' routine (what a registered bundle's tally is read from),
        without the splits' questions: what is kept once they are answered (their memory grows with the data)."""
        return replace(self, candidates={}, targets={}, unseen={}, queries={}, windows={}, spill=None)

    def fit(self, kind: str, seed: int = 0) -> CandidateScorer:
        """Fit ``kind`` (``routine``: weights chosen on val; ``ranker``: fit on train, trees chosen on val),
        then its :class:`Calibration` on val."""
        val, val_target = self.candidates["val"], self.targets["val"]
        model: RoutineRule | RoutineRanker
        if kind == "routine":
            model = RoutineRule().fit(val, val_target)
        elif kind == "ranker":
            model = RoutineRanker(seed).fit(self.candidates["train"], self.targets["train"], val, val_target)
        else:
            raise ValueError(f"cannot fit routine kind {kind!r}: 'routine' or 'ranker' (then refit())")
        model.calibration = Calibration.fit(val, model.scores(val), val_target, self.popularity)
        return model

    def refit(
        self, ranker: RoutineRanker, folds: int = REFIT_FOLDS, gap_days: int = 7
    ) -> tuple[RoutineRanker, tuple[np.ndarray, np.ndarray]]:
        """``ranker`` (fit on train, chosen on val) with its trees refit on the train and val questions.

        Its calibration is fit on validation's cross-fitted scores (see the module docstring: user-time
        blocks, each answered by trees chosen and refit without it and without the same user's questions
        within ``gap_days`` of it); those answers are what the new-place head is fit on too.

        Returns:
            The refit, and validation's cross-fitted scores of its candidates and of :attr:`unseen`'s.
        """
        train, val, unseen = self.candidates["train"], self.candidates["val"], self.unseen["val"]
        train_target, val_target = self.targets["train"], self.targets["val"]
        block = user_time_blocks(self.queries["val"], folds)
        scores, unseen_scores = np.zeros(len(val.query)), np.zeros(len(unseen.query))
        for k in range(folds):
            held = block == k
            fit = ~held & ~neighbours(self.queries["val"], held, gap_days * MINUTES_PER_DAY)
            chosen = RoutineRanker(ranker.seed).fit(train, train_target, val.select(fit), val_target[fit])
            trees = chosen.refit(
                train.concat(val.select(fit)), np.concatenate([train_target, val_target[fit]])
            )
            logger.info(
                "ranker_refit block %d: %d questions held, %d left out beside them, %d trees (all of val: %d)",
                k,
                int(held.sum()),
                int((~held & ~fit).sum()),
                chosen.best_iteration,
                ranker.best_iteration,
            )
            scores[held[val.query]] = trees.scores(val.select(held))
            unseen_scores[held[unseen.query]] = trees.scores(unseen.select(held))
        refit = ranker.refit(train.concat(val), np.concatenate([train_target, val_target]))
        refit.calibration = Calibration.fit(val, scores, val_target, self.popularity)
        return refit, (scores, unseen_scores)

    def log_probabilities(
        self,
        model: CandidateScorer,
        split: str,
        scores: np.ndarray | None = None,
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """``(N, V)`` float32: ``model``'s answer to every question of ``split``, in split order (``scores``:
        its candidates' scores, default ``model``'s); ``rows``: to those questions only, ``(B, V)``."""
        candidates = self.candidates[split]
        scores = model.scores(candidates) if scores is None else scores
        return log_probabilities(candidates, scores, self.popularity, model.calibration, rows)

    def tail(self, model: CandidateScorer) -> Tail:
        """The places ``model``'s answers do not name, grouped by fallback weight (:meth:`answers`)."""
        return Tail.of(self.popularity, model.calibration)

    def answers(
        self, model: CandidateScorer, split: str, scores: np.ndarray, rows: np.ndarray, tail: Tail
    ) -> SparseAnswers:
        """:meth:`log_probabilities` of questions ``rows`` of ``split`` as :class:`SparseAnswers` (``tail``:
        :meth:`tail` of ``model``): ``(B, candidates + levels)``, not ``(B, V)``."""
        candidates = self.candidates[split]
        query, pick = question_rows(candidates.query, np.asarray(rows, dtype=np.int64))
        place, picked = candidates.place[pick], np.asarray(scores)[pick]
        return SparseAnswers.of_candidates(tail, query, place, picked, len(rows), model.calibration)

    def explore(
        self,
        model: CandidateScorer,
        split: str,
        scores: np.ndarray | None = None,
        min_past_visits: int = 0,
    ) -> np.ndarray:
        """``(N, E + 1)``: the routine's explore features of ``split``'s questions and ``model``'s
        ``unseen_return_share`` (``scores``: its scores of :attr:`unseen`'s candidates, default ``model``'s):
        the new-place head's routine inputs. ``min_past_visits``: the share leaves out the unseen places
        with fewer visits (every user's) before now (:data:`MIN_PAST_VISITS`: the protocol's DBSCAN effect)."""
        places = self.unseen[split]
        scores = model.scores(places) if scores is None else scores
        keep = None
        if min_past_visits:
            visits = np.rint(np.expm1(places.column("log_popularity")))
            keep = (places.place < self.unseen_places.num_places) | (visits >= min_past_visits)
        share = self.unseen_places.share(places, scores, model.calibration.temperature, keep)
        return np.column_stack([self.candidates[split].explore, share])


LOCATED_COLUMNS = ["location_id", "started_at", "latitude", "longitude"]
# what VisitLog.from_staypoints reads of staypoints.parquet (the coordinates where it has them)
STAYPOINT_COLUMNS = ["id", "user", "location_id", "raw_location_id", "started_at", "finished_at"]
STAYPOINT_COORDINATES = ["latitude", "longitude"]


def _folder(spill: tempfile.TemporaryDirectory | None, name: str) -> Path | None:
    """A new folder ``name`` in ``spill`` (None: none)."""
    if spill is None:
        return None
    folder = Path(spill.name) / name
    folder.mkdir()
    return folder


def read_staypoints(path: Path) -> pd.DataFrame:
    """The columns :meth:`RoutineData.build` reads of a dataset's ``staypoints.parquet`` (not its geometry
    nor its sample columns)."""
    names = pq.read_schema(path).names
    coordinates = STAYPOINT_COORDINATES if set(STAYPOINT_COORDINATES) <= set(names) else []
    return pd.read_parquet(path, columns=STAYPOINT_COLUMNS + coordinates)


def read_located(path: Path | None) -> pd.DataFrame | None:
    """The columns :meth:`RoutineData.build` reads of a located staypoints file (None: no path, or a data
    directory without the file: the final staypoints' coordinates then give the centres)."""
    if path is None or not Path(path).is_file():
        return None
    return pd.read_parquet(path, columns=LOCATED_COLUMNS)


def located_log(located: pd.DataFrame, locations: pd.DataFrame, timezone: str = "UTC") -> VisitLog:
    """The located staypoints as a visit log of their coordinates: each at its encoded place (the
    vocabulary's ``loc_index`` of its raw ``location_id``, else ``UNSEEN`` with the raw id kept), no user."""
    raw = located["location_id"].to_numpy(np.int64)
    index = pd.Series(
        locations["loc_index"].to_numpy(np.int64), index=locations["raw_location_id"].to_numpy()
    )
    place = pd.Series(raw).map(index).fillna(UNSEEN).to_numpy(np.int64)
    started = to_ns(located["started_at"])
    zeros = np.zeros(len(raw), dtype=np.int64)
    coordinates = located[["latitude", "longitude"]].to_numpy(np.float64)
    return VisitLog.of(zeros, started, started, place, raw, np.arange(len(raw)), timezone, coordinates)


def user_time_blocks(queries: Queries, folds: int) -> np.ndarray:
    """``(N,)`` each question's block: every user's questions in time order, cut into ``folds`` runs of
    (nearly) equal size; block ``k`` holds every user's ``k``-th run."""
    order = np.lexsort((queries.now, queries.user))
    user = np.asarray(queries.user)[order]
    first = np.searchsorted(user, user, side="left")
    size = np.searchsorted(user, user, side="right") - first
    block = np.empty(len(order), dtype=np.int64)
    block[order] = (np.arange(len(order)) - first) * folds // np.maximum(size, 1)
    return block


def neighbours(queries: Queries, held: np.ndarray, gap: int) -> np.ndarray:
    """``(N,)`` the questions not ``held`` whose user has held questions and that are asked within ``gap``
    minutes of the span of that user's held ones."""
    held = np.asarray(held, dtype=bool)
    users, user = np.unique(queries.user, return_inverse=True)
    now = np.asarray(queries.now, dtype=np.int64)
    first = np.full(len(users), np.iinfo(np.int64).max)
    last = np.full(len(users), np.iinfo(np.int64).min)
    np.minimum.at(first, user[held], now[held])
    np.maximum.at(last, user[held], now[held])
    return ~held & (now >= first[user] - gap) & (now <= last[user] + gap)
