"""The metrics' ranks on torch tensors, per batch, and the split's metrics from them.

The rank convention and every metric are :mod:`nextloc.evaluation.metrics`' (which imports no torch, so that the flows
read its keys without it): :func:`target_ranks` and :func:`place_ranks` compute the ranks of a batch's
scores, :class:`MetricAccumulator` keeps them over a split and computes its metrics with
:func:`nextloc.evaluation.metrics.rank_metrics`, :func:`nextloc.evaluation.metrics.new_place_metrics` and
:func:`nextloc.evaluation.metrics.weighted_f1`, and :func:`evaluate_scores` scores a whole split.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from nextloc.evaluation.metrics import (
    METRIC_KEYS,
    NDCG_K,
    REFERENCE_KEYS,
    TOPK,
    new_place_metrics,
    rank_metrics,
    weighted_f1,
)
from nextloc.models.batch import Batch, SampleTensors
from nextloc.preprocessing.sequences import FIRST_PLACE


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


def place_ranks(scores: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Place rank of each target and the top-ranked place: classes 0 and 1 removed from the ranking.

    Args:
        scores: ``(B, V)`` scores over the whole vocabulary.
        target: ``(B,)`` target class indices.

    Returns:
        ``(ranks, top1)``: ``(B,)`` int64 tensors on the scores' device; ``ranks`` is the 1-based rank of the
        target among the places (classes ``>= 2``), **0 when the target is not a place** (0 or 1: a miss);
        ``top1`` is the best place (never 0 or 1; lowest index among ties). A vocabulary without places
        (``V <= 2``) ranks nothing: every rank is 0 and ``top1`` is 2.

    Examples:
        >>> place_ranks(torch.tensor([[0.0, 9.0, 2.0, 2.0], [0.0, 9.0, 1.0, 2.0]]), torch.tensor([3, 1]))
        (tensor([2, 0]), tensor([2, 3]))
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be (B, V), got shape {tuple(scores.shape)}")
    target = target.to(device=scores.device, dtype=torch.long).reshape(-1)
    if scores.shape[1] <= FIRST_PLACE:
        none = torch.zeros_like(target)
        return none, none + FIRST_PLACE
    is_place = target >= FIRST_PLACE
    ranks, top1 = target_ranks(scores[:, FIRST_PLACE:], (target - FIRST_PLACE).clamp(min=0))
    return torch.where(is_place, ranks, torch.zeros_like(ranks)), top1 + FIRST_PLACE


_RANK_COLUMNS = tuple(f"{family}{key}" for family in ("place_", "") for key in (*REFERENCE_KEYS[:-1],))
_STORED = ("ranks", "top1", "place_ranks", "place_top1", "targets")


class MetricAccumulator:
    """Accumulates ranks and top-1 predictions batch by batch; computes the split's metrics at the end.

    Both families are accumulated: reference ranks over the whole vocabulary and place ranks over classes
    ``>= 2`` (see the module docstring). Ranks are computed on the scores' device in :meth:`update` and kept
    there; they are moved to the CPU once, in the first call to :meth:`compute` (or :meth:`ranks`,
    :meth:`top1`, :meth:`per_user`, ...) after an update.

    Examples:
        >>> acc = MetricAccumulator()
        >>> acc.update(torch.tensor([[0.1, 0.9, 0.0], [0.5, 0.2, 0.3]]), torch.tensor([1, 2]))
        >>> acc.compute()["acc@1"], acc.compute()["place_acc@1"]
        (50.0, 50.0)
    """

    def __init__(self) -> None:
        self._stored: dict[str, list[torch.Tensor]] = {key: [] for key in _STORED}
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
        scores = scores.detach()
        ranks, top1 = target_ranks(scores, target)
        place, place_top1 = place_ranks(scores, target)
        self.add(ranks, top1, place, place_top1, target, index)

    def add(
        self,
        ranks: torch.Tensor,
        top1: torch.Tensor,
        place: torch.Tensor,
        place_top1: torch.Tensor,
        target: torch.Tensor,
        index: torch.Tensor | None = None,
    ) -> None:
        """Add one batch's ranks, computed elsewhere with :func:`target_ranks` and :func:`place_ranks`' rule
        (a routine kind's sparse answers: :meth:`nextloc.routine.sparse.SparseAnswers.ranks`); arguments as
        :meth:`update`, each ``(B,)``."""
        if index is not None and len(index) != len(target):
            raise ValueError(f"{len(index)} indices for {len(target)} targets")
        if (index is None and self._index) or (index is not None and self._without_index):
            raise ValueError("pass index in every update or in none")
        batch = {
            "ranks": ranks,
            "top1": top1,
            "place_ranks": place,
            "place_top1": place_top1,
            "targets": target.detach().to(device=ranks.device, dtype=torch.long).reshape(-1),
        }
        for key, value in batch.items():
            self._stored[key].append(value)
        if index is None:
            self._without_index += 1
        else:
            self._index.append(index.detach().reshape(-1))
        self._cpu = None

    def __len__(self) -> int:
        return int(sum(len(r) for r in self._stored["ranks"]))

    def reset(self) -> None:
        """Forget every batch."""
        self.__init__()

    def compute(self, p_new: np.ndarray | None = None) -> dict[str, float]:
        """Metrics over every sample seen so far.

        Args:
            p_new: optional ``(N,)`` P(new place) per stored sample, in insertion order; adds
                ``new_place_auc`` and ``new_place_brier``.

        Returns:
            The place metrics (``place_acc@1`` ... ``place_f1``), ``new_place_rate`` (and the P(new place) metrics
            when given), the reference metrics (``acc@1`` ... ``f1``), all in percent except the Brier score,
            and ``n`` (sample count); the percentages are NaN when no sample was added.
        """
        arrays = self._arrays()
        out = {f"place_{k}": v for k, v in rank_metrics(arrays["place_ranks"]).items()}
        out["place_f1"] = weighted_f1(arrays["targets"], arrays["place_top1"])
        out.update(new_place_metrics(arrays["targets"], p_new))
        out.update(rank_metrics(arrays["ranks"]))
        out["f1"] = weighted_f1(arrays["targets"], arrays["top1"])
        out["n"] = len(arrays["ranks"])
        return {key: out[key] for key in METRIC_KEYS if key in out}

    def ranks(self) -> np.ndarray:
        """``(N,)`` int64 1-based target ranks, in insertion order."""
        return self._arrays()["ranks"].copy()

    def top1(self) -> np.ndarray:
        """``(N,)`` int64 rank-1 classes (lowest index among the maximal scores), in insertion order."""
        return self._arrays()["top1"].copy()

    def place_ranks(self) -> np.ndarray:
        """``(N,)`` int64 1-based place ranks (0: the target is not a place, a miss), in insertion order."""
        return self._arrays()["place_ranks"].copy()

    def place_top1(self) -> np.ndarray:
        """``(N,)`` int64 top-ranked places (never 0 or 1), in insertion order."""
        return self._arrays()["place_top1"].copy()

    def targets(self) -> np.ndarray:
        """``(N,)`` int64 targets, in insertion order."""
        return self._arrays()["targets"].copy()

    def index(self) -> np.ndarray:
        """``(N,)`` int64 split row of each stored sample (``0..N-1`` if no index was passed to update)."""
        return self._arrays()["index"].copy()

    def per_sample(self) -> pd.DataFrame:
        """One row per stored sample, sorted by split row: ``index``, ``target``, and per family the hits and
        gains (``place_acc@1`` ... ``place_ndcg@10``, ``acc@1`` ... ``ndcg@10``, in percent: 100 or 0 for hits).

        Means of these columns are the split's metrics; paired tests (``nextloc.evaluation.evaluate``) compare models
        sample by sample with them.
        """
        arrays = self._arrays()
        frame = pd.DataFrame({"index": arrays["index"], "target": arrays["targets"]})
        for family, ranks in (("place_", arrays["place_ranks"]), ("", arrays["ranks"])):
            ranks = np.where(ranks >= 1, ranks, np.inf).astype(np.float64)
            for k in TOPK:
                frame[f"{family}acc@{k}"] = (ranks <= k) * 100.0
            frame[f"{family}mrr"] = 100.0 / ranks
            frame[f"{family}ndcg@10"] = np.where(ranks <= NDCG_K, 100.0 / np.log2(ranks + 1.0), 0.0)
        return frame.sort_values("index", kind="stable").reset_index(drop=True)

    def per_user(self, user_ids: np.ndarray) -> pd.DataFrame:
        """Rank metrics per user (micro-averaged within the user).

        Args:
            user_ids: the user of every row of the split (e.g. ``SampleTensors.user_id_np`` or ``.user_np``),
                looked up with the ``index`` given to :meth:`update` (insertion order if none was given).

        Returns:
            One row per user, sorted by user: ``user``, ``n``, then ``place_acc@1``, ``place_acc@5``,
            ``place_acc@10``, ``place_mrr``, ``place_ndcg@10`` and the same reference columns (percent).
        """
        arrays = self._arrays()
        user_ids = np.asarray(user_ids)
        if len(arrays["index"]) and arrays["index"].max() >= len(user_ids):
            raise ValueError(f"index {arrays['index'].max()} out of range for {len(user_ids)} user ids")
        frame = self.per_sample()
        frame.insert(0, "user", user_ids[frame["index"].to_numpy()])
        frame["n"] = 1
        columns = ["user", "n", *_RANK_COLUMNS]
        if frame.empty:
            return frame[columns]
        grouped = frame[columns].groupby("user", sort=True)
        result = grouped.mean()
        result["n"] = grouped.size()
        return result.reset_index()[columns]

    def _arrays(self) -> dict[str, np.ndarray]:
        """Concatenate the stored tensors and move them to the CPU (once per change)."""
        if self._cpu is None:
            arrays = {
                key: torch.cat(values).cpu().numpy() if values else np.zeros(0, dtype=np.int64)
                for key, values in self._stored.items()
            }
            if self._index:
                arrays["index"] = torch.cat([i.to(torch.long).cpu() for i in self._index]).numpy()
            else:
                arrays["index"] = np.arange(len(arrays["ranks"]), dtype=np.int64)
            self._cpu = arrays
        return self._cpu


def evaluate_scores(
    score_fn: Callable[[Batch], torch.Tensor], data: SampleTensors, batch_size: int = 256
) -> tuple[dict[str, float], MetricAccumulator]:
    """Score a whole split batch by batch (under ``torch.no_grad``) and compute its metrics.

    Args:
        score_fn: maps a :class:`~nextloc.models.batch.Batch` to ``(B, V)`` scores (put a model in eval mode first).
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
