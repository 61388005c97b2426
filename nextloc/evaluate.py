"""One home for evaluation: scoring a model on a split, the new-place head, the champion rule's statistics,
and the packed form of histories that registered models take (summaries over seeds: :mod:`nextloc.leaderboard`).

Protocol (the same data budget as the reference for every headline number): a model is fit on train; every
choice (epoch, seed, the new-place head's coefficients) is made on validation; test is scored once.

The champion rule (:func:`champion_decision`) is the one rule behind the ``champion`` alias: a challenger
model kind, trained over one or more seeds, replaces the champion only if it is better on the same test
samples by at least a minimum effect *and* a paired bootstrap over those samples says the difference is
not noise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from nextloc.data import DURATION_BIN_MIN, TIME_SLOT_MIN, Batch, SampleTensors, by_length
from nextloc.metrics import DEDUP_KEYS
from nextloc.novelty import FEATURES, ROUTINE_FEATURES, NewPlaceHead, novelty_features
from nextloc.sequences import UNSEEN
from nextloc.tensor_metrics import MetricAccumulator

ScoreFn = Callable[[Batch], torch.Tensor]


@dataclass
class SplitScores:
    """A split scored by a model: the metric accumulator and the new-place head's inputs, in split order."""

    accumulator: MetricAccumulator
    features: np.ndarray  # (N, F): novelty.FEATURES, then the routine's explore features if given

    @property
    def is_new(self) -> np.ndarray:
        """``(N,)`` whether each target is a new place (class 1)."""
        return self.accumulator.targets() == UNSEEN


@dataclass
class Evaluation:
    """What :func:`evaluate` reports for one trained model."""

    val: dict[str, float]
    test: dict[str, float]
    head: NewPlaceHead
    test_scores: SplitScores
    test_p_new: np.ndarray  # (N_test,) P(new place), split order
    per_user: pd.DataFrame
    target_in_history: float  # % of test targets that occur in their history
    # (N_test,) whether each test target is a copy of another user's staypoint (nextloc.duplicates), split
    # order; None when not known (no final staypoints next to the samples)
    test_copied: np.ndarray | None = None

    def per_sample(self) -> pd.DataFrame:
        """Test outcomes per sample (hits and gains of both families, P(new place), and ``target_is_copy``
        when :attr:`test_copied` is known), in split order."""
        frame = self.test_scores.accumulator.per_sample()
        frame["p_new"] = self.test_p_new[np.argsort(self.test_scores.accumulator.index(), kind="stable")]
        if self.test_copied is not None:
            frame["target_is_copy"] = np.asarray(self.test_copied, dtype=bool)
        return frame

    def dedup(self) -> dict[str, float]:
        """:func:`without_copies` of the test samples (empty when :attr:`test_copied` is not known)."""
        if self.test_copied is None:
            return {}
        return without_copies(self.per_sample(), self.test_copied)


def model_scores(model: nn.Module) -> ScoreFn:
    """Batch -> scores of ``model`` in eval mode (fp16 autocast on CUDA, float32 out)."""
    model.eval()

    def score(batch: Batch) -> torch.Tensor:
        device = batch.loc.device
        with torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda"):
            return model(batch).float()

    return score


def score_split(
    score_fn: ScoreFn, data: SampleTensors, batch_size: int = 512, explore: np.ndarray | None = None
) -> SplitScores:
    """Score every sample of ``data`` in split order (under ``torch.no_grad``); ``explore`` ``(N, E)``, the
    routine's explore features in split order, joins the new-place head's inputs."""
    accumulator = MetricAccumulator()
    features = []
    with torch.no_grad():
        for batch in data.batches(batch_size):
            scores = by_length(score_fn, batch)  # length-sorted pieces: the same rows, little padding
            accumulator.update(scores, batch.target, batch.index)
            features.append(novelty_features(scores, batch).cpu())
    stacked = torch.cat(features).numpy() if features else np.zeros((0, len(FEATURES)), dtype=np.float32)
    stacked = stacked.astype(np.float64)
    return SplitScores(accumulator, stacked if explore is None else np.column_stack([stacked, explore]))


def evaluate(
    val_scores: ScoreFn,
    test_scores: ScoreFn,
    val: SampleTensors,
    test: SampleTensors,
    batch_size: int = 512,
    head: NewPlaceHead | None = None,
    explore: tuple[np.ndarray, np.ndarray] | None = None,
    head_val_scores: ScoreFn | None = None,
) -> Evaluation:
    """Validation and test metrics of a trained model, with its new-place head fit on validation.

    Args:
        val_scores: the model chosen on validation (its validation metrics are the honest ones).
        test_scores: the model that is tested (the same one, or a refit on train + val).
        val: validation samples.
        test: test samples.
        batch_size: samples per scoring batch.
        head: an already fitted new-place head (default: fit one on ``val``'s scores of ``test_scores``'s
            model, i.e. the model whose scores it will read).
        explore: the routine's explore features of val and test (split order): the head reads them too.
        head_val_scores: the tested model's scores on ``val`` when ``test_scores`` cannot score ``val``
            itself (a scorer bound to the test split); default: ``test_scores``.

    Returns:
        An :class:`Evaluation`. Validation metrics carry ``new_place_rate`` but no AUC/Brier (the head is fit
        there); test metrics carry all of :data:`nextloc.metrics.METRIC_KEYS`.
    """
    val_explore, test_explore = explore if explore is not None else (None, None)
    val_split = score_split(val_scores, val, batch_size, val_explore)
    head_scores = head_val_scores or test_scores
    head_split = (
        val_split if head_scores is val_scores else score_split(head_scores, val, batch_size, val_explore)
    )
    if head is None:
        names = FEATURES if explore is None else ROUTINE_FEATURES
        head = NewPlaceHead.fit(head_split.features, head_split.is_new, names=names)
    test_split = score_split(test_scores, test, batch_size, test_explore)
    p_new = head.predict(test_split.features)
    return Evaluation(
        val=val_split.accumulator.compute(),
        test=test_split.accumulator.compute(p_new),
        head=head,
        test_scores=test_split,
        test_p_new=p_new,
        per_user=test_split.accumulator.per_user(test.user_id_np),
        target_in_history=float(100 * test.target_in_history().mean()) if len(test) else float("nan"),
    )


def without_copies(per_sample: pd.DataFrame, copied: np.ndarray) -> dict[str, float]:
    """The place rank metrics over the samples whose target is not a copy (:data:`DEDUP_KEYS`), and their
    count ``n_test_dedup``.

    Each metric is the mean of its :meth:`MetricAccumulator.per_sample` column (what the split's metric
    is) over the samples kept; ``place_f1`` is left out: it is not a mean over samples.

    Args:
        per_sample: :meth:`Evaluation.per_sample` (split order).
        copied: ``(N,)`` whether each sample's target is a copy (:func:`nextloc.duplicates.copied_targets`),
            split order.
    """
    copied = np.asarray(copied, dtype=bool)
    if copied.shape != (len(per_sample),):
        raise ValueError(f"{copied.shape} copy flags for {len(per_sample)} samples")
    kept = per_sample.loc[~copied]
    out = {
        key: float(kept[key.removesuffix("_dedup")].mean()) if len(kept) else float("nan")
        for key in DEDUP_KEYS
    }
    out["n_test_dedup"] = len(kept)
    return out


# --------------------------------------------------------------------------- #
# the champion rule
# --------------------------------------------------------------------------- #


def paired_bootstrap(
    challenger: np.ndarray, champion: np.ndarray, n_boot: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Paired bootstrap over samples of the mean difference ``challenger - champion``.

    Args:
        challenger: ``(N,)`` per-sample outcome (e.g. place reciprocal rank x 100, averaged over seeds).
        champion: ``(N,)`` the same samples' outcome for the champion.
        n_boot: resamples.
        seed: the resampling seed (the test is deterministic).

    Returns:
        ``delta`` (the observed mean difference), ``ci_low`` / ``ci_high`` (95% percentile interval) and
        ``p_value``: the one-sided probability of a difference ``<= 0`` (the share of resampled differences
        that are ``<= 0``, with the +1 correction).
    """
    a = np.asarray(challenger, dtype=np.float64)
    b = np.asarray(champion, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"need two equal, non-empty per-sample arrays, got {a.shape} and {b.shape}")
    diff = a - b
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for start in range(0, n_boot, 256):  # bounded memory: 256 resamples at a time
        stop = min(start + 256, n_boot)
        idx = rng.integers(0, len(diff), size=(stop - start, len(diff)))
        means[start:stop] = diff[idx].mean(axis=1)
    return {
        "delta": float(diff.mean()),
        "ci_low": float(np.quantile(means, 0.025)),
        "ci_high": float(np.quantile(means, 0.975)),
        "p_value": float((1 + np.sum(means <= 0)) / (n_boot + 1)),
    }


def champion_decision(
    challenger: np.ndarray,
    champion: np.ndarray | None,
    groups: np.ndarray | None = None,
    min_effect: float = 0.5,
    alpha: float = 0.05,
    n_boot: int = 2000,
) -> dict[str, Any]:
    """The champion rule: replace the champion only for a real, large enough improvement.

    Args:
        challenger: ``(S, N)`` or ``(N,)`` per-sample outcomes of the challenger kind on the test samples,
            one row per seed trained (the mean over seeds is compared, so one lucky seed cannot win).
        champion: ``(N,)`` the champion's outcomes on the same samples, or None when there is no champion.
        groups: ``(N,)`` optional label per sample (e.g. whether the sample's user has new data); the mean
            difference is reported per group.
        min_effect: the smallest mean improvement (in the outcome's unit, points) worth a promotion.
        alpha: the largest bootstrap p-value accepted.
        n_boot: bootstrap resamples.

    Returns:
        ``promoted``, ``reason``, ``challenger_score`` and, with a champion, ``champion_score``, ``delta``,
        ``ci_low``, ``ci_high``, ``p_value``, ``min_effect``, ``alpha``, ``test`` and ``groups``
        (``{group: {"n": ..., "delta": ...}}``).
    """
    rows = np.atleast_2d(np.asarray(challenger, dtype=np.float64))
    mean = rows.mean(axis=0)
    decision: dict[str, Any] = {"challenger_score": float(mean.mean()), "seeds": int(rows.shape[0])}
    if champion is None:
        decision.update(promoted=True, reason="no champion yet")
        return decision
    champion = np.asarray(champion, dtype=np.float64)
    stats = paired_bootstrap(mean, champion, n_boot=n_boot)
    decision.update(
        champion_score=float(champion.mean()),
        **stats,
        min_effect=float(min_effect),
        alpha=float(alpha),
        test=f"paired bootstrap over {len(mean)} test samples ({n_boot} resamples), one-sided",
    )
    if groups is not None:
        groups = np.asarray(groups)
        decision["groups"] = {
            str(g): {"n": int((groups == g).sum()), "delta": float((mean - champion)[groups == g].mean())}
            for g in dict.fromkeys(groups.tolist())
        }
    big_enough = stats["delta"] >= min_effect
    significant = stats["p_value"] < alpha
    decision["promoted"] = bool(big_enough and significant)
    decision["reason"] = (
        f"challenger {'better' if decision['promoted'] else 'not better'}: "
        f"{decision['challenger_score']:.2f} vs {decision['champion_score']:.2f} "
        f"(delta {stats['delta']:+.2f}, 95% CI [{stats['ci_low']:+.2f}, {stats['ci_high']:+.2f}], "
        f"p {stats['p_value']:.3f}; needs delta >= {min_effect:g} and p < {alpha:g})"
    )
    return decision


# --------------------------------------------------------------------------- #
# packed histories (the registered models' input)
# --------------------------------------------------------------------------- #


def pack_batch(batch: Batch) -> torch.Tensor:
    """A :class:`Batch` back into the packed ``(B, T, 6)`` form (see :mod:`nextloc.serving`)."""
    user = batch.user[:, None].expand_as(batch.loc)
    return torch.stack(
        [
            batch.loc,
            batch.time * TIME_SLOT_MIN,
            batch.weekday,
            batch.duration * DURATION_BIN_MIN,
            batch.diff,
            user,
        ],
        dim=-1,
    )
