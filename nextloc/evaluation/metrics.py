"""Ranking metrics for next-location prediction, in two families, plus the new-place metrics.

**Place metrics** (the product's headline, ``place_*``): what a user gets. Classes 0 (padding) and 1 (a
location not seen in training) are removed from every ranking, so a model can only name real places, and a
target of 1 is always a miss. They are averaged over *all* samples (``n``), so every model is scored on the
same denominator and a model cannot gain by predicting "somewhere new".

**Reference metrics** (``acc@k``, ``mrr``, ``ndcg@10``, ``f1``): the published protocol (ML ``utils/train.py``
≡ V2 ``src/evaluation/metrics.py``, protocol §4), for comparison with published work: every class of the
vocabulary is scored, **0 (padding) and 1 (unseen location) included**, nothing is masked, and samples are
micro-averaged. Where the reference breaks ties arbitrarily (``topk`` and ``argsort`` are separate sorts), every
metric here follows from one deterministic rank, computed without a sort.

Rank convention (a stable descending sort over the whole vocabulary)::

    rank = 1 + #(classes with score > s_y) + #(classes with score == s_y and class index < y)

where ``y`` is the target and ``s_y`` its score. Every metric follows from that rank:

- ``acc@k`` = rank <= k (so Acc@k agrees with the MRR/NDCG ranking, unlike the reference's separate topk);
- ``mrr`` = mean of 1 / rank over the full ranking (not cut at 10);
- ``ndcg@10`` = 1 / log2(rank + 1) if rank <= 10 else 0 (one relevant item, IDCG = 1);
- ``f1`` = ``sklearn.metrics.f1_score(y_true, top1, average="weighted", zero_division=0)`` where ``top1`` is the
  rank-1 class under the same tie rule (the lowest index among the maximal scores).

Place ranks follow the same convention over the classes ``>= 2`` only (the place rank of a target ``y >= 2``
is its rank among the real places); a target ``< 2`` has no place rank (stored as 0, scored as a miss), and
``place_f1`` is the weighted F1 of the top-ranked *place* against every target (a target of 1 keeps its
support and can never be predicted).

**New-place metrics**: ``new_place_rate`` is the share of targets that are new (class 1); for a model that
gives P(new place) per sample, ``new_place_auc`` is its ROC-AUC against "the target is new" and
``new_place_brier`` the Brier score (mean squared error of the probability, 0 best, *not* in percent).

**Answer sets** (:data:`SET_KEYS`, a model scored on one distribution over the known places and "a new
place"): the fewest classes, most likely first, whose probabilities hold a level (:func:`fewest_holding`,
the rule ``nextloc predict --coverage`` answers with); ``set_coverage_<level>`` is the share of targets in
their set, ``set_size_<level>`` the sets' mean size (a count, not in percent).

All metrics except ``n``, ``new_place_brier`` and ``set_size_*`` are reported in percent (x100). NaN scores are not supported
(their rank is undefined).

This module imports no torch (the flows read its keys on every run): the ranks are computed on tensors in
:mod:`nextloc.evaluation.tensor_metrics` (:func:`~nextloc.evaluation.tensor_metrics.target_ranks`,
:class:`~nextloc.evaluation.tensor_metrics.MetricAccumulator`, :func:`~nextloc.evaluation.tensor_metrics.evaluate_scores`), the
metrics here from the ranks' arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nextloc.preprocessing.sequences import UNSEEN

TOPK = (1, 5, 10)
NDCG_K = 10
# The one metric list: every surface (results.json, MLflow, leaderboards, summaries) reads these, headline first.
REFERENCE_KEYS = ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "f1")
PLACE_KEYS = tuple(f"place_{key}" for key in REFERENCE_KEYS)
NEW_PLACE_KEYS = ("new_place_rate", "new_place_auc", "new_place_brier")
RESULT_KEYS = (*PLACE_KEYS, *NEW_PLACE_KEYS, *REFERENCE_KEYS)
HEADLINE = "place_acc@1"
METRIC_KEYS = (*RESULT_KEYS, "n")
# The place rank metrics again over the test samples whose target is not a copy of another user's staypoint
# (nextloc.raw.duplicates), with their count ``n_test_dedup``: results.json, the run's MLflow metrics, the summary.
DEDUP_KEYS = tuple(f"{key}_dedup" for key in PLACE_KEYS if key != "place_f1")
DEDUP_HEADLINE = f"{HEADLINE}_dedup"
# The answer sets (:func:`fewest_holding`) of a distribution over the places and "a new place", measured at
# these levels on test: ``set_coverage_90`` (%, the share of targets in their set), ``set_size_90`` (members).
SET_LEVELS = (0.5, 0.8, 0.9)
SET_KEYS = tuple(f"set_{what}_{round(level * 100)}" for level in SET_LEVELS for what in ("coverage", "size"))
# a sum this close below the level reaches it (float noise: 0.7 + 0.2 < 0.9 in binary floating point)
SET_TOLERANCE = 1e-12


def rank_metrics(ranks: np.ndarray) -> dict[str, float]:
    """Acc@1/5/10, MRR and NDCG@10 (in percent) of an array of 1-based ranks.

    Args:
        ranks: 1-based ranks, any integer dtype; a rank of 0 means "not ranked" and counts as a miss
            (place ranks of targets that are not places).

    Returns:
        ``acc@1``, ``acc@5``, ``acc@10``, ``mrr``, ``ndcg@10`` (NaN when ``ranks`` is empty).

    Examples:
        >>> rank_metrics(np.array([1, 2]))["mrr"]
        75.0
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    ranks = np.where(ranks >= 1, ranks, np.inf)  # 0: a miss (1 / inf = 0, never <= k)
    if ranks.size == 0:
        return {**{f"acc@{k}": float("nan") for k in TOPK}, "mrr": float("nan"), "ndcg@10": float("nan")}
    out = {f"acc@{k}": float((ranks <= k).mean() * 100) for k in TOPK}
    out["mrr"] = float((1.0 / ranks).mean() * 100)
    ndcg = np.where(ranks <= NDCG_K, 1.0 / np.log2(ranks + 1.0), 0.0)
    out["ndcg@10"] = float(ndcg.mean() * 100)
    return out


def new_place_metrics(targets: np.ndarray, p_new: np.ndarray | None = None) -> dict[str, float]:
    """``new_place_rate`` (%) and, given P(new place) per sample, ``new_place_auc`` (%) and ``new_place_brier``.

    Args:
        targets: ``(N,)`` target classes; "new" means class 1 (a location not seen in training).
        p_new: ``(N,)`` probabilities that the next place is new, or None.

    Returns:
        The rate; with ``p_new`` also the ROC-AUC (NaN when only one outcome occurs) and the Brier score.

    Examples:
        >>> new_place_metrics(np.array([1, 2, 3, 1]), np.array([0.9, 0.2, 0.6, 0.4]))["new_place_auc"]
        75.0
    """
    is_new = np.asarray(targets) == UNSEEN
    out = {"new_place_rate": float(is_new.mean() * 100) if is_new.size else float("nan")}
    if p_new is None:
        return out
    p_new = np.asarray(p_new, dtype=np.float64)
    if p_new.shape != is_new.shape:
        raise ValueError(f"{p_new.shape[0] if p_new.ndim else 0} probabilities for {is_new.size} targets")
    if p_new.size and (np.isnan(p_new).any() or p_new.min() < 0 or p_new.max() > 1):
        raise ValueError("P(new place) must be probabilities in [0, 1]")
    both = 0 < is_new.sum() < is_new.size
    if both:
        from sklearn.metrics import roc_auc_score  # imported when used: sklearn takes ~1 s to import

        out["new_place_auc"] = float(roc_auc_score(is_new, p_new) * 100)
    else:
        out["new_place_auc"] = float("nan")
    out["new_place_brier"] = float(np.mean((p_new - is_new) ** 2)) if p_new.size else float("nan")
    return out


RELIABILITY_BINS = 10


def reliability(top_p: np.ndarray, hit: np.ndarray, bins: int = RELIABILITY_BINS) -> tuple[list[dict], float]:
    """A reliability table of a distribution's most likely answer and its expected calibration error.

    Args:
        top_p: ``(N,)`` the probability of each answer's most likely class.
        hit: ``(N,)`` whether that class is the target.
        bins: equal-width bins of ``[0, 1]``.

    Returns:
        One dict per non-empty bin (``low``, ``high``, ``n``, ``mean_p``, ``accuracy``), and the ECE: the
        mean over samples of ``|accuracy - mean_p|`` of their bin (0 best, *not* in percent).

    Examples:
        >>> table, ece = reliability(np.array([0.9, 0.9, 0.3, 0.3]), np.array([1, 1, 0, 1]))
        >>> [(row["n"], row["accuracy"]) for row in table], round(ece, 3)
        ([(2, 0.5), (2, 1.0)], 0.15)
    """
    top_p = np.asarray(top_p, dtype=np.float64)
    hit = np.asarray(hit, dtype=np.float64)
    which = np.clip((top_p * bins).astype(np.int64), 0, bins - 1)
    table, ece = [], 0.0
    for b in range(bins):
        inside = which == b
        if not inside.any():
            continue
        mean_p, accuracy = float(top_p[inside].mean()), float(hit[inside].mean())
        table.append(
            {
                "low": b / bins,
                "high": (b + 1) / bins,
                "n": int(inside.sum()),
                "mean_p": mean_p,
                "accuracy": accuracy,
            }
        )
        ece += inside.mean() * abs(accuracy - mean_p)
    return table, float(ece) if len(top_p) else float("nan")


def check_level(level: float) -> float:
    """``level`` as a float if it is a probability a set can hold, in ``(0, 1]``.

    Raises:
        ValueError: naming the level.
    """
    level = float(level)
    if not 0.0 < level <= 1.0:  # NaN fails too
        raise ValueError(f"a set's level must be a probability in (0, 1], got {level}")
    return level


def fewest_holding(probs: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """The one rule for answer sets: the fewest columns of each distribution whose probabilities hold ``level``.

    The columns are taken in order of probability, the highest first (ties: the lower column first, as
    :func:`nextloc.bundle.top_k`), until their sum reaches ``level`` (within :data:`SET_TOLERANCE`, so a
    level reached exactly is reached). A set is never empty (at least the most likely column) and never
    takes a column of probability 0 (a distribution summing to less than ``level`` gives all its positive
    columns).

    Args:
        probs: ``(N, C)`` one distribution per row (the callers pass the classes from 1, "a new place",
            then the places; never the padding class 0).
        level: the probability the set must hold, in ``(0, 1]``.

    Returns:
        ``order`` ``(N, C)``, each row's columns by descending probability, and ``size`` ``(N,)``: the set
        is ``order[i, :size[i]]``.

    Raises:
        ValueError: a level outside ``(0, 1]`` or ``probs`` not 2-D.

    Examples:
        >>> order, size = fewest_holding(np.array([[0.2, 0.5, 0.3], [0.1, 0.6, 0.3]]), 0.8)
        >>> order[0, : size[0]].tolist(), order[1, : size[1]].tolist()
        ([1, 2], [1, 2])
    """
    level = check_level(level)
    order, held, positive = _ranked(probs)
    return order, _set_size(held, positive, level)


def _ranked(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's columns by descending probability (stable), their running sums and the positive count."""
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"expected (N, C) probabilities, got shape {p.shape}")
    order = np.argsort(-p, axis=1, kind="stable")
    return order, np.take_along_axis(p, order, axis=1).cumsum(axis=1), (p > 0).sum(axis=1)


def _set_size(held: np.ndarray, positive: np.ndarray, level: float) -> np.ndarray:
    """:func:`fewest_holding`'s sizes from the running sums: at least 1, at most the positive columns."""
    size = (held < level - SET_TOLERANCE).sum(axis=1) + 1
    return np.minimum(size, np.maximum(positive, 1))


def set_outcomes(
    probs: np.ndarray, targets: np.ndarray, levels: Sequence[float] = SET_LEVELS
) -> tuple[np.ndarray, np.ndarray]:
    """Per sample and level: whether the target is in its :func:`fewest_holding` set, and the set's size.

    Args:
        probs: ``(N, V)`` one distribution per sample over the vocabulary (class 1 "a new place", the places
            from 2; class 0, padding, is never taken).
        targets: ``(N,)`` the classes that came.
        levels: the probabilities the sets must hold, each in ``(0, 1]``.

    Returns:
        ``covered`` ``(N, L)`` bool and ``size`` ``(N, L)``, one column per level.
    """
    levels = [check_level(level) for level in levels]
    order, held, positive = _ranked(np.asarray(probs, dtype=np.float64)[:, 1:])
    targets = np.asarray(targets)
    position = np.argmax(order == targets[:, None] - 1, axis=1)  # a padding target (0) matches no column
    size = np.stack([_set_size(held, positive, level) for level in levels], axis=1)
    return (position[:, None] < size) & (targets[:, None] >= 1), size


def answer_sets(probs: np.ndarray, targets: np.ndarray, level: float) -> tuple[float, float]:
    """Empirical coverage (%) and mean size of the :func:`fewest_holding` sets of each distribution.

    Args:
        probs: ``(N, V)`` one distribution per sample (class 1 "a new place", the places from 2; class 0 is
            never taken).
        targets: ``(N,)`` the classes that came.
        level: the probability the set must hold, in ``(0, 1]``.

    Examples:
        >>> answer_sets(np.array([[0, 0.5, 0.3, 0.2], [0, 0.1, 0.6, 0.3]]), np.array([2, 3]), 0.8)
        (100.0, 2.0)
    """
    covered, size = set_outcomes(probs, targets, (level,))
    if not len(covered):
        return float("nan"), float("nan")
    return float(100 * covered.mean()), float(size.mean())


def set_metrics(covered: np.ndarray, sizes: np.ndarray) -> dict[str, float]:
    """:data:`SET_KEYS` from per-sample outcomes at each of :data:`SET_LEVELS` (:func:`set_outcomes`).

    Args:
        covered: ``(N, L)`` whether each sample's set at each level holds its target.
        sizes: ``(N, L)`` the sets' sizes.

    Returns:
        ``set_coverage_<level %>`` (percent) and ``set_size_<level %>`` (mean members), NaN without samples.
    """
    if not len(covered):
        return dict.fromkeys(SET_KEYS, float("nan"))
    out = {}
    for j, level in enumerate(SET_LEVELS):
        out[f"set_coverage_{round(level * 100)}"] = float(100 * covered[:, j].mean())
        out[f"set_size_{round(level * 100)}"] = float(sizes[:, j].mean())
    return out


def weighted_f1(targets: np.ndarray, predicted: np.ndarray) -> float:
    """Weighted F1 in percent (NaN without samples): the reference's ``f1_score(average="weighted",
    zero_division=0)``, by the same float operations (equal to sklearn's, bit for bit, in the tests).

    In NumPy rather than by calling sklearn: importing ``sklearn.metrics`` (0.8-1.1 s here, bytecode cached) fell
    to the trainer's validation thread at the first epoch of a process that had not imported it, and an import
    is Python code holding the interpreter lock, which the training thread beside it needs between its kernels:
    3 pointer epochs trained at 1,690 samples/s instead of 1,970 (``benchmarks/train.py``'s process).
    """
    if not len(targets):
        return float("nan")
    labels, codes = np.unique(np.concatenate([targets, predicted]), return_inverse=True)
    true_codes, pred_codes = codes[: len(targets)], codes[len(targets) :]
    true_sum = np.bincount(true_codes, minlength=len(labels))
    pred_sum = np.bincount(pred_codes, minlength=len(labels))
    tp_sum = np.bincount(true_codes[true_codes == pred_codes], minlength=len(labels))
    # every label occurs among the targets or the predictions, so no denominator is 0
    f_score = 2.0 * tp_sum.astype(np.float64) / (true_sum.astype(np.float64) + pred_sum.astype(np.float64))
    return float(np.average(f_score, weights=true_sum) * 100)
