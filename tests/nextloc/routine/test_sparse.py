"""A routine kind's sparse answers read as its ``(B, V)`` answers are: the same ranks, top answers, one
distribution, answer sets, and the new-place head's inputs to within float32 rounding (the whole route on
GeoLife: tests/nextloc/routine/test_data.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nextloc.evaluation.metrics import SET_LEVELS, SET_TOLERANCE, set_outcomes
from nextloc.evaluation.tensor_metrics import place_ranks, target_ranks
from nextloc.models.batch import Batch
from nextloc.routine.calibration import Calibration
from nextloc.routine.novelty import history_features, novelty_features, with_new_place
from nextloc.routine.ranking import CandidateSet, log_probabilities
from nextloc.routine.sparse import SparseAnswers, Tail


def questions(rng: np.random.Generator, v: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` questions over ``v`` classes, each with 0 to 8 distinct candidate places and coarse scores
    (ties among candidates too)."""
    query, place = [], []
    for q in range(n):
        k = int(rng.integers(0, min(8, v - 2) + 1))
        place += list(rng.choice(np.arange(2, v), k, replace=False))
        query += [q] * k
    scores = rng.normal(size=len(query)).round(1)
    return np.array(query, dtype=np.int64), np.array(place, dtype=np.int64), scores


def histories(rng: np.random.Generator, v: int, n: int) -> np.ndarray:
    """``(n, 5)`` right-padded histories of 1 to 5 classes from 1."""
    loc = rng.integers(1, v, (n, 5))
    length = rng.integers(1, 6, n)
    return np.where(np.arange(5)[None, :] < length[:, None], loc, 0)


def batch_of(loc: np.ndarray, target: np.ndarray) -> Batch:
    n, as_tensor = len(loc), torch.from_numpy
    return Batch(
        *(as_tensor(loc) for _ in range(5)),
        user=torch.zeros(n, dtype=torch.long),
        lengths=as_tensor((loc > 0).sum(axis=1)),
        target=as_tensor(target),
        index=torch.arange(n),
    )


@pytest.mark.parametrize("case", range(40))
def test_sparse_answers_read_as_the_dense_ones(case: int) -> None:
    rng = np.random.default_rng(case)
    v, n = int(rng.integers(3, 300)), int(rng.integers(1, 60))
    popularity = rng.integers(0, 6, v).astype(float)  # few distinct weights: many places per level
    power = float(rng.choice([0.0, 0.5, 1.0]))  # 0: every place on one level
    calibration = Calibration(float(rng.uniform(0.5, 2)), float(rng.uniform(0.01, 0.5)), power)
    query, place, scores = questions(rng, v, n)
    candidates = CandidateSet(query, place, np.zeros((len(query), 1)), np.zeros((n, 1)), n)
    dense = log_probabilities(candidates, scores, popularity, calibration)
    sparse = SparseAnswers.of_candidates(
        Tail.of(popularity, calibration), query, place, scores, n, calibration
    )
    target = rng.integers(1, v, n)

    ranks, top1 = target_ranks(torch.from_numpy(dense), torch.from_numpy(target))
    places, place_top1 = place_ranks(torch.from_numpy(dense), torch.from_numpy(target))
    assert sparse.ranks(target).tolist() == ranks.tolist()
    assert sparse.ranks(target, 2).tolist() == places.tolist()
    assert sparse.top()[0].tolist() == top1.tolist()
    assert sparse.top(2)[0].tolist() == place_top1.tolist()

    loc = histories(rng, v, n)
    features = np.concatenate([sparse.novelty_scores(loc), history_features(loc)], axis=1)
    np.testing.assert_allclose(
        features, novelty_features(torch.from_numpy(dense), batch_of(loc, target)), atol=1e-6
    )

    p_new = rng.uniform(0.01, 0.9, n)
    one, sparse_one = with_new_place(dense, p_new), sparse.with_new_place(p_new)
    named = sparse_one.named >= 0
    assert (
        np.take_along_axis(one, np.maximum(sparse_one.named, 0), axis=1)[named] == sparse_one.value[named]
    ).all()
    ranks, top1 = target_ranks(torch.from_numpy(one), torch.from_numpy(target))
    assert sparse_one.ranks(target).tolist() == ranks.tolist()
    top, value = sparse_one.top()
    assert top.tolist() == top1.tolist()
    assert (value == one.max(axis=1)).all()
    covered, size = set_outcomes(np.exp(one.astype(np.float64)), target, SET_LEVELS)
    sparse_covered, sparse_size = sparse_one.set_outcomes(target, SET_LEVELS, SET_TOLERANCE)
    assert (sparse_covered == covered).all()
    assert (sparse_size == size).all()


def test_a_tail_target_ties_with_its_level_and_the_lower_places_go_first() -> None:
    popularity = np.array([0, 0, 3, 1, 1, 1, 1, 1], dtype=float)  # places 3..7 on one level
    calibration = Calibration(1.0, 0.2, 1.0)
    query, place, scores = np.array([0]), np.array([4]), np.array([1.0])
    sparse = SparseAnswers.of_candidates(
        Tail.of(popularity, calibration), query, place, scores, 1, calibration
    )
    # 4 (the candidate), 2 (more popular), then 3, 5, 6: place 6 is 5th among the places
    assert sparse.ranks(np.array([6]), 2).tolist() == [5]
    assert sparse.top(2)[0].tolist() == [4]
    assert sparse.count[0].tolist() == [4, 1]  # place 4 is named: 4 places left on its level
