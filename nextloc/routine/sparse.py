"""A routine kind's answers without a row per place: the classes each answer names, and the tail it does not.

A routine kind's answer (:func:`nextloc.routine.ranking.log_probabilities`) gives its candidates their own
log-probabilities and every other known place a share of the fallback mass in proportion to the place's
fallback weight (its popularity in train). Places of equal popularity hold one value in every answer, so
the tail of an answer is a few *levels* (one per distinct weight), each a value and a number of places.
:class:`SparseAnswers` holds a batch of answers that way: ``(B, K + L)`` numbers, candidates plus levels,
instead of ``(B, V)``; evaluating a split costs its questions times their candidates and the levels, not
times the places (what grows as the square of the data).

Every value is computed as the ``(B, V)`` answer computes it (the same float64 expressions, then float32),
and :meth:`SparseAnswers.ranks` applies the same rank rule (:func:`nextloc.evaluation.tensor_metrics.target_ranks`:
ties go to the lower class), so ranks and top answers are those of the ``(B, V)`` answer. Sums over the
places (a softmax's normaliser, an entropy, an answer set's running mass) are taken level by level: equal
to the ``(B, V)`` answer's to within float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from nextloc.preprocessing.sequences import FIRST_PLACE, PAD, UNSEEN
from nextloc.routine.calibration import Calibration
from nextloc.routine.counts import grouped_softmax

FLOOR = np.float32(-40.0)  # log-probability of the classes 0 and 1 (nextloc.routine.ranking.FLOOR)


@dataclass(frozen=True)
class Tail:
    """The known places grouped by fallback weight: each level's places share one value in every answer.

    Attributes:
        fallback: ``(V,)`` each class's fallback weight (:meth:`Calibration.fallback_weights`).
        share: ``(L,)`` float64 each level's log share of the fallback mass, ascending.
        level: ``(V,)`` each class's level (-1: the classes 0 and 1).
        key: ``(V - 2,)`` ``level * V + place``, ascending: each level's places in order.
        start: ``(L + 1,)`` where each level's places begin in :attr:`key`.
    """

    fallback: np.ndarray
    share: np.ndarray
    level: np.ndarray
    key: np.ndarray
    start: np.ndarray

    @classmethod
    def of(cls, popularity: np.ndarray, calibration: Calibration) -> Tail:
        fallback = calibration.fallback_weights(popularity)
        share = np.log(np.maximum(fallback, 1e-300) / fallback.sum())
        v = len(fallback)
        levels, inverse = np.unique(share[FIRST_PLACE:], return_inverse=True)
        level = np.concatenate([np.full(min(FIRST_PLACE, v), -1), inverse]).astype(np.int64)
        key = np.sort(inverse.astype(np.int64) * v + np.arange(FIRST_PLACE, v))
        start = np.searchsorted(key, np.arange(len(levels) + 1) * v)
        return cls(fallback, levels, level, key, start)

    @property
    def num_classes(self) -> int:
        return len(self.fallback)

    def members_below(self, level: np.ndarray, below: np.ndarray) -> np.ndarray:
        """How many places of each ``level`` have an index below ``below`` (both ``(P,)``)."""
        return np.searchsorted(self.key, level * self.num_classes + below) - self.start[level]

    def first_free(self, level: int, named: np.ndarray) -> int:
        """The lowest place of ``level`` that is not one of ``named``."""
        members = self.key[self.start[level] : self.start[level + 1]] - level * self.num_classes
        head = members[: len(named) + 1]  # at most len(named) of them are named
        return int(head[~np.isin(head, named)][0])


@dataclass(frozen=True)
class SparseAnswers:
    """``B`` answers over ``V`` classes: the classes each names with their values, and the tail's levels.

    Attributes:
        tail: the levels (:class:`Tail`).
        named: ``(B, K)`` int64 the classes each answer names (columns 0 and 1: the classes 0 and 1; then its
            candidates), -1 past its last.
        value: ``(B, K)`` float32 their log-probabilities (-inf past the last).
        level_value: ``(B, L)`` float32 each level's log-probability in each answer.
        count: ``(B, L)`` int64 each level's places that the answer does not name.
    """

    tail: Tail
    named: np.ndarray
    value: np.ndarray
    level_value: np.ndarray
    count: np.ndarray

    def __len__(self) -> int:
        return len(self.named)

    @classmethod
    def of_candidates(
        cls,
        tail: Tail,
        query: np.ndarray,
        place: np.ndarray,
        scores: np.ndarray,
        n: int,
        calibration: Calibration,
    ) -> SparseAnswers:
        """The answers :func:`~nextloc.routine.ranking.log_probabilities` gives ``n`` questions whose
        candidates are ``(query, place)`` (``query`` ascending) with ``scores``, each value as it computes it."""
        scores = np.asarray(scores, dtype=np.float64) / calibration.temperature
        mass, fallback = calibration.fallback_mass, tail.fallback
        offset, candidate = np.zeros(n), np.zeros(0)
        has = np.bincount(query, minlength=n) > 0
        if len(query):
            top, _, denominator = grouped_softmax(query, scores, n)
            rest = fallback.sum() - np.bincount(query, weights=fallback[place], minlength=n)
            offset[has] = np.log(mass) + np.log(fallback.sum()) - np.log(np.maximum(rest[has], 1e-12))
            candidate = np.log1p(-mass) + scores - top[query] - np.log(denominator[query])
        sizes = np.bincount(query, minlength=n)
        width = FIRST_PLACE + (int(sizes.max()) if n else 0)
        column = FIRST_PLACE + np.arange(len(query)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        named = np.full((n, width), -1, dtype=np.int64)
        value = np.full((n, width), -np.inf, dtype=np.float32)
        named[:, :FIRST_PLACE], value[:, :FIRST_PLACE] = np.arange(FIRST_PLACE), FLOOR
        named[query, column], value[query, column] = place, candidate.astype(np.float32)
        level_value = np.where(has[:, None], tail.share[None, :] + offset[:, None], tail.share[None, :])
        count = np.tile(np.diff(tail.start), (n, 1))
        np.add.at(count, (query, tail.level[place]), -1)
        return cls(tail, named, value, level_value.astype(np.float32), count)

    def with_new_place(self, p_new: np.ndarray) -> SparseAnswers:
        """:func:`nextloc.routine.novelty.with_new_place` of these answers: ``P(new)`` on class 1, the places
        times ``1 - P(new)``, class 0 at -40."""
        value, level = self.value.astype(np.float64), self.level_value.astype(np.float64)
        is_place = self.named >= FIRST_PLACE
        places = np.where(is_place, value, -np.inf)
        levels = np.where(self.count > 0, level, -np.inf)
        top = np.maximum(places.max(axis=1), levels.max(axis=1))[:, None]
        top = np.where(np.isfinite(top), top, 0.0)
        total = np.exp(places - top).sum(axis=1) + (self.count * np.exp(levels - top)).sum(axis=1)
        norm = top + np.log(total)[:, None]
        p = np.clip(np.asarray(p_new, dtype=np.float64), 1e-12, 1 - 1e-12)[:, None]
        out = np.where(is_place, value - norm + np.log1p(-p), -np.inf)
        out[:, UNSEEN], out[:, PAD] = np.log(p[:, 0]), -40.0
        levels_out = (level - norm + np.log1p(-p)).astype(np.float32)
        return replace(self, value=out.astype(np.float32), level_value=levels_out)

    def target_value(self, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(B,)`` each target's value and whether the answer names it (else it is in the tail)."""
        hit = self.named == np.asarray(target)[:, None]
        is_named = hit.any(axis=1)
        rows = np.arange(len(self))
        tail_level = self.tail.level[np.where(is_named, FIRST_PLACE, target)]
        value = np.where(is_named, self.value[rows, hit.argmax(axis=1)], self.level_value[rows, tail_level])
        return value, is_named

    def ranks(self, target: np.ndarray, first: int = PAD) -> np.ndarray:
        """``(B,)`` 1-based rank of each target among the classes from ``first`` (ties: the lower class first,
        as :func:`~nextloc.evaluation.tensor_metrics.target_ranks`); 0 where the target is below ``first``."""
        target = np.asarray(target, dtype=np.int64)
        t, _ = self.target_value(target)
        kept = self.named >= first
        value, level, count = self.value, self.level_value, self.count
        higher = (kept & (value > t[:, None])).sum(axis=1) + (count * (level > t[:, None])).sum(axis=1)
        tied = (kept & (value == t[:, None]) & (self.named < target[:, None])).sum(axis=1)
        rows, lv = np.nonzero((level == t[:, None]) & (count > 0))
        if len(rows):
            below = self.tail.members_below(lv, target[rows])
            named = self.named[rows]
            named_level = np.where(named >= FIRST_PLACE, self.tail.level[np.maximum(named, 0)], -1)
            below -= ((named_level == lv[:, None]) & (named < target[rows, None])).sum(axis=1)
            np.add.at(tied, rows, below)
        return np.where(target >= first, 1 + higher + tied, 0)

    def top(self, first: int = PAD) -> tuple[np.ndarray, np.ndarray]:
        """``(B,)`` each answer's top class from ``first`` (the lowest among ties) and its value."""
        value = np.where(self.named >= first, self.value, -np.inf)
        level = np.where(self.count > 0, self.level_value, -np.inf)
        best = np.maximum(value.max(axis=1), level.max(axis=1))
        top = np.where(value == best[:, None], self.named, np.iinfo(np.int64).max).min(axis=1)
        for row, lv in zip(*np.nonzero(level == best[:, None]), strict=True):
            top[row] = min(top[row], self.tail.first_free(int(lv), self.named[row]))
        return top, best

    def probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """``(B, K)`` and ``(B, L)`` float64: a softmax over every class of the values (a level's value is each
        of its places')."""
        value, level = self.value.astype(np.float64), self.level_value.astype(np.float64)
        level = np.where(self.count > 0, level, -np.inf)
        top = np.maximum(value.max(axis=1), level.max(axis=1))[:, None]
        named, levels = np.exp(value - top), np.exp(level - top)
        total = (named.sum(axis=1) + (self.count * levels).sum(axis=1))[:, None]
        return named / total, levels / total

    def novelty_scores(self, loc: np.ndarray) -> np.ndarray:
        """``(B, 4)`` the head's inputs read from the answer (:data:`nextloc.routine.novelty.FEATURES`' first
        four: P(class 1), the places' normalised entropy, their top probability, the history's place mass)
        for histories ``loc`` ``(B, T)`` (0-padded), as :func:`~nextloc.routine.novelty.novelty_features`."""
        named, levels = self.probabilities()
        is_place = self.named >= FIRST_PLACE
        places = np.where(is_place, named, 0.0)
        mass = places.sum(axis=1) + (self.count * levels).sum(axis=1)
        share, level_share = (
            places / np.maximum(mass, 1e-12)[:, None],
            levels / np.maximum(mass, 1e-12)[:, None],
        )

        def plogp(p: np.ndarray) -> np.ndarray:
            return p * np.log(np.maximum(p, 1e-12))

        entropy = -(plogp(share).sum(axis=1) + (self.count * plogp(level_share)).sum(axis=1))
        entropy /= np.log(max(self.tail.num_classes - FIRST_PLACE, 2))
        top = np.maximum(share.max(axis=1), np.where(self.count > 0, level_share, 0.0).max(axis=1))
        history = self._history_probability(loc, named, levels)
        features = [named[:, UNSEEN], entropy, top, history / np.maximum(mass, 1e-12)]
        return np.stack(features, axis=-1).astype(np.float32)

    def _history_probability(self, loc: np.ndarray, named: np.ndarray, levels: np.ndarray) -> np.ndarray:
        """``(B,)`` the probability of the distinct places of each history."""
        loc = np.asarray(loc, dtype=np.int64)
        ordered = np.sort(loc, axis=1)
        first_of_kind = np.ones(ordered.shape, dtype=bool)
        first_of_kind[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
        rows, columns = np.nonzero(first_of_kind & (ordered >= FIRST_PLACE))
        places = ordered[rows, columns]
        match = self.named[rows] == places[:, None]
        in_named = match.any(axis=1)
        p = np.where(
            in_named,
            named[rows, match.argmax(axis=1)],
            levels[rows, self.tail.level[places]],
        )
        return np.bincount(rows, weights=p, minlength=len(loc))

    def set_outcomes(
        self, target: np.ndarray, levels: tuple[float, ...], tolerance: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per answer and level: whether the target is in the fewest classes from 1 whose probabilities hold
        the level, and their number (:func:`nextloc.evaluation.metrics.set_outcomes`)."""
        named, level_p = np.exp(self.value.astype(np.float64)), np.exp(self.level_value.astype(np.float64))
        p = np.concatenate([np.where(self.named >= UNSEEN, named, 0.0), level_p], axis=1)
        count = np.concatenate([(self.named >= UNSEEN).astype(np.int64), self.count], axis=1)
        order = np.argsort(-p, axis=1, kind="stable")
        p, count = np.take_along_axis(p, order, axis=1), np.take_along_axis(count, order, axis=1)
        before = np.cumsum(p * count, axis=1) - p * count  # the mass held before each column's places
        positive = (count * (p > 0)).sum(axis=1)
        position = self.ranks(target, first=UNSEEN) - 1
        sizes = []
        for level in levels:
            room = level - tolerance - before
            with np.errstate(divide="ignore", invalid="ignore"):
                below = np.where(p > 0, np.ceil(room / p) - 1, np.where(room > 0, np.inf, 0))
            below = np.clip(below, 0, count).sum(axis=1).astype(np.int64)
            sizes.append(np.minimum(below + 1, np.maximum(positive, 1)))
        size = np.stack(sizes, axis=1)
        covered = (position[:, None] < size) & (np.asarray(target)[:, None] >= UNSEEN)
        return covered, size
