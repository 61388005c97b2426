"""Two model kinds that rank the places of the user's routine (:mod:`nextloc.routine.features`).

* ``routine``: a rule. A candidate's score is a weighted sum of a few routine features (visits in the
  7-day window, share among all earlier visits, share in now's 3-hour slot, share of the moves out of the
  current place, share on the same kind of day and slot, minus a penalty for the place the user is
  leaving); the weights are chosen on validation (coordinate search over a fixed grid, place MRR).
* ``ranker``: LightGBM's LambdaRank over every routine feature, fit on the train split's questions, its
  number of trees chosen on validation (early stopping).
* ``ranker_refit``: the ``ranker``'s number of trees with the trees refit on the train and validation
  questions: what a team deploys, outside the reference data budget (it trains on validation), never a
  headline; its validation place metrics are those of the ``ranker`` it was chosen with. Its calibration (and its
  new-place head) cannot be fit on validation's answers, which it has trained on: they are fit on
  cross-fitted ones instead, each block of validation answered by trees chosen and refit without it
  (:meth:`nextloc.routine.data.RoutineData.refit`).

Both answer with log-probabilities over the known places, calibrated on validation (:class:`Calibration`):
the candidates share ``1 - fallback_mass`` by a softmax of their scores over a temperature, every other
known place shares ``fallback_mass`` by its popularity in train; the temperature and the fallback mass are
the maximum-likelihood ones on validation's questions whose target is a known place. The classes 0 and 1
get ``FLOOR`` here: the new-place head gives P(new place), and the evaluation and the answers read the one
distribution ``P(new)`` on class 1, ``(1 - P(new))`` times these over the places
(:func:`nextloc.routine.novelty.with_new_place`). Their state is plain data (JSON weights and calibration;
LightGBM's own text model format), nothing pickled.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from nextloc.models import registry
from nextloc.preprocessing.sequences import FIRST_PLACE
from nextloc.routine.calibration import Calibration
from nextloc.routine.counts import grouped_softmax
from nextloc.routine.features import CANDIDATE_FEATURES, Routine
from nextloc.routine.spill import FeatureFiles, ranking_dataset
from nextloc.routine.trees import TreeEnsemble
from nextloc.routine.visits import Queries

FLOOR = -40.0  # log-probability of the classes 0 and 1
RULE_FEATURES = (
    "n_window",
    "share_place",
    "share_slot",
    "share_transition",
    "share_daytype_slot",
    "is_current",
)
RULE_GRID = (0.0, 0.3, 1.0, 3.0, 10.0)  # is_current's weight is a penalty: it enters with a minus sign
RANKER_PARAMS: dict[str, Any] = {
    "objective": "lambdarank",
    "metric": "map",
    "eval_at": [50],
    "lambdarank_truncation_level": 10,
    "learning_rate": 0.05,
    "num_leaves": 31,
    "min_data_in_leaf": 50,
    "feature_fraction": 0.8,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "deterministic": True,
    "force_row_wise": True,
    "num_threads": 1,
    "verbose": -1,
}
RANKER_MAX_TREES = 2000
RANKER_PATIENCE = 100


@dataclass(frozen=True)
class CandidateSet:
    """One split's (or one request's) questions with their candidate places and features.

    ``query``, ``place``: ``(R,)`` one row per candidate, query by query; ``features``: ``(R, F)``
    :data:`~nextloc.routine.features.CANDIDATE_FEATURES`; ``explore``: ``(N, E)``; ``n``: the number of questions.
    """

    query: np.ndarray
    place: np.ndarray
    features: np.ndarray | FeatureFiles  # on disk: a training split's (build's spill)
    explore: np.ndarray
    n: int

    @classmethod
    def build(
        cls, routine: Routine, queries: Queries, target: np.ndarray | None = None, spill: Path | None = None
    ) -> CandidateSet:
        """Each question's candidates in ``routine`` with their features; with ``target`` ``(N,)``, only
        the questions whose target is a candidate keep theirs (:meth:`answerable`), the others' features
        never computed. ``spill``: a folder the features are written to chunk by chunk
        (:class:`~nextloc.routine.spill.FeatureFiles`), never held: a ranker's, which LightGBM reads as a
        sequence of chunks and the ranker scores a chunk at a time (:meth:`column` reads them too; the
        methods that cut or join sets need them held)."""
        query, place = routine.candidates(queries)
        if target is not None:
            keep = _has_target(query, place, target, len(queries))[1][query]
            query, place = query[keep], place[keep]
        if spill is None:
            features = routine.features(queries, query, place)
        else:
            chunks = routine.feature_chunks(queries, query, place)
            features = FeatureFiles.write(spill, chunks, len(CANDIDATE_FEATURES))
        return cls(query, place, features, routine.explore_features(queries), len(queries))

    def column(self, name: str) -> np.ndarray:
        """One candidate feature, ``(R,)``."""
        if isinstance(self.features, FeatureFiles):
            return self.features.column(CANDIDATE_FEATURES.index(name))
        return self.features[:, CANDIDATE_FEATURES.index(name)]

    def labels(self, target: np.ndarray) -> np.ndarray:
        """``(R,)`` 1 where the candidate is its question's target, else 0."""
        return _has_target(self.query, self.place, target, self.n)[0]

    def concat(self, other: CandidateSet) -> CandidateSet:
        """Both sets' questions in one set, ``other``'s after these (their targets concatenate alike)."""
        return CandidateSet(
            np.concatenate([self.query, other.query + self.n]),
            np.concatenate([self.place, other.place]),
            np.concatenate([self.features, other.features]),
            np.concatenate([self.explore, other.explore]),
            self.n + other.n,
        )

    def select(self, keep: np.ndarray) -> CandidateSet:
        """The questions where ``keep`` ``(N,)`` is True, renumbered in order, with their candidates' rows in order."""
        keep = np.asarray(keep, dtype=bool)
        rows = keep[self.query]
        renumber = np.cumsum(keep) - 1
        return CandidateSet(
            renumber[self.query[rows]],
            self.place[rows],
            self.features[rows],
            self.explore[keep],
            int(keep.sum()),
        )

    def candidates_where(self, keep: np.ndarray) -> CandidateSet:
        """The same questions with only the candidates where ``keep`` ``(R,)`` is True."""
        keep = np.asarray(keep, dtype=bool)
        return CandidateSet(self.query[keep], self.place[keep], self.features[keep], self.explore, self.n)

    def ranking_rows(self, target: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """LightGBM's ranking data of the questions whose target is a candidate (the others carry no
        ranking signal): ``(features, labels, group sizes)``; the features are this set's own array, not a
        copy, when every row is one (a set of :meth:`answerable` questions)."""
        labels, has_target = self._has_target(target)
        rows = has_target[self.query]
        groups = np.bincount(self.query[rows], minlength=self.n)[has_target]
        if rows.all():
            return self.features, labels, groups
        return self.features[rows], labels[rows], groups

    def answerable(self, target: np.ndarray) -> CandidateSet:
        """The same questions, only those whose target is a candidate keeping their candidates: the rows
        :meth:`ranking_rows` fits on, held once (a training split's, which nothing else reads)."""
        return self.candidates_where(self._has_target(target)[1][self.query])

    def _has_target(self, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(R,)`` :meth:`labels` and ``(N,)`` whether each question's target is among its candidates."""
        return _has_target(self.query, self.place, target, self.n)


def _has_target(
    query: np.ndarray, place: np.ndarray, target: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(R,)`` 1 where candidate ``(query, place)`` is its question's target, else 0, and ``(n,)`` whether
    each question's target is among its candidates."""
    labels = (place == np.asarray(target)[query]).astype(np.int64)
    return labels, np.bincount(query, weights=labels, minlength=n) > 0


class CandidateScorer(Protocol):
    """A fitted kind: candidate scores, its calibration, and its state as plain data."""

    calibration: Calibration

    def scores(self, candidates: CandidateSet) -> np.ndarray: ...

    def state(self) -> dict[str, Any]: ...


def candidate_mrr(candidates: CandidateSet, scores: np.ndarray, target: np.ndarray) -> float:
    """Mean reciprocal rank of each question's target among its candidates (0 where it is not one), in
    percent; ties are broken by the lower place id, as in :mod:`nextloc.evaluation.metrics`."""
    hit = candidates.labels(target).astype(bool)
    target_score = np.full(candidates.n, np.nan)
    target_score[candidates.query[hit]] = scores[hit]
    target_place = np.zeros(candidates.n, dtype=np.int64)
    target_place[candidates.query[hit]] = candidates.place[hit]
    ts, tp = target_score[candidates.query], target_place[candidates.query]
    better = (scores > ts) | ((scores == ts) & (candidates.place < tp))
    rank = np.bincount(candidates.query, weights=better, minlength=candidates.n) + 1
    covered = ~np.isnan(target_score)
    return float(100 * np.where(covered, 1 / rank, 0.0).mean()) if candidates.n else float("nan")


class RoutineRule:
    """The ``routine`` kind: a weighted sum of :data:`RULE_FEATURES` (see the module docstring)."""

    def __init__(
        self, weights: dict[str, float] | None = None, calibration: Calibration | None = None
    ) -> None:
        self.weights = dict(weights or dict.fromkeys(RULE_FEATURES, 1.0))
        self.calibration = calibration or Calibration()
        unknown = sorted(set(self.weights) - set(RULE_FEATURES))
        if unknown:
            raise ValueError(f"unknown routine rule weights {unknown}; expected {list(RULE_FEATURES)}")

    def scores(self, candidates: CandidateSet) -> np.ndarray:
        total = np.zeros(len(candidates.query))
        for name, weight in self.weights.items():
            sign = -1.0 if name == "is_current" else 1.0
            total += sign * weight * candidates.column(name)
        return total

    def fit(self, val: CandidateSet, target: np.ndarray, passes: int = 2) -> RoutineRule:
        """Choose the weights on validation: coordinate search over :data:`RULE_GRID`, by candidate MRR
        (first best wins ties, so the search is deterministic)."""
        weights = dict.fromkeys(RULE_FEATURES, 1.0)
        best = candidate_mrr(val, RoutineRule(weights).scores(val), target)
        for _, name in itertools.product(range(passes), RULE_FEATURES):
            for value in RULE_GRID:
                trial = {**weights, name: value}
                score = candidate_mrr(val, RoutineRule(trial).scores(val), target)
                if score > best:
                    best, weights = score, trial
        self.weights = weights
        return self

    def state(self) -> dict[str, Any]:
        return {"weights": self.weights, "calibration": self.calibration.state()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RoutineRule:
        weights = {str(k): float(v) for k, v in state["weights"].items()}
        return cls(weights, Calibration.from_state(state.get("calibration")))


class RoutineRanker:
    """The ``ranker`` kind: LightGBM LambdaRank over :data:`~nextloc.routine.features.CANDIDATE_FEATURES`.

    A model read back from its text answers with :class:`~nextloc.routine.trees.TreeEnsemble` (the same scores as
    LightGBM's, without importing it) unless it is outside what that covers.

    Args:
        seed: LightGBM's seed (its bagging and feature sampling).
        model: a fitted LightGBM model in its text format (from :meth:`state`), or None.
    """

    def __init__(
        self, seed: int = 0, model: str | None = None, calibration: Calibration | None = None
    ) -> None:
        self.seed = int(seed)
        self.calibration = calibration or Calibration()
        self.booster = None
        self.model = model
        self.trees = TreeEnsemble.parse(model) if model is not None else None
        if model is not None and self.trees is None:
            import lightgbm  # a model the numpy trees do not cover

            self.booster = lightgbm.Booster(model_str=model)

    def fit(self, train: CandidateSet, train_target: np.ndarray, val: CandidateSet, val_target: np.ndarray):
        """Fit on train's questions that have their target among the candidates; stop adding trees when
        validation has not improved for ``RANKER_PATIENCE``."""
        import lightgbm

        fit_set = _ranking_set(train, train_target)
        sizes = np.bincount(val.query, minlength=val.n)
        val_set = ranking_dataset(val.features, val.labels(val_target), sizes[sizes > 0], reference=fit_set)
        self.model, self.trees = None, None
        self.booster = lightgbm.train(
            {**RANKER_PARAMS, "seed": self.seed},
            fit_set,
            RANKER_MAX_TREES,
            valid_sets=[val_set],
            callbacks=[lightgbm.early_stopping(RANKER_PATIENCE, verbose=False)],
        )
        return self

    def refit(self, questions: CandidateSet, target: np.ndarray) -> RoutineRanker:
        """A new ranker with this one's seed, number of trees and calibration, its trees fit on ``questions``
        (train and validation's, for ``ranker_refit``); nothing is chosen on them."""
        import lightgbm

        refit = RoutineRanker(self.seed, calibration=self.calibration)
        refit.booster = lightgbm.train(
            {**RANKER_PARAMS, "seed": self.seed}, _ranking_set(questions, target), self.best_iteration
        )
        return refit

    @property
    def best_iteration(self) -> int:
        return int(self.booster.best_iteration or self.booster.current_iteration())

    def scores(self, candidates: CandidateSet) -> np.ndarray:
        if self.booster is None and self.trees is None:
            raise RuntimeError("call fit() first")
        if not len(candidates.query):
            return np.zeros(0)
        if isinstance(candidates.features, FeatureFiles):
            return candidates.features.map(self._predict)
        return self._predict(candidates.features)

    def _predict(self, features: np.ndarray) -> np.ndarray:
        if self.trees is not None:
            return self.trees.predict(features)
        return self.booster.predict(features, num_iteration=self.best_iteration)

    def state(self) -> dict[str, Any]:
        model = (
            self.model
            if self.booster is None
            else self.booster.model_to_string(num_iteration=self.best_iteration)
        )
        return {"seed": self.seed, "model": model, "calibration": self.calibration.state()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RoutineRanker:
        return cls(int(state["seed"]), str(state["model"]), Calibration.from_state(state.get("calibration")))


def _ranking_set(questions: CandidateSet, target: np.ndarray) -> Any:
    """LightGBM's ranking data of the questions whose target is a candidate (:meth:`CandidateSet.ranking_rows`),
    its columns named :data:`~nextloc.routine.features.CANDIDATE_FEATURES` (then ``extra_<i>``: a benchmark's
    added features)."""
    features, labels, groups = questions.ranking_rows(target)
    extra = [f"extra_{i}" for i in range(features.shape[1] - len(CANDIDATE_FEATURES))]
    return ranking_dataset(features, labels, groups, feature_name=[*CANDIDATE_FEATURES, *extra])


def log_probabilities(
    candidates: CandidateSet,
    scores: np.ndarray,
    popularity: np.ndarray,
    calibration: Calibration | None = None,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """``(N, V)`` float32 log-probabilities over the known places from candidate scores (see the module
    docstring and :class:`Calibration`; default: the uncalibrated temperature 1 and :data:`FALLBACK_MASS`).

    Args:
        candidates: the questions and their candidates.
        scores: ``(R,)`` one score per candidate.
        popularity: ``(V,)`` the places' visits in train (the fallback mass's weights, :class:`Calibration`).
        calibration: the temperature, the fallback mass and its popularity power.
        rows: ``(B,)`` answer only these questions, in this order: ``(B, V)``, each row the one the whole
            set's answer holds (a batch's answers, without the ``(N, V)`` matrix: it grows as the square of
            the data, questions times places).
    """
    q, place, n = candidates.query, candidates.place, candidates.n
    if rows is not None:
        q, pick = question_rows(q, np.asarray(rows, dtype=np.int64))
        place, scores, n = place[pick], np.asarray(scores)[pick], len(rows)
    calibration = calibration or Calibration()
    scores = np.asarray(scores, dtype=np.float64) / calibration.temperature
    mass = calibration.fallback_mass
    v = len(popularity)
    fallback = calibration.fallback_weights(popularity)
    share = np.log(np.maximum(fallback, 1e-300) / fallback.sum())  # classes 0 and 1: set to FLOOR below
    out = np.tile(share, (n, 1))
    has = np.bincount(q, minlength=n) > 0
    if len(q):
        top, _, denominator = grouped_softmax(q, scores, n)
        rest = fallback.sum() - np.bincount(q, weights=fallback[place], minlength=n)
        out[has] += np.log(mass) + np.log(fallback.sum()) - np.log(np.maximum(rest[has], 1e-12))[:, None]
        out[q, place] = np.log1p(-mass) + scores - top[q] - np.log(denominator[q])
    out[:, :FIRST_PLACE] = FLOOR
    return out.astype(np.float32).reshape(n, v)


def question_rows(query: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The candidates of questions ``rows`` (``query`` ascending, as a :class:`CandidateSet`'s): their new
    question numbers ``0..B-1`` and their positions in the set, question by question in ``rows``' order."""
    lo = np.searchsorted(query, rows, side="left")
    lengths = np.searchsorted(query, rows, side="right") - lo
    ends = np.cumsum(lengths)
    pick = np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - lengths - lo, lengths)
    return np.repeat(np.arange(len(rows)), lengths), pick


def scorer_from_state(kind: str, state: dict[str, Any]) -> CandidateScorer:
    """The inverse of ``model.state()`` for a routine kind (its class: the kind's registry entry)."""
    entry = registry.kind(kind)
    if entry.family != "routine":
        raise ValueError(f"{kind!r} is not a routine kind; expected one of {list(registry.kinds('routine'))}")
    return entry.model_class.from_state(state)
