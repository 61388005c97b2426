"""The routine kinds: answers as probabilities, the rule's weights chosen on validation, the ranker's fit
and its state as plain text (the whole route on the real GeoLife sample: tests/flows/test_predict_flow.py)."""

from __future__ import annotations

import numpy as np
import pytest

from nextloc.routine.calibration import FALLBACK_MASS
from nextloc.routine.features import CANDIDATE_FEATURES, EXPLORE_FEATURES
from nextloc.routine.novelty import with_new_place
from nextloc.routine.ranking import (
    FLOOR,
    RULE_FEATURES,
    Calibration,
    CandidateSet,
    RoutineRanker,
    RoutineRule,
    candidate_mrr,
    log_probabilities,
)


def candidate_set(rng: np.random.Generator, n: int, per_query: int = 5, signal: str = "share_slot"):
    """``n`` questions with ``per_query`` candidates (places 2..) each; the target is the candidate with the
    highest ``signal`` feature, the other features are noise."""
    query = np.repeat(np.arange(n), per_query)
    place = np.tile(np.arange(2, 2 + per_query), n)
    features = rng.random((len(query), len(CANDIDATE_FEATURES)))
    column = features[:, CANDIDATE_FEATURES.index(signal)].reshape(n, per_query)
    target = column.argmax(axis=1) + 2
    return CandidateSet(query, place, features, np.zeros((n, len(EXPLORE_FEATURES))), n), target


def test_answers_are_probabilities_over_places() -> None:
    candidates = CandidateSet(
        query=np.array([0, 0, 2]),
        place=np.array([3, 5, 4]),
        features=np.zeros((3, len(CANDIDATE_FEATURES))),
        explore=np.zeros((3, len(EXPLORE_FEATURES))),
        n=3,
    )
    popularity = np.array([0, 0, 10, 5, 1, 0, 3], dtype=float)
    logp = log_probabilities(candidates, np.array([2.0, 1.0, 0.0]), popularity).astype(np.float64)
    p = np.exp(logp)
    assert (logp[:, :2] == FLOOR).all()  # no answer is "padding" or "somewhere new"
    np.testing.assert_allclose(p[:, 2:].sum(axis=1), 1.0, atol=1e-6)
    assert p[0, 3] + p[0, 5] == pytest.approx(1 - FALLBACK_MASS, rel=1e-6)
    assert p[0, 3] / p[0, 5] == pytest.approx(np.e, rel=1e-5)  # a softmax of the scores
    assert p[2, 4] == pytest.approx(1 - FALLBACK_MASS, rel=1e-6)
    # a question without a candidate: the places by popularity (+1 each)
    expected = (popularity[2:] + 1) / (popularity[2:] + 1).sum()
    np.testing.assert_allclose(p[1, 2:], expected, rtol=1e-5)


def test_candidate_mrr_counts_a_missing_target_as_zero() -> None:
    candidates = CandidateSet(
        np.array([0, 0, 1]), np.array([2, 3, 2]), np.zeros((3, 1)), np.zeros((2, 1)), n=2
    )
    # question 0: target 3 ranks second; question 1: target 4 is no candidate
    assert candidate_mrr(candidates, np.array([1.0, 0.0, 1.0]), np.array([3, 4])) == pytest.approx(25.0)
    # ties go to the lower place id, as in nextloc.evaluation.metrics
    assert candidate_mrr(candidates, np.array([1.0, 1.0, 1.0]), np.array([3, 4])) == pytest.approx(25.0)


def test_the_rule_chooses_its_weights_on_validation() -> None:
    val, target = candidate_set(np.random.default_rng(0), 300, signal="share_slot")
    start = candidate_mrr(val, RoutineRule().scores(val), target)
    rule = RoutineRule().fit(val, target)
    assert candidate_mrr(val, rule.scores(val), target) > start
    assert rule.weights["share_slot"] == max(
        rule.weights[name] for name in RULE_FEATURES if name != "is_current"
    )
    assert RoutineRule.from_state(rule.state()).weights == rule.weights
    with pytest.raises(ValueError, match="unknown routine rule weights"):
        RoutineRule({"share_slto": 1.0})


def test_the_ranker_learns_and_reads_back_from_text() -> None:
    pytest.importorskip("lightgbm")
    rng = np.random.default_rng(1)
    train, train_target = candidate_set(rng, 400, signal="share_transition")
    val, val_target = candidate_set(rng, 200, signal="share_transition")
    ranker = RoutineRanker(seed=0).fit(train, train_target, val, val_target)
    assert candidate_mrr(val, ranker.scores(val), val_target) > 90
    state = ranker.state()
    assert isinstance(state["model"], str)  # LightGBM's text format: nothing pickled
    np.testing.assert_array_equal(RoutineRanker.from_state(state).scores(val), ranker.scores(val))
    again = RoutineRanker(seed=0).fit(train, train_target, val, val_target)
    assert again.state()["model"] == state["model"]  # the same seed fits the same trees


def test_calibration_is_the_maximum_likelihood_on_validation() -> None:
    """The temperature and fallback mass minimise validation's log-loss over known-place targets; a new
    place's target (1) is left to the new-place head."""
    rng = np.random.default_rng(3)
    n, k = 4000, 4
    query, place = np.repeat(np.arange(n), k), np.tile(np.arange(2, 2 + k), n)
    scores = rng.normal(size=n * k) * 2.0
    logits = (scores / 0.5).reshape(n, k)  # the true temperature is 0.5
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    target = 2 + (probs.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1)
    target[:400] = 9  # a known place that is not a candidate: 10% of the known targets
    target[400:500] = 1  # new places: not counted
    candidates = CandidateSet(query, place, np.zeros((n * k, 1)), np.zeros((n, 1)), n)
    popularity = np.ones(12)
    popularity[9] = 50.0  # the place outside the candidates is popular: the power that follows popularity
    calibration = Calibration.fit(candidates, scores, target, popularity)
    assert calibration.popularity_power == 1.0
    assert Calibration.fit(candidates, scores, target).popularity_power == 1.0
    assert calibration.temperature == pytest.approx(0.5, rel=0.1)
    assert calibration.fallback_mass == pytest.approx(400 / 3900, rel=1e-4)
    logp = log_probabilities(candidates, scores, popularity, calibration).astype(np.float64)
    known = target >= 2

    def loss(c: Calibration) -> float:
        lp = log_probabilities(candidates, scores, popularity, c).astype(np.float64)
        return float(-lp[np.arange(n)[known], target[known]].mean())

    best = loss(calibration)
    assert best == pytest.approx(float(-logp[np.arange(n)[known], target[known]].mean()))
    t, m = calibration.temperature, calibration.fallback_mass
    for other in (Calibration(), Calibration(0.6, m), Calibration(t, 0.2), Calibration(t, m, 0.0)):
        assert loss(other) > best
    again = Calibration.from_state(calibration.state())
    assert again == calibration
    assert Calibration.from_state(None) == Calibration()


def test_scorer_state_keeps_its_calibration() -> None:
    rule = RoutineRule(calibration=Calibration(0.8, 0.05))
    assert RoutineRule.from_state(rule.state()).calibration == Calibration(0.8, 0.05)
    # a state written before calibration answers as before
    assert RoutineRule.from_state({"weights": rule.weights}).calibration == Calibration()


def test_one_distribution_over_places_and_a_new_place() -> None:
    candidates = CandidateSet(
        np.array([0, 0, 1]), np.array([3, 5, 3]), np.zeros((3, 1)), np.zeros((2, 1)), n=2
    )
    logp = log_probabilities(candidates, np.array([2.0, 1.0, 0.0]), np.ones(7), Calibration(0.5, 0.1))
    p_new = np.array([0.844, 0.01])
    joint = np.exp(with_new_place(logp, p_new).astype(np.float64))
    np.testing.assert_allclose(joint[:, 1:].sum(axis=1), 1.0, atol=1e-6)  # one distribution
    np.testing.assert_allclose(joint[:, 1], p_new, rtol=1e-6)
    np.testing.assert_allclose(joint[:, 2:].sum(axis=1), 1 - p_new, rtol=1e-6)
    assert joint[0, 3] + joint[0, 5] == pytest.approx((1 - 0.844) * 0.9, rel=1e-5)
    assert joint[0, 3] / joint[0, 5] == pytest.approx(np.e**2, rel=1e-4)  # temperature 0.5
    assert joint[0].argmax() == 1
    assert joint[1].argmax() == 3


def test_the_refit_keeps_the_rankers_choices_and_learns_from_both_splits() -> None:
    """ranker_refit: the trees chosen on validation, refit on train + val with the same seed and calibration."""
    pytest.importorskip("lightgbm")
    rng = np.random.default_rng(2)
    train, train_target = candidate_set(rng, 300, signal="share_place")
    val, val_target = candidate_set(rng, 300, signal="share_slot")  # validation teaches another signal
    ranker = RoutineRanker(seed=0).fit(train, train_target, val, val_target)
    ranker.calibration = Calibration(temperature=0.8)
    both = train.concat(val)
    assert both.n == 600
    assert both.query.max() == 599
    np.testing.assert_array_equal(both.query[len(train.query) :], val.query + 300)
    refit = ranker.refit(both, np.concatenate([train_target, val_target]))
    assert refit.best_iteration == ranker.best_iteration
    assert refit.seed == ranker.seed
    assert refit.calibration == ranker.calibration
    # it has seen validation's signal: better there than the ranker fit on train alone
    assert candidate_mrr(val, refit.scores(val), val_target) > candidate_mrr(
        val, ranker.scores(val), val_target
    )
    again = ranker.refit(both, np.concatenate([train_target, val_target]))
    assert again.state() == refit.state()  # deterministic
    np.testing.assert_array_equal(RoutineRanker.from_state(refit.state()).scores(val), refit.scores(val))


def test_a_selection_of_questions_keeps_their_candidates_in_order() -> None:
    rng = np.random.default_rng(3)
    candidates, target = candidate_set(rng, 6, per_query=3)
    keep = np.array([True, False, True, True, False, False])
    part = candidates.select(keep)
    assert part.n == 3
    np.testing.assert_array_equal(part.query, np.repeat([0, 1, 2], 3))
    rows = keep[candidates.query]
    np.testing.assert_array_equal(part.features, candidates.features[rows])
    np.testing.assert_array_equal(part.place, candidates.place[rows])
    assert candidate_mrr(part, part.column("share_slot"), target[keep]) == 100.0
    rest = candidates.select(~keep)
    both = part.concat(rest)
    assert both.n == candidates.n
    assert len(both.query) == len(candidates.query)


def test_answerable_questions_keep_the_ranking_rows_once() -> None:
    """A training split keeps only the candidates of questions whose target is among them: the rows a
    ranker fits on, the same as the whole set's, and read without a copy."""
    rng = np.random.default_rng(4)
    candidates, target = candidate_set(rng, 8, per_query=3)
    target[[1, 5]] = 40  # not a candidate: no ranking signal
    answerable = candidates.answerable(target)
    assert answerable.n == candidates.n
    assert set(answerable.query) == {0, 2, 3, 4, 6, 7}
    for got, expected in zip(answerable.ranking_rows(target), candidates.ranking_rows(target), strict=True):
        np.testing.assert_array_equal(got, expected)
    assert answerable.ranking_rows(target)[0] is answerable.features
    ranker = RoutineRanker(0).fit(
        answerable, target, *candidate_set(np.random.default_rng(5), 8, per_query=3)
    )
    whole = RoutineRanker(0).fit(candidates, target, *candidate_set(np.random.default_rng(5), 8, per_query=3))
    assert ranker.state()["model"] == whole.state()["model"]


def test_a_routine_state_is_read_back_by_its_registry_entry_and_another_kind_is_refused() -> None:
    from nextloc.models import registry
    from nextloc.routine.ranking import scorer_from_state

    rule = RoutineRule()
    assert isinstance(scorer_from_state("routine", rule.state()), RoutineRule)
    with pytest.raises(ValueError, match=r"'markov' is not a routine kind; expected one of \['routine'"):
        scorer_from_state("markov", {})
    assert registry.kinds("routine") == ("routine", "ranker", "ranker_refit")
