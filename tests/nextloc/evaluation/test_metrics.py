"""Tests for :mod:`nextloc.evaluation.metrics` (and its tensors, :mod:`nextloc.evaluation.tensor_metrics`): the rank convention,
every metric by hand, per-user results.

Convention under test: scores over the whole vocabulary (classes 0 and 1 included, nothing masked);
``rank = 1 + #(score > s_y) + #(score == s_y and index < y)`` (a stable descending sort); Acc@k = rank <= k;
MRR over the full ranking; NDCG@10 = 1/log2(rank+1) for rank <= 10; weighted F1 on the rank-1 class.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import f1_score

from nextloc.evaluation.metrics import (
    METRIC_KEYS,
    SET_KEYS,
    SET_LEVELS,
    answer_sets,
    fewest_holding,
    new_place_metrics,
    rank_metrics,
    reliability,
    set_metrics,
    set_outcomes,
    weighted_f1,
)
from nextloc.evaluation.tensor_metrics import MetricAccumulator, evaluate_scores, place_ranks, target_ranks


def _ranks(scores: list[list[float]], target: list[int]) -> list[int]:
    ranks, _ = target_ranks(torch.tensor(scores), torch.tensor(target))
    return ranks.tolist()


def _brute_force(scores: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent reference: the position of the target in a stable descending argsort."""
    order = torch.argsort(-scores.float(), dim=1, stable=True)
    ranks = (order == target[:, None]).nonzero()[:, 1] + 1
    return ranks, order[:, 0]


class TestTargetRanks:
    def test_ties_lower_index_ranks_first(self):
        """Scores [0, 2, 2, 1, 2]: the three 2s rank 1, 2, 3 by index, then class 3, then class 0."""
        scores = [[0.0, 2.0, 2.0, 1.0, 2.0]]
        assert [_ranks(scores, [y])[0] for y in range(5)] == [5, 1, 2, 4, 3]

    def test_target_tied_with_higher_index_only(self):
        """A target tied only with higher-index classes is not pushed down by them."""
        assert _ranks([[3.0, 1.0, 1.0, 1.0]], [1]) == [2]

    def test_target_tied_with_lower_index_only(self):
        """A target tied with two lower-index classes comes after both."""
        assert _ranks([[1.0, 1.0, 1.0, 0.0]], [2]) == [3]

    def test_classes_0_and_1_are_scored_like_any_class(self):
        """Padding (0) and unseen (1) are neither masked as targets nor as competitors."""
        scores = [[5.0, 4.0, 3.0, 6.0]]
        assert _ranks(scores, [0]) == [2]  # only class 3 is higher
        assert _ranks(scores, [1]) == [3]  # classes 3 and 0 are higher
        assert _ranks(scores, [2]) == [4]  # class 0 and class 1 both count against class 2

    def test_top1_is_lowest_index_among_maxima(self):
        _, top1 = target_ranks(
            torch.tensor([[1.0, 7.0, 3.0, 7.0], [9.0, 9.0, 9.0, 9.0]]), torch.tensor([0, 0])
        )
        assert top1.tolist() == [1, 0]

    @pytest.mark.parametrize("seed", range(5))
    def test_matches_stable_argsort_with_forced_ties(self, seed):
        """Random integer scores in 0..4 over 60 classes, so nearly every target is tied with others."""
        gen = torch.Generator().manual_seed(seed)
        scores = torch.randint(0, 5, (128, 60), generator=gen).float()
        target = torch.randint(0, 60, (128,), generator=gen)
        ranks, top1 = target_ranks(scores, target)
        expected_ranks, expected_top1 = _brute_force(scores, target)
        assert torch.equal(ranks, expected_ranks)
        assert torch.equal(top1, expected_top1)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_half_precision_scores(self, dtype):
        """fp16/bf16 scores rank exactly as their float32 upcast (rounding creates many ties)."""
        gen = torch.Generator().manual_seed(7)
        scores = (torch.randn(64, 300, generator=gen) * 3).to(dtype)
        target = torch.randint(0, 300, (64,), generator=gen)
        ranks, top1 = target_ranks(scores, target)
        expected_ranks, expected_top1 = _brute_force(scores.float(), target)
        assert torch.equal(ranks, expected_ranks)
        assert torch.equal(top1, expected_top1)
        assert len(scores[0].unique()) < 300  # the test does exercise ties

    def test_rejects_bad_shapes(self):
        with pytest.raises(ValueError, match=r"\(B, V\)"):
            target_ranks(torch.zeros(3), torch.zeros(3, dtype=torch.long))
        with pytest.raises(ValueError, match="targets"):
            target_ranks(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_on_cuda(self):
        scores = torch.randint(0, 4, (32, 50)).float()
        target = torch.randint(0, 50, (32,))
        ranks, _ = target_ranks(scores.cuda(), target)
        assert ranks.is_cuda
        assert torch.equal(ranks.cpu(), _brute_force(scores, target)[0])


class TestRankMetrics:
    def test_hand_computed(self):
        """Ranks 1, 2, 5, 12: Acc@1 1/4, Acc@5 3/4, Acc@10 3/4; rank 12 adds 1/12 to MRR and 0 to NDCG."""
        out = rank_metrics(np.array([1, 2, 5, 12]))
        assert out["acc@1"] == pytest.approx(25.0)
        assert out["acc@5"] == pytest.approx(75.0)
        assert out["acc@10"] == pytest.approx(75.0)
        assert out["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 5 + 1 / 12) / 4 * 100)
        assert out["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(6)) / 4 * 100)

    def test_rank_10_and_11_boundary(self):
        """Rank 10 still counts for Acc@10 and NDCG@10; rank 11 only for MRR."""
        ten = rank_metrics(np.array([10]))
        eleven = rank_metrics(np.array([11]))
        assert ten["acc@10"] == 100.0
        assert ten["ndcg@10"] == pytest.approx(100 / math.log2(11))
        assert eleven["acc@10"] == 0.0
        assert eleven["ndcg@10"] == 0.0
        assert eleven["mrr"] == pytest.approx(100 / 11)

    def test_empty(self):
        assert all(math.isnan(v) for v in rank_metrics(np.array([], dtype=np.int64)).values())


class TestMetricAccumulator:
    def test_rank_beyond_10(self):
        """Class i scores -i over 20 classes, so class i has rank i + 1; target 11 ranks 12."""
        acc = MetricAccumulator()
        acc.update(-torch.arange(20.0)[None, :], torch.tensor([11]))
        out = acc.compute()
        assert acc.ranks().tolist() == [12]
        assert out["acc@10"] == 0.0
        assert out["ndcg@10"] == 0.0
        assert out["mrr"] == pytest.approx(100 / 12)
        assert out["n"] == 1

    def test_metrics_by_hand_over_batches(self):
        """Two batches; ranks: 1 (class 0 target, top score), 3 (tied target after two lower indices),
        2 (class 1 target behind class 0), 1. Acc@1 50, Acc@5 100, MRR (1 + 1/3 + 1/2 + 1)/4."""
        acc = MetricAccumulator()
        acc.update(torch.tensor([[9.0, 1.0, 2.0], [5.0, 5.0, 5.0]]), torch.tensor([0, 2]))
        acc.update(torch.tensor([[3.0, 2.0, 1.0], [0.0, 0.0, 4.0]]), torch.tensor([1, 2]))
        out = acc.compute()
        assert acc.ranks().tolist() == [1, 3, 2, 1]
        assert acc.top1().tolist() == [0, 0, 0, 2]
        assert out["acc@1"] == pytest.approx(50.0)
        assert out["acc@5"] == pytest.approx(100.0)
        assert out["mrr"] == pytest.approx((1 + 1 / 3 + 1 / 2 + 1) / 4 * 100)
        assert out["ndcg@10"] == pytest.approx((1 + 1 / 2 + 1 / math.log2(3) + 1) / 4 * 100)
        assert out["n"] == 4
        # place ranks: row 0 (target 0) and row 2 (target 1) are misses; rows 1 and 3 rank class 2 first
        assert acc.place_ranks().tolist() == [0, 1, 0, 1]
        assert out["place_acc@1"] == pytest.approx(50.0)
        assert out["place_mrr"] == pytest.approx(50.0)
        assert out["new_place_rate"] == pytest.approx(25.0)
        assert set(out) == set(METRIC_KEYS) - {"new_place_auc", "new_place_brier"}

    def test_weighted_f1_by_hand(self):
        """y = [2, 2, 3, 3, 3, 4], top1 = [2, 3, 3, 3, 2, 5].

        class 2: tp 1, fp 1, fn 1 -> F1 1/2, support 2; class 3: tp 2, fp 1, fn 1 -> F1 2/3, support 3;
        class 4: F1 0, support 1; class 5: support 0 (weight 0). Weighted: (2·1/2 + 3·2/3) / 6 = 1/2 -> 50%.
        """
        y = [2, 2, 3, 3, 3, 4]
        top1 = [2, 3, 3, 3, 2, 5]
        scores = torch.zeros(6, 8)
        scores[torch.arange(6), torch.tensor(top1)] = 1.0
        acc = MetricAccumulator()
        acc.update(scores, torch.tensor(y))
        assert acc.top1().tolist() == top1
        assert acc.compute()["f1"] == pytest.approx(50.0)
        assert acc.compute()["f1"] == pytest.approx(
            100 * f1_score(y, top1, average="weighted", zero_division=0)
        )

    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=300),
    )
    def test_weighted_f1_is_sklearns_bit_for_bit(self, pairs):
        """Any targets and predictions (labels only predicted, only targeted, ties, one class): the same
        float as the reference's sklearn call, not merely close to it."""
        targets = np.array([t for t, _ in pairs], dtype=np.int64)
        predicted = np.array([p for _, p in pairs], dtype=np.int64)
        want = float(f1_score(targets, predicted, average="weighted", zero_division=0) * 100)
        assert weighted_f1(targets, predicted) == want

    def test_weighted_f1_of_a_split_is_sklearns_bit_for_bit(self):
        """A split-sized case: 3,500 samples over 1,200 classes, as GeoLife's test split."""
        rng = np.random.default_rng(0)
        targets = rng.integers(1, 1200, 3500)
        predicted = np.where(rng.random(3500) < 0.4, targets, rng.integers(2, 1200, 3500))
        want = float(f1_score(targets, predicted, average="weighted", zero_division=0) * 100)
        assert weighted_f1(targets, predicted) == want

    def test_f1_uses_lowest_index_among_tied_maxima(self):
        """Both rows tie classes 2 and 3 at the top; top1 = 2 for both, so only the first (y=2) is right:
        class 2 F1 = 2·(1/2·1)/(1/2+1) = 2/3 with support 1, class 3 F1 = 0 -> weighted 1/3."""
        acc = MetricAccumulator()
        acc.update(torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]]), torch.tensor([2, 3]))
        assert acc.top1().tolist() == [2, 2]
        assert acc.compute()["f1"] == pytest.approx(100 / 3)

    def test_fp16_scores(self):
        """Half-precision scores: fp16 rounding ties 1.0 and 1.0001, so the lower index (1) wins."""
        scores = torch.tensor([[0.5, 1.0, 1.0001, 0.0]], dtype=torch.float16)
        acc = MetricAccumulator()
        acc.update(scores, torch.tensor([2]))
        assert acc.ranks().tolist() == [2]
        assert acc.top1().tolist() == [1]

    def test_per_user_aligned_by_index(self):
        """Samples arrive out of order (rows 2, 0 then 3, 1); users by row: [7, 7, 9, 9].

        ranks by row: row0 -> 1, row1 -> 2, row2 -> 12, row3 -> 1.
        user 7 (rows 0, 1): Acc@1 50, MRR (1 + 1/2)/2; user 9 (rows 2, 3): Acc@1 50, Acc@10 50, MRR (1/12 + 1)/2.
        """
        order = -torch.arange(20.0)  # class i has rank i + 1
        acc = MetricAccumulator()
        acc.update(torch.stack([order, order]), torch.tensor([11, 0]), torch.tensor([2, 0]))
        acc.update(torch.stack([order, order]), torch.tensor([0, 1]), torch.tensor([3, 1]))
        frame = acc.per_user(np.array([7, 7, 9, 9]))
        assert frame["user"].tolist() == [7, 9]
        assert frame["n"].tolist() == [2, 2]
        assert frame["acc@1"].tolist() == pytest.approx([50.0, 50.0])
        assert frame["acc@10"].tolist() == pytest.approx([100.0, 50.0])
        assert frame["mrr"].tolist() == pytest.approx([(1 + 1 / 2) / 2 * 100, (1 / 12 + 1) / 2 * 100])
        assert frame["ndcg@10"].tolist() == pytest.approx([(1 + 1 / math.log2(3)) / 2 * 100, 50.0])
        assert list(frame.columns) == [
            "user",
            "n",
            *("place_acc@1", "place_acc@5", "place_acc@10", "place_mrr", "place_ndcg@10"),
            *("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10"),
        ]
        # place ranks by row: row2 (target 11) -> 10 (classes 2..10 before it); rows 0, 1, 3 (targets 0, 1, 0)
        # are misses. user 7: place MRR 0; user 9: (1/10 + 0)/2
        assert frame["place_mrr"].tolist() == pytest.approx([0.0, 5.0])
        assert acc.index().tolist() == [2, 0, 3, 1]

    def test_per_user_insertion_order_without_index(self):
        """Without index the i-th stored sample belongs to user_ids[i]."""
        acc = MetricAccumulator()
        acc.update(torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]), torch.tensor([0, 1, 1]))
        frame = acc.per_user(np.array([5, 6, 6]))
        assert frame["user"].tolist() == [5, 6]
        assert frame["acc@1"].tolist() == [100.0, 0.0]
        assert frame["mrr"].tolist() == pytest.approx([100.0, 50.0])

    def test_per_user_micro_total_matches_compute(self):
        """n-weighted per-user means give back the split's micro averages."""
        gen = torch.Generator().manual_seed(3)
        acc = MetricAccumulator()
        for start in range(0, 90, 30):
            acc.update(
                torch.randint(0, 6, (30, 40), generator=gen).float(),
                torch.randint(0, 40, (30,), generator=gen),
                torch.arange(start, start + 30),
            )
        users = np.arange(90) % 4
        frame = acc.per_user(users)
        total = acc.compute()
        for key in ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10"):
            assert (frame[key] * frame["n"]).sum() / frame["n"].sum() == pytest.approx(total[key])

    def test_mixing_index_and_no_index_is_rejected(self):
        acc = MetricAccumulator()
        acc.update(torch.zeros(1, 3), torch.tensor([0]), torch.tensor([0]))
        with pytest.raises(ValueError, match="every update"):
            acc.update(torch.zeros(1, 3), torch.tensor([0]))

    def test_empty_and_reset(self):
        acc = MetricAccumulator()
        out = acc.compute()
        assert out["n"] == 0
        assert math.isnan(out["acc@1"])
        assert math.isnan(out["f1"])
        assert acc.per_user(np.array([1])).empty
        acc.update(torch.zeros(2, 3), torch.tensor([0, 1]))
        assert len(acc) == 2
        acc.reset()
        assert len(acc) == 0

    def test_results_refresh_after_update(self):
        acc = MetricAccumulator()
        acc.update(torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
        assert acc.compute()["acc@1"] == 100.0
        acc.update(torch.tensor([[1.0, 0.0]]), torch.tensor([1]))
        assert acc.compute()["acc@1"] == 50.0


class TestPlaceMetrics:
    """Place metrics: classes 0 and 1 removed from every ranking, a target of 1 always a miss, all samples."""

    def test_target_one_is_always_a_miss(self):
        """A model that ranks class 1 first for a target of 1 gets reference credit, never place credit."""
        acc = MetricAccumulator()
        acc.update(torch.tensor([[0.0, 5.0, 1.0, 2.0]]), torch.tensor([1]))
        out = acc.compute()
        assert out["acc@1"] == 100.0
        assert out["mrr"] == 100.0
        assert acc.place_ranks().tolist() == [0]
        assert acc.place_top1().tolist() == [3]
        for key in ("place_acc@1", "place_acc@5", "place_acc@10", "place_mrr", "place_ndcg@10", "place_f1"):
            assert out[key] == 0.0
        assert out["new_place_rate"] == 100.0

    def test_model_ranking_one_first_loses_nothing_on_places(self):
        """Scores [pad 9, unseen 8, 3, 7, 5], target 4 (score 5): reference rank 4 (behind 0, 1, 3);
        place rank 2 (behind class 3 only): place Acc@1 0, Acc@5 100, MRR 50, NDCG 1/log2(3)."""
        acc = MetricAccumulator()
        acc.update(torch.tensor([[9.0, 8.0, 3.0, 7.0, 5.0]]), torch.tensor([4]))
        out = acc.compute()
        assert acc.ranks().tolist() == [4]
        assert acc.place_ranks().tolist() == [2]
        assert acc.top1().tolist() == [0]
        assert acc.place_top1().tolist() == [3]
        assert out["place_acc@1"] == 0.0
        assert out["place_acc@5"] == 100.0
        assert out["place_mrr"] == pytest.approx(50.0)
        assert out["place_ndcg@10"] == pytest.approx(100 / math.log2(3))
        assert out["mrr"] == pytest.approx(25.0)

    def test_ties_among_places_lowest_index_first(self):
        """Places 2, 3, 4 tie at the top (class 1 higher still): target 3 has place rank 2, target 2 rank 1,
        and the top place is 2 for both rows."""
        scores = torch.tensor([[0.0, 9.0, 4.0, 4.0, 4.0], [0.0, 9.0, 4.0, 4.0, 4.0]])
        acc = MetricAccumulator()
        acc.update(scores, torch.tensor([3, 2]))
        assert acc.place_ranks().tolist() == [2, 1]
        assert acc.place_top1().tolist() == [2, 2]
        out = acc.compute()
        assert out["place_acc@1"] == pytest.approx(50.0)
        assert out["place_mrr"] == pytest.approx((1 / 2 + 1) / 2 * 100)

    def test_denominator_is_every_sample(self):
        """Four samples, two of them new (target 1): perfect place ranking on the known ones gives 50%."""
        scores = torch.full((4, 6), -1.0)
        targets = torch.tensor([2, 1, 5, 1])
        scores[torch.arange(4), torch.tensor([2, 3, 5, 4])] = 1.0
        acc = MetricAccumulator()
        acc.update(scores, targets)
        out = acc.compute()
        assert out["place_acc@1"] == pytest.approx(50.0)
        assert out["place_mrr"] == pytest.approx(50.0)
        assert out["new_place_rate"] == pytest.approx(50.0)
        assert out["n"] == 4

    def test_place_f1_by_hand(self):
        """y = [2, 2, 1, 3], place top1 = [2, 3, 2, 3] (row 2 would rank 1 first; places only).

        class 1: support 1, never predicted -> F1 0; class 2: tp 1, fp 1, fn 1 -> F1 1/2, support 2;
        class 3: tp 1, fp 1, fn 0 -> precision 1/2, recall 1, F1 2/3, support 1.
        Weighted: (0 + 2 * 1/2 + 2/3) / 4 = 5/12."""
        scores = torch.tensor(
            [[0.0, 0.0, 3.0, 1.0], [0.0, 0.0, 1.0, 3.0], [0.0, 9.0, 3.0, 1.0], [0.0, 0.0, 1.0, 3.0]]
        )
        acc = MetricAccumulator()
        acc.update(scores, torch.tensor([2, 2, 1, 3]))
        assert acc.place_top1().tolist() == [2, 3, 2, 3]
        assert acc.compute()["place_f1"] == pytest.approx(100 * 5 / 12)

    def test_place_ranks_function(self):
        ranks, top1 = place_ranks(torch.tensor([[5.0, 4.0, 1.0, 3.0, 3.0]]), torch.tensor([4]))
        assert ranks.tolist() == [2]  # class 3 ties at 3.0 and has the lower index
        assert top1.tolist() == [3]
        ranks, top1 = place_ranks(torch.zeros(2, 2), torch.tensor([1, 0]))  # no place in the vocabulary
        assert ranks.tolist() == [0, 0]
        assert top1.tolist() == [2, 2]

    def test_new_place_auc_and_brier_by_hand(self):
        """is_new = [1, 0, 0, 1], p = [0.9, 0.2, 0.6, 0.4]: pairs (new, known) ordered right 3 of 4 -> AUC 75;
        Brier = (0.01 + 0.04 + 0.36 + 0.36) / 4 = 0.1925."""
        out = new_place_metrics(np.array([1, 2, 3, 1]), np.array([0.9, 0.2, 0.6, 0.4]))
        assert out["new_place_rate"] == pytest.approx(50.0)
        assert out["new_place_auc"] == pytest.approx(75.0)
        assert out["new_place_brier"] == pytest.approx(0.1925)

    def test_new_place_auc_ties_count_half(self):
        out = new_place_metrics(np.array([1, 2]), np.array([0.5, 0.5]))
        assert out["new_place_auc"] == pytest.approx(50.0)
        assert out["new_place_brier"] == pytest.approx(0.25)

    def test_new_place_undefined_auc_and_bad_probabilities(self):
        assert math.isnan(new_place_metrics(np.array([2, 3]), np.array([0.1, 0.2]))["new_place_auc"])
        with pytest.raises(ValueError, match="probabilities"):
            new_place_metrics(np.array([1, 2]), np.array([0.1, 1.5]))
        with pytest.raises(ValueError, match="2 targets"):
            new_place_metrics(np.array([1, 2]), np.array([0.1]))

    def test_compute_with_p_new(self):
        acc = MetricAccumulator()
        acc.update(torch.zeros(4, 5), torch.tensor([1, 2, 3, 1]))
        out = acc.compute(p_new=np.array([0.9, 0.2, 0.6, 0.4]))
        assert out["new_place_auc"] == pytest.approx(75.0)
        assert out["new_place_brier"] == pytest.approx(0.1925)
        assert list(out) == list(METRIC_KEYS)

    def test_per_sample_means_are_the_metrics(self):
        gen = torch.Generator().manual_seed(5)
        acc = MetricAccumulator()
        acc.update(torch.randn(50, 12, generator=gen), torch.randint(0, 12, (50,), generator=gen))
        frame = acc.per_sample()
        out = acc.compute()
        for key in ("place_acc@1", "place_acc@10", "place_mrr", "place_ndcg@10", "acc@5", "mrr"):
            assert frame[key].mean() == pytest.approx(out[key])


class TestEvaluateScores:
    def test_split_in_several_batches(self, make_samples):
        """Five samples of users 1, 1, 2, 2, 2 in batches of 2. The score function scores X[-1] 1, all else 0:
        right for rows 0, 2, 4 (target == X[-1]); in rows 1 and 3 the target (2, 3) comes after X[-1] and the
        two zero-scored classes of lower index -> rank 4. Acc@1 60, MRR (3 + 2/4)/5;
        per user: user 1 (rows 0, 1) Acc@1 50, user 2 (rows 2-4) Acc@1 200/3."""
        data = make_samples(
            users=[1, 1, 2, 2, 2],
            histories=[[2, 3], [4, 3, 5], [2], [6, 6, 2], [3, 4, 5, 6]],
            targets=[3, 2, 2, 3, 6],
        )

        def last_first(batch):
            scores = torch.zeros(len(batch.target), 8)
            last = batch.loc.gather(1, (batch.lengths - 1)[:, None])
            return scores.scatter(1, last, 1.0)

        metrics, acc = evaluate_scores(last_first, data, batch_size=2)
        assert acc.ranks().tolist() == [1, 4, 1, 4, 1]
        assert metrics["acc@1"] == pytest.approx(60.0)
        assert metrics["mrr"] == pytest.approx((3 + 2 / 4) / 5 * 100)
        assert metrics["n"] == 5
        frame = acc.per_user(data.user_id_np)
        assert frame["user"].tolist() == [101, 102]
        assert frame["acc@1"].tolist() == pytest.approx([50.0, 200 / 3])


def test_reliability_table_and_ece() -> None:
    rng = np.random.default_rng(0)
    top_p = rng.random(20000)
    calibrated = rng.random(20000) < top_p
    table, ece = reliability(top_p, calibrated)
    assert [row["n"] for row in table] == np.histogram(top_p, bins=10, range=(0, 1))[0].tolist()
    assert ece < 0.02
    for row in table:
        assert row["low"] <= row["mean_p"] < row["high"]
    _, overconfident = reliability(np.full(100, 0.9), np.arange(100) < 50)
    assert overconfident == pytest.approx(0.4)


def test_answer_sets_hold_their_level_when_calibrated() -> None:
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.full(8, 0.5), size=5000)
    probs[:, 0] = 0.0
    probs /= probs.sum(axis=1, keepdims=True)
    targets = np.array([rng.choice(8, p=row) for row in probs])
    sizes = []
    for level in (0.5, 0.8, 0.9):
        coverage, size = answer_sets(probs, targets, level)
        assert coverage >= 100 * level - 2.0  # the fewest classes holding at least the level
        sizes.append(size)
    assert sizes == sorted(sizes)
    assert answer_sets(probs, targets, 1.0) == (100.0, 7.0)  # every class but padding


class TestFewestHolding:
    """The one rule for answer sets (``nextloc predict --coverage`` and the ``set_*`` metrics)."""

    @staticmethod
    def members(probs: list[list[float]], level: float) -> list[list[int]]:
        order, size = fewest_holding(np.array(probs), level)
        return [row[:n].tolist() for row, n in zip(order, size, strict=True)]

    def test_most_likely_first_until_the_level(self) -> None:
        assert self.members([[0.1, 0.6, 0.2, 0.1]], 0.5) == [[1]]
        assert self.members([[0.1, 0.6, 0.2, 0.1]], 0.7) == [[1, 2]]
        assert self.members([[0.1, 0.6, 0.2, 0.1]], 0.85) == [[1, 2, 0]]

    def test_a_level_reached_exactly_is_reached(self) -> None:
        """0.7 + 0.2 is below 0.9 in binary floating point: the tolerance keeps the set at two."""
        assert 0.7 + 0.2 < 0.9
        assert self.members([[0.7, 0.2, 0.1]], 0.9) == [[0, 1]]
        assert self.members([[0.1, 0.5, 0.3, 0.1]], 0.8) == [[1, 2]]
        assert self.members([[0.25, 0.25, 0.25, 0.25]], 0.5) == [[0, 1]]
        assert self.members([[0.25, 0.25, 0.25, 0.25]], 0.5 + 1e-9) == [[0, 1, 2]]

    def test_ties_take_the_lower_column_first(self) -> None:
        """Column 0 is "a new place" in an answer: tied with a place, it comes first, as top_k ranks ties."""
        assert self.members([[0.3, 0.3, 0.3, 0.1]], 0.5) == [[0, 1]]
        assert self.members([[0.1, 0.3, 0.3, 0.3]], 0.5) == [[1, 2]]
        assert self.members([[0.2, 0.4, 0.4]], 0.4) == [[1]]

    def test_a_new_place_belongs_when_it_is_likely(self) -> None:
        """Column 0 ("a new place") is a member like any other: in when its probability puts it in."""
        assert self.members([[0.45, 0.35, 0.2]], 0.5) == [[0, 1]]
        assert self.members([[0.05, 0.6, 0.35]], 0.9) == [[1, 2]]
        assert self.members([[0.05, 0.6, 0.35]], 0.96) == [[1, 2, 0]]

    def test_never_empty_and_never_a_zero(self) -> None:
        assert self.members([[0.0, 0.9, 0.1]], 1e-6) == [[1]]  # the smallest level: the most likely one
        assert self.members([[0.0, 0.0, 0.0]], 0.9) == [[0]]  # nothing to hold: still one member
        assert self.members([[0.0, 0.5, 0.3]], 0.99) == [[1, 2]]  # sums to 0.8: every positive column
        assert self.members([[0.0, 0.5, 0.5]], 1.0) == [[1, 2]]

    @pytest.mark.parametrize("level", [0.0, -0.1, 1.1, float("nan")])
    def test_a_level_outside_0_1_is_refused(self, level: float) -> None:
        with pytest.raises(ValueError, match=r"probability in \(0, 1\]"):
            fewest_holding(np.array([[0.5, 0.5]]), level)

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(st.integers(0, 20), min_size=2, max_size=8).filter(any),
        st.sampled_from([0.05, 0.3, 0.5, 0.8, 0.9, 0.99]),
    )
    def test_the_fewest_that_hold_the_level(self, weights: list[int], level: float) -> None:
        p = np.array(weights, dtype=np.float64) / sum(weights)
        (members,) = self.members([p.tolist()], level)
        assert members
        assert len(set(members)) == len(members)
        assert p[members].sum() >= level - 1e-12 or len(members) == (p > 0).sum()
        fewer = np.sort(p)[::-1][: len(members) - 1].sum()
        assert fewer < level - 1e-12  # no smaller set holds it
        assert (np.diff(p[members]) <= 0).all()  # in order of probability

    def test_outcomes_and_metrics_follow_the_rule(self) -> None:
        """Class 0 (padding) is never a member; the rule's columns are the classes from 1."""
        probs = np.array([[0.0, 0.5, 0.3, 0.2], [0.0, 0.1, 0.6, 0.3], [0.0, 0.7, 0.2, 0.1]])
        targets = np.array([2, 1, 1])  # the second likeliest; "a new place", least likely, then likeliest
        covered, size = set_outcomes(probs, targets, SET_LEVELS)
        assert size.tolist() == [[1, 2, 3], [1, 2, 2], [1, 2, 2]]  # 0.6 + 0.3 and 0.7 + 0.2 reach 0.9
        assert covered.tolist() == [[False, True, True], [False, False, False], [True, True, True]]
        metrics = set_metrics(covered, size)
        assert list(metrics) == list(SET_KEYS)
        assert metrics["set_coverage_80"] == pytest.approx(200 / 3)
        assert (metrics["set_size_50"], metrics["set_size_90"]) == (1.0, pytest.approx(7 / 3))
        assert answer_sets(probs, targets, 0.8) == (metrics["set_coverage_80"], metrics["set_size_80"])
        assert np.isnan(set_metrics(covered[:0], size[:0])["set_coverage_90"])
