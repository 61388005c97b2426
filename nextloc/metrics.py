"""Ranking metrics for next-location prediction: Acc@k, MRR, NDCG@10 and weighted F1.

The reference (ML ``utils/train.py`` ≡ V2 ``src/evaluation/metrics.py``, protocol §4) scores every class of the
vocabulary, **including 0 (padding) and 1 (unseen location)**, masks nothing, and micro-averages over samples.
It sorts all V classes twice per batch and breaks ties arbitrarily (``topk`` and ``argsort`` are separate sorts,
so a sample can even count as an Acc@1 hit with a rank of 2). This module fixes one deterministic convention
and computes it without any sort.

Rank convention (a stable descending sort over the whole vocabulary)::

    rank = 1 + #(classes with score > s_y) + #(classes with score == s_y and class index < y)

where ``y`` is the target and ``s_y`` its score. Every metric follows from that rank:

- ``acc@k`` = rank <= k (so Acc@k agrees with the MRR/NDCG ranking, unlike the reference's separate topk);
- ``mrr`` = mean of 1 / rank over the full ranking (not cut at 10);
- ``ndcg@10`` = 1 / log2(rank + 1) if rank <= 10 else 0 (one relevant item, IDCG = 1);
- ``f1`` = ``sklearn.metrics.f1_score(y_true, top1, average="weighted", zero_division=0)`` where ``top1`` is the
  rank-1 class under the same tie rule (the lowest index among the maximal scores).

All metrics except ``n`` are reported in percent (x100). NaN scores are not supported (their rank is undefined).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import f1_score

from nextloc.data import Batch, SampleTensors

TOPK = (1, 5, 10)
NDCG_K = 10
METRIC_KEYS = ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "f1", "n")


def target_ranks(scores: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank of each target and the top-1 class under the stable-descending-sort convention.

    Runs on the scores' device in one pass of comparisons (``O(B·V)``, no sort). Half-precision scores are
    upcast to float32 first (an exact conversion, so ties are preserved).

    Args:
        scores: ``(B, V)`` scores (logits, log-probabilities, ...) over the whole vocabulary.
        target: ``(B,)`` target class indices (moved to the scores' device).

    Returns:
        ``(ranks, top1)``: two ``(B,)`` int64 tensors on the scores' device; ranks are 1-based.

    Examples:
        >>> target_ranks(torch.tensor([[0.0, 2.0, 2.0, 1.0]]), torch.tensor([2]))[0].tolist()
        [2]
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be (B, V), got shape {tuple(scores.shape)}")
    scores = scores.float()
    target = target.to(device=scores.device, dtype=torch.long).reshape(-1, 1)  # (B, 1)
    if target.shape[0] != scores.shape[0]:
        raise ValueError(f"{target.shape[0]} targets for {scores.shape[0]} score rows")
    target_score = scores.gather(1, target)  # (B, 1)
    classes = torch.arange(scores.shape[1], device=scores.device)  # (V,)
    higher = (scores > target_score).sum(dim=1)
    tied_before = ((scores == target_score) & (classes < target)).sum(dim=1)
    ranks = 1 + higher + tied_before
    top1 = scores.argmax(dim=1)  # torch returns the first maximal index
    return ranks, top1


def rank_metrics(ranks: np.ndarray) -> dict[str, float]:
    """Acc@1/5/10, MRR and NDCG@10 (in percent) of an array of 1-based ranks.

    Args:
        ranks: 1-based ranks, any integer dtype.

    Returns:
        ``acc@1``, ``acc@5``, ``acc@10``, ``mrr``, ``ndcg@10`` (NaN when ``ranks`` is empty).

    Examples:
        >>> rank_metrics(np.array([1, 2]))["mrr"]
        75.0
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    if ranks.size == 0:
        return {**{f"acc@{k}": float("nan") for k in TOPK}, "mrr": float("nan"), "ndcg@10": float("nan")}
    out = {f"acc@{k}": float((ranks <= k).mean() * 100) for k in TOPK}
    out["mrr"] = float((1.0 / ranks).mean() * 100)
    ndcg = np.where(ranks <= NDCG_K, 1.0 / np.log2(ranks + 1.0), 0.0)
    out["ndcg@10"] = float(ndcg.mean() * 100)
    return out


class MetricAccumulator:
    """Accumulates ranks and top-1 predictions batch by batch; computes the split's metrics at the end.

    Ranks are computed on the scores' device in :meth:`update` and kept there; they are moved to the CPU once,
    in the first call to :meth:`compute` (or :meth:`ranks`, :meth:`top1`, :meth:`per_user`) after an update.

    Examples:
        >>> acc = MetricAccumulator()
        >>> acc.update(torch.tensor([[0.1, 0.9, 0.0], [0.5, 0.2, 0.3]]), torch.tensor([1, 2]))
        >>> acc.compute()["acc@1"]
        50.0
    """

    def __init__(self) -> None:
        self._ranks: list[torch.Tensor] = []
        self._top1: list[torch.Tensor] = []
        self._targets: list[torch.Tensor] = []
        self._index: list[torch.Tensor] = []
        self._without_index = 0
        self._cpu: dict[str, np.ndarray] | None = None

    def update(self, scores: torch.Tensor, target: torch.Tensor, index: torch.Tensor | None = None) -> None:
        """Add one batch.

        Args:
            scores: ``(B, V)`` scores over the whole vocabulary, any float dtype, any device.
            target: ``(B,)`` target classes.
            index: ``(B,)`` row of each sample in its split (``Batch.index``), used by :meth:`per_user`;
                ``None`` means insertion order. Either every update passes it or none does.

        Raises:
            ValueError: on mismatched shapes, or when updates with and without ``index`` are mixed.
        """
        if index is not None and len(index) != len(target):
            raise ValueError(f"{len(index)} indices for {len(target)} targets")
        if (index is None and self._index) or (index is not None and self._without_index):
            raise ValueError("pass index in every update or in none")
        ranks, top1 = target_ranks(scores.detach(), target)
        self._ranks.append(ranks)
        self._top1.append(top1)
        self._targets.append(target.detach().to(device=ranks.device, dtype=torch.long).reshape(-1))
        if index is None:
            self._without_index += 1
        else:
            self._index.append(index.detach().reshape(-1))
        self._cpu = None

    def __len__(self) -> int:
        return int(sum(len(r) for r in self._ranks))

    def reset(self) -> None:
        """Forget every batch."""
        self.__init__()

    def compute(self) -> dict[str, float]:
        """Metrics over every sample seen so far.

        Returns:
            ``acc@1``, ``acc@5``, ``acc@10``, ``mrr``, ``ndcg@10``, ``f1`` in percent and ``n`` (sample count);
            the percentages are NaN when no sample was added.
        """
        arrays = self._arrays()
        out = rank_metrics(arrays["ranks"])
        if len(arrays["ranks"]):
            f1 = f1_score(arrays["targets"], arrays["top1"], average="weighted", zero_division=0)
            out["f1"] = float(f1 * 100)
        else:
            out["f1"] = float("nan")
        out["n"] = len(arrays["ranks"])
        return out

    def ranks(self) -> np.ndarray:
        """``(N,)`` int64 1-based target ranks, in insertion order."""
        return self._arrays()["ranks"].copy()

    def top1(self) -> np.ndarray:
        """``(N,)`` int64 rank-1 classes (lowest index among the maximal scores), in insertion order."""
        return self._arrays()["top1"].copy()

    def targets(self) -> np.ndarray:
        """``(N,)`` int64 targets, in insertion order."""
        return self._arrays()["targets"].copy()

    def index(self) -> np.ndarray:
        """``(N,)`` int64 split row of each stored sample (``0..N-1`` if no index was passed to update)."""
        return self._arrays()["index"].copy()

    def per_user(self, user_ids: np.ndarray) -> pd.DataFrame:
        """Rank metrics per user (micro-averaged within the user).

        Args:
            user_ids: the user of every row of the split (e.g. ``SampleTensors.user_id_np`` or ``.user_np``),
                looked up with the ``index`` given to :meth:`update` (insertion order if none was given).

        Returns:
            One row per user, sorted by user: ``user``, ``n``, ``acc@1``, ``acc@5``, ``acc@10``, ``mrr``,
            ``ndcg@10`` (percent).
        """
        arrays = self._arrays()
        user_ids = np.asarray(user_ids)
        if len(arrays["index"]) and arrays["index"].max() >= len(user_ids):
            raise ValueError(f"index {arrays['index'].max()} out of range for {len(user_ids)} user ids")
        ranks = arrays["ranks"].astype(np.float64)
        frame = pd.DataFrame(
            {
                "user": user_ids[arrays["index"]],
                "n": 1,
                **{f"acc@{k}": (ranks <= k) * 100.0 for k in TOPK},
                "mrr": 100.0 / ranks,
                "ndcg@10": np.where(ranks <= NDCG_K, 100.0 / np.log2(ranks + 1.0), 0.0),
            }
        )
        columns = ["user", "n", *[f"acc@{k}" for k in TOPK], "mrr", "ndcg@10"]
        if frame.empty:
            return frame[columns]
        grouped = frame.groupby("user", sort=True)
        result = grouped.mean()
        result["n"] = grouped.size()
        return result.reset_index()[columns]

    def _arrays(self) -> dict[str, np.ndarray]:
        """Concatenate the stored tensors and move them to the CPU (once per change)."""
        if self._cpu is None:
            empty = np.zeros(0, dtype=np.int64)
            if self._ranks:
                ranks = torch.cat(self._ranks).cpu().numpy()
                top1 = torch.cat(self._top1).cpu().numpy()
                targets = torch.cat(self._targets).cpu().numpy()
            else:
                ranks, top1, targets = empty, empty, empty
            if self._index:
                index = torch.cat([i.to(torch.long).cpu() for i in self._index]).numpy()
            else:
                index = np.arange(len(ranks), dtype=np.int64)
            self._cpu = {"ranks": ranks, "top1": top1, "targets": targets, "index": index}
        return self._cpu


def evaluate_scores(
    score_fn: Callable[[Batch], torch.Tensor], data: SampleTensors, batch_size: int = 256
) -> tuple[dict[str, float], MetricAccumulator]:
    """Score a whole split batch by batch (under ``torch.no_grad``) and compute its metrics.

    Args:
        score_fn: maps a :class:`~nextloc.data.Batch` to ``(B, V)`` scores (put a model in eval mode first).
        data: the split.
        batch_size: samples per batch (in split order, no shuffling).

    Returns:
        ``(metrics, accumulator)``; the accumulator holds the ranks aligned with ``Batch.index`` for
        :meth:`MetricAccumulator.per_user`.

    Examples:
        >>> metrics, acc = evaluate_scores(model_scores, test)  # doctest: +SKIP
    """
    accumulator = MetricAccumulator()
    with torch.no_grad():
        for batch in data.batches(batch_size):
            accumulator.update(score_fn(batch), batch.target, batch.index)
    return accumulator.compute(), accumulator
