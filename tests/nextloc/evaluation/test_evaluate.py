"""nextloc.evaluation.evaluate and nextloc.routine.novelty: scoring, the new-place head, summaries and the champion rule's test."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nextloc.evaluation.champion import champion_decision, paired_bootstrap
from nextloc.evaluation.evaluate import evaluate, model_scores, retest, score_split
from nextloc.evaluation.leaderboard import format_summary, leaderboard, rank_board, summarise
from nextloc.evaluation.metrics import METRIC_KEYS, RESULT_KEYS, SET_KEYS, SET_LEVELS, answer_sets
from nextloc.models import build_model
from nextloc.models.baselines import BaselineModule
from nextloc.models.batch import Batch
from nextloc.models.packed import pack_batch
from nextloc.models.registry import KINDS, kinds
from nextloc.models.scorer import PackedScorer
from nextloc.routine.novelty import (
    FEATURES,
    ROUTINE_FEATURES,
    NewPlaceHead,
    novelty_features,
    with_new_place,
)

V, U = 9, 4
BASELINES = {k: KINDS[k].model_class for k in kinds("baseline")}
NETWORKS = kinds("neural")


def _batch(loc: list[list[int]], user: list[int] | None = None) -> Batch:
    width = max(len(row) for row in loc)
    padded = torch.tensor([row + [0] * (width - len(row)) for row in loc])
    lengths = torch.tensor([len(row) for row in loc])
    zeros = torch.zeros_like(padded)
    return Batch(
        loc=padded,
        time=zeros,
        weekday=zeros,
        duration=zeros,
        diff=zeros,
        user=torch.tensor(user or [1] * len(loc)),
        lengths=lengths,
        target=torch.zeros(len(loc), dtype=torch.long),
        index=torch.arange(len(loc)),
    )


# --------------------------------------------------------------------------- #
# novelty features and the new-place head
# --------------------------------------------------------------------------- #


class TestNoveltyFeatures:
    def test_by_hand(self):
        """Scores log([0, 0.2, 0.4, 0.4, 0]) (V = 5): P(unseen) 0.2; places 2, 3 at 0.5 each -> entropy
        log 2 / log 3, top 0.5. History [2, 1, 2]: mass on history places 0.4 / 0.8 = 0.5, unseen share 1/3,
        last not unseen, distinct {1, 2} / 3, log length log 3."""
        probs = torch.tensor([[1e-30, 0.2, 0.4, 0.4, 1e-30]])
        feats = novelty_features(probs.log(), _batch([[2, 1, 2]]))
        assert feats.shape == (1, len(FEATURES))
        got = dict(zip(FEATURES, feats[0].tolist(), strict=True))
        assert got["model_p_unseen"] == pytest.approx(0.2)
        assert got["model_place_entropy"] == pytest.approx(math.log(2) / math.log(3), abs=1e-5)
        assert got["model_top_place_p"] == pytest.approx(0.5)
        assert got["model_history_place_mass"] == pytest.approx(0.5)
        assert got["history_unseen_share"] == pytest.approx(1 / 3)
        assert got["history_last_unseen"] == 0.0
        assert got["history_distinct_share"] == pytest.approx(2 / 3)
        assert got["history_log_length"] == pytest.approx(math.log(3))

    def test_padding_is_ignored(self):
        scores = torch.randn(2, V)
        one = novelty_features(scores[:1], _batch([[3, 1]]))
        padded = novelty_features(scores, _batch([[3, 1], [4, 4, 5, 6]]))
        assert torch.allclose(one[0], padded[0])
        assert padded[0, FEATURES.index("history_last_unseen")] == 1.0


class TestNewPlaceHead:
    def test_learns_a_separating_feature_and_round_trips(self):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(400, len(FEATURES)))
        y = x[:, 4] + 0.3 * rng.normal(size=400) > 0.5
        head = NewPlaceHead.fit(x, y)
        p = head.predict(x)
        assert p.shape == (400,)
        assert ((p > 0) & (p < 1)).all()
        assert p[y].mean() > 0.7 > 0.2 > p[~y].mean()
        assert np.argmax(np.abs(head.coef)) == 4
        again = NewPlaceHead.from_dict(head.to_dict())
        np.testing.assert_array_equal(again.predict(x), p)
        assert head.n_fit == 400
        assert head.rate_fit == pytest.approx(y.mean())

    def test_is_deterministic(self):
        rng = np.random.default_rng(1)
        x = rng.normal(size=(100, len(FEATURES)))
        y = rng.random(100) < 0.3
        assert NewPlaceHead.fit(x, y) == NewPlaceHead.fit(x, y)

    def test_single_outcome_gives_the_observed_rate(self):
        x = np.zeros((10, len(FEATURES)))
        assert NewPlaceHead.fit(x, np.zeros(10, bool)).predict(x) == pytest.approx(np.full(10, 1e-3))
        assert NewPlaceHead.fit(x, np.ones(10, bool)).predict(x) == pytest.approx(np.full(10, 1 - 1e-3))

    def test_bad_input(self):
        with pytest.raises(ValueError, match="no sample"):
            NewPlaceHead.fit(np.zeros((0, len(FEATURES))), np.zeros(0, bool))
        with pytest.raises(ValueError, match="features must be"):
            NewPlaceHead.fit(np.zeros((3, 2)), np.zeros(3, bool))
        head = NewPlaceHead.constant(0.2)
        with pytest.raises(ValueError, match="features must be"):
            head.predict(np.zeros((1, 3)))
        bad = {**head.to_dict(), "features": ["x"]}
        with pytest.raises(ValueError, match="built for features"):
            NewPlaceHead.from_dict(bad)


# --------------------------------------------------------------------------- #
# evaluate
# --------------------------------------------------------------------------- #


@pytest.fixture
def splits(make_samples):
    """Val and test with new places (target 1) and known ones; histories hold 1s as in the real data."""
    histories = [[2, 3, 2], [1, 4], [5, 5, 6], [1, 1, 3], [2, 7], [8, 1, 2], [3, 3], [1, 6, 1]]
    val = make_samples(users=[1, 1, 2, 2, 3, 3, 1, 2], histories=histories, targets=[2, 1, 5, 1, 7, 2, 3, 1])
    test = make_samples(users=[2, 2, 1, 3, 3, 1], histories=histories[:6], targets=[3, 1, 6, 1, 2, 8])
    return val, test


class TestEvaluate:
    def test_reports_both_families_and_p_new_on_test(self, splits):
        val, test = splits
        model = BaselineModule(BASELINES["most_frequent"](V).fit(val))
        evaluation = evaluate(model_scores(model), model_scores(model), val, test, batch_size=4)
        assert list(evaluation.test) == [*METRIC_KEYS, *SET_KEYS]
        assert "new_place_auc" not in evaluation.val  # the head is fit on validation
        assert evaluation.val["new_place_rate"] == pytest.approx(300 / 8)
        assert evaluation.test["n"] == 6
        assert evaluation.test_p_new.shape == (6,)
        frame = evaluation.per_sample()
        assert frame["index"].tolist() == list(range(6))
        assert frame["target"].tolist() == [3, 1, 6, 1, 2, 8]
        assert frame["place_mrr"].mean() == pytest.approx(evaluation.test["place_mrr"])
        assert evaluation.per_user["n"].sum() == 6

    def test_joint_scores_one_distribution_with_the_heads_p_new(self, splits):
        """joint: the metrics read P(new) on class 1 and the places times 1 - P(new); the place metrics keep
        the model's own ranking, the reference metrics can credit "a new place"."""
        val, test = splits
        model = BaselineModule(BASELINES["most_frequent"](V).fit(val))
        own = evaluate(model_scores(model), model_scores(model), val, test, batch_size=4)
        joint = evaluate(model_scores(model), model_scores(model), val, test, batch_size=4, joint=True)
        for key in ("place_acc@1", "place_mrr", "new_place_auc", "new_place_brier"):
            assert joint.test[key] == pytest.approx(own.test[key])
        np.testing.assert_allclose(joint.test_p_new, own.test_p_new)
        assert 0 <= joint.test["top1_ece"] <= 1
        assert "top1_ece" not in own.test
        assert sum(row["n"] for row in joint.val_reliability) == len(val)
        scored = score_split(model_scores(model), test, batch_size=4, head=joint.head)
        p_new = joint.head.predict(scored.features)
        top1 = scored.accumulator.per_sample()["acc@1"].to_numpy() > 0
        is_new = scored.accumulator.targets() == 1
        np.testing.assert_array_equal(top1, scored.top_hit)
        assert (top1 & is_new).any()  # "a new place" answered and credited
        np.testing.assert_allclose(scored.top_p[top1 & is_new], p_new[top1 & is_new], rtol=1e-5)

    def test_answer_sets_are_measured_on_the_answers_distribution(self, splits):
        """Test's ``set_*`` metrics: the answer sets of the places times 1 - P(new) and the head's P(new),
        the same whether the metrics read that distribution (joint) or the model's own scores."""
        val, test = splits
        model = BaselineModule(BASELINES["most_frequent"](V).fit(val))
        own = evaluate(model_scores(model), model_scores(model), val, test, batch_size=4)
        joint = evaluate(model_scores(model), model_scores(model), val, test, batch_size=4, joint=True)
        batch = next(test.batches(len(test)))
        with torch.no_grad():
            scores = model_scores(model)(batch)
        p_new = own.head.predict(novelty_features(scores, batch).numpy().astype(np.float64))
        probs = np.exp(with_new_place(scores.numpy(), p_new).astype(np.float64))
        for level in SET_LEVELS:
            coverage, size = answer_sets(probs, batch.target.numpy(), level)
            name = round(level * 100)
            assert own.test[f"set_coverage_{name}"] == pytest.approx(coverage)
            assert own.test[f"set_size_{name}"] == pytest.approx(size)
        assert {k: joint.test[k] for k in SET_KEYS} == pytest.approx({k: own.test[k] for k in SET_KEYS})
        assert not set(SET_KEYS) & set(own.val)  # measured on test only

    @pytest.mark.parametrize("joint", [False, True])
    def test_retest_reports_what_evaluate_with_the_other_explore_reports_on_test(self, splits, joint):
        """retest() fits another head on validation's kept features with other explore features and scores
        test once: the same test metrics as a whole evaluate() with those explore features."""
        val, test = splits
        model = BaselineModule(BASELINES["most_frequent"](V).fit(val))
        rng, width = np.random.default_rng(0), len(ROUTINE_FEATURES) - len(FEATURES)  # a routine kind's
        first = (rng.normal(size=(len(val), width)), rng.normal(size=(len(test), width)))
        other = (rng.normal(size=(len(val), width)), rng.normal(size=(len(test), width)))
        score = model_scores(model)
        evaluation = evaluate(score, score, val, test, batch_size=4, explore=first, joint=joint)
        expected = evaluate(score, score, val, test, batch_size=4, explore=other, joint=joint).test
        assert retest(evaluation, score, test, other, batch_size=4, joint=joint) == expected
        assert retest(evaluation, score, test, first, batch_size=4, joint=joint) == evaluation.test
        assert expected != evaluation.test  # the explore features are read

    @pytest.mark.parametrize("kind", [*NETWORKS, *BASELINES])
    def test_no_model_names_pad_or_unseen_as_a_place(self, kind, splits):
        """Histories full of 1s make class 1 the most likely class for copy models; places never include it."""
        val, test = splits
        if kind in BASELINES:
            model = BaselineModule(BASELINES[kind](V).fit(val))
        else:
            torch.manual_seed(0)
            extra = {"max_seq_len": 8} if kind.startswith("pointer") else {}
            model = build_model(kind, V, U, **extra)
        scored = score_split(model_scores(model), test, batch_size=4)
        assert (scored.accumulator.place_top1() >= 2).all()
        place_ranks = scored.accumulator.place_ranks()
        targets = scored.accumulator.targets()
        assert (place_ranks[targets < 2] == 0).all()
        assert (place_ranks[targets >= 2] >= 1).all()


def test_pack_batch_round_trips_through_the_packed_scorer(make_samples):
    data = make_samples(users=[1, 2], histories=[[2, 3, 4], [5, 1]], targets=[3, 2])
    torch.manual_seed(0)
    model = build_model("mhsa", V, U).eval()
    batch = data.batch(torch.arange(2))
    with torch.no_grad():
        direct = model(batch).softmax(-1)
        packed = PackedScorer(model, log_prob_output=False)(pack_batch(batch))
    torch.testing.assert_close(direct, packed)


# --------------------------------------------------------------------------- #
# summaries
# --------------------------------------------------------------------------- #


def test_summarise_and_leaderboard():
    assert summarise([1.0, 3.0]) == {"mean": 2.0, "std": pytest.approx(math.sqrt(2)), "n": 2}
    assert summarise([5.0]) == {"mean": 5.0, "std": 0.0, "n": 1}
    assert summarise([float("nan"), 4.0])["n"] == 1
    rows = [
        ("a", {k: 10.0 for k in RESULT_KEYS}),
        ("b", {k: 20.0 for k in RESULT_KEYS}),
        ("a", {k: 12.0 for k in RESULT_KEYS}),
    ]
    board = leaderboard(rows)
    assert list(board) == ["a", "b"]
    assert board["a"]["place_acc@1"] == {"mean": 11.0, "std": pytest.approx(math.sqrt(2)), "n": 2}
    assert set(board["b"]) == set(RESULT_KEYS)
    assert rank_board(board, "place_acc@1") == ["b", "a"]
    assert format_summary(board["a"]["place_acc@1"]) == "11.00 ± 1.41"
    assert format_summary({"mean": 0.1234, "std": 0.0, "n": 1}, " +- ") == "0.123 +- 0.000"
    assert format_summary(None) == "-"


# --------------------------------------------------------------------------- #
# the champion rule
# --------------------------------------------------------------------------- #


class TestChampionRule:
    def test_bootstrap_of_identical_models_finds_nothing(self):
        a = np.random.default_rng(0).random(500) * 100
        out = paired_bootstrap(a, a.copy())
        assert out["delta"] == 0.0
        assert out["p_value"] == pytest.approx(1.0)

    def test_bootstrap_of_a_clear_gain(self):
        rng = np.random.default_rng(1)
        champion = (rng.random(2000) < 0.4) * 100.0
        challenger = np.where(rng.random(2000) < 0.1, 100.0, champion)  # 10% of misses become hits
        out = paired_bootstrap(challenger, champion)
        assert out["delta"] > 3
        assert out["p_value"] < 0.01
        assert out["ci_low"] < out["delta"] < out["ci_high"]

    def test_bootstrap_is_deterministic_and_checks_shapes(self):
        rng = np.random.default_rng(2)
        a, b = rng.random(100), rng.random(100)
        assert paired_bootstrap(a, b) == paired_bootstrap(a, b)
        with pytest.raises(ValueError, match="equal"):
            paired_bootstrap(a, b[:10])

    def test_no_champion_promotes(self):
        out = champion_decision(np.array([[100.0, 0.0], [0.0, 0.0]]), None)
        assert out["promoted"]
        assert out["reason"] == "no champion yet"
        assert out["challenger_score"] == pytest.approx(25.0)
        assert out["seeds"] == 2

    def test_a_small_but_real_gain_is_not_enough_without_the_minimum_effect(self):
        rng = np.random.default_rng(3)
        champion = (rng.random(20000) < 0.4) * 100.0
        challenger = np.where(rng.random(20000) < 0.004, 100.0, champion)  # +0.24 points, significant
        kept = champion_decision(challenger, champion, min_effect=0.5)
        assert not kept["promoted"]
        assert kept["p_value"] < 0.05
        assert "needs delta >= 0.5" in kept["reason"]
        assert champion_decision(challenger, champion, min_effect=0.1)["promoted"]

    def test_seed_mean_decides_and_groups_are_reported(self):
        """Seed 0 alone would win by 50 points on samples 0-1; averaged with seed 1 the gain is 25 points
        on the 'changed' group only."""
        champion = np.array([0.0, 0.0, 100.0, 100.0] * 50)
        seeds = np.stack([np.array([100.0, 100.0, 100.0, 100.0] * 50), champion])
        groups = np.array(["changed", "changed", "unchanged", "unchanged"] * 50)
        out = champion_decision(seeds, champion, groups, min_effect=0.5)
        assert out["delta"] == pytest.approx(25.0)
        assert out["groups"] == {
            "changed": {"n": 100, "delta": pytest.approx(50.0)},
            "unchanged": {"n": 100, "delta": 0.0},
        }
        assert out["promoted"]
        assert out["test"].startswith("paired bootstrap over 200 validation samples")


def test_the_head_reads_a_given_window_instead_of_the_samples_history(make_samples):
    """A routine kind's head reads each question's window anchored at its now: the features of a split
    scored with ``window`` are those of the same samples whose histories are that window."""
    window_rows = [[1, 1, 4, 2], [6], [3, 3, 3]]
    windowed = make_samples(users=[1, 2, 3], histories=window_rows, targets=[2, 1, 3])
    reference = make_samples(users=[1, 2, 3], histories=[[2], [5, 6, 5], [1, 3]], targets=[2, 1, 3])
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))

    def scores(batch: Batch) -> torch.Tensor:
        return logits[batch.index]

    window = np.zeros((3, 4), dtype=np.int64)
    for i, row in enumerate(window_rows):
        window[i, : len(row)] = row
    got = score_split(scores, reference, batch_size=2, window=window).features
    np.testing.assert_array_equal(got, score_split(scores, windowed, batch_size=2).features)
    assert not np.array_equal(got, score_split(scores, reference, batch_size=2).features)
