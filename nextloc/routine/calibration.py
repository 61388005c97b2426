"""Calibrated probabilities over the known places from a routine kind's candidate scores (:class:`Calibration`,
fitted on validation; :mod:`nextloc.routine.ranking` answers with it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from nextloc.preprocessing.sequences import FIRST_PLACE
from nextloc.routine.counts import grouped_softmax

FALLBACK_MASS = 1e-3  # the fallback mass of an uncalibrated model (a state written before calibration)
TEMPERATURE_BOUNDS = (0.05, 20.0)
POWER_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)


class CandidateSet(Protocol):
    """What calibration reads of :class:`nextloc.routine.ranking.CandidateSet` (which imports this module)."""

    query: np.ndarray
    place: np.ndarray
    n: int

    def labels(self, target: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class Calibration:
    """Candidate scores -> probabilities over the known places: a softmax of ``scores / temperature`` over the
    candidates, which share ``1 - fallback_mass``; the other known places share ``fallback_mass`` in
    proportion to ``(1 + visits in train) ** popularity_power``.

    :meth:`fit` chooses all three on validation by log-loss over the questions whose target is a known place
    (a new place's probability is the new-place head's): ``fallback_mass`` is the share of those targets that
    are not candidates (its maximum-likelihood value, whatever the rest), the temperature the
    one-dimensional minimum of the candidates' log-loss, the power the best of :data:`POWER_GRID` for the
    targets that are not candidates.
    """

    temperature: float = 1.0
    fallback_mass: float = FALLBACK_MASS
    popularity_power: float = 1.0

    def fallback_weights(self, popularity: np.ndarray) -> np.ndarray:
        """``(V,)`` each place's share of the fallback mass before normalising (0 for the classes 0 and 1)."""
        weights = (np.asarray(popularity, dtype=np.float64) + 1.0) ** self.popularity_power
        weights[:FIRST_PLACE] = 0.0
        return weights

    @classmethod
    def fit(
        cls,
        candidates: CandidateSet,
        scores: np.ndarray,
        target: np.ndarray,
        popularity: np.ndarray | None = None,
    ) -> Calibration:
        """Fit on validation's ``candidates`` (their ``scores``) against ``target``; ``popularity`` ``(V,)``
        (visits in train; None: the power stays 1)."""
        target = np.asarray(target)
        hit = candidates.labels(target).astype(bool)
        known = target >= FIRST_PLACE
        covered = np.zeros(candidates.n, dtype=bool)
        covered[candidates.query[hit]] = True
        if not known.any():
            return cls()
        mass = round(float(np.clip((known & ~covered).sum() / known.sum(), 1e-4, 0.9)), 6)
        temperature = (
            _temperature(candidates, np.asarray(scores, dtype=np.float64), hit) if hit.any() else 1.0
        )
        power = 1.0
        if popularity is not None and (known & ~covered).any():
            power = _popularity_power(candidates, popularity, target, known & ~covered)
        return cls(temperature, mass, power)

    def state(self) -> dict[str, float]:
        return {
            "temperature": self.temperature,
            "fallback_mass": self.fallback_mass,
            "popularity_power": self.popularity_power,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> Calibration:
        """The inverse of :meth:`state`; a state without one (written before calibration): the old fixed answer."""
        if not state:
            return cls()
        power = float(state.get("popularity_power", 1.0))
        return cls(float(state["temperature"]), float(state["fallback_mass"]), power)


def _temperature(candidates: CandidateSet, scores: np.ndarray, hit: np.ndarray) -> float:
    """The temperature that minimises the log-loss of the targets among their question's candidates."""
    from scipy.optimize import minimize_scalar  # scipy (sklearn's dependency): only when fitting

    q = candidates.query
    rows = np.isin(q, q[hit])  # the candidates of the questions that have their target

    def loss(log_t: float) -> float:
        top, _, total = grouped_softmax(q[rows], scores[rows] / np.exp(log_t), candidates.n)
        norm = np.log(np.maximum(total, 1e-300))
        return float(-(scores[hit] / np.exp(log_t) - top[q[hit]] - norm[q[hit]]).mean())

    bounds = tuple(np.log(TEMPERATURE_BOUNDS))
    best = minimize_scalar(loss, bounds=bounds, method="bounded", options={"xatol": 1e-4})
    return float(round(np.exp(best.x), 4))


def _popularity_power(
    candidates: CandidateSet, popularity: np.ndarray, target: np.ndarray, outside: np.ndarray
) -> float:
    """The power of :data:`POWER_GRID` with the least log-loss of the ``outside`` questions' targets (known
    places that are not candidates) among the places that are not candidates (first best wins ties)."""
    losses = []
    for power in POWER_GRID:
        weights = Calibration(popularity_power=power).fallback_weights(popularity)
        rest = weights.sum() - np.bincount(
            candidates.query, weights=weights[candidates.place], minlength=candidates.n
        )
        losses.append(float(-np.log(weights[target[outside]] / rest[outside]).mean()))
    return POWER_GRID[int(np.argmin(losses))]
