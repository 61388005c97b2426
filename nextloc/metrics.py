"""Ranking metrics for next-location prediction, in two families, plus the new-place metrics.

**Place metrics** (the product's headline, ``place_*``): what a user gets. Classes 0 (padding) and 1 (a
location not seen in training) are removed from every ranking, so a model can only name real places, and a
target of 1 is always a miss. They are averaged over *all* samples (``n``), so every model is scored on the
same denominator and a model cannot gain by predicting "somewhere new".

**Reference metrics** (``acc@k``, ``mrr``, ``ndcg@10``, ``f1``): the published protocol, kept exactly for
comparison with published work.

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

Place ranks follow the same convention over the classes ``>= 2`` only (the place rank of a target ``y >= 2``
is its rank among the real places); a target ``< 2`` has no place rank (stored as 0, scored as a miss), and
``place_f1`` is the weighted F1 of the top-ranked *place* against every target (a target of 1 keeps its
support and can never be predicted).

**New-place metrics**: ``new_place_rate`` is the share of targets that are new (class 1); for a model that
gives P(new place) per sample, ``new_place_auc`` is its ROC-AUC against "the target is new" and
``new_place_brier`` the Brier score (mean squared error of the probability, 0 best, *not* in percent).

All metrics except ``n`` and ``new_place_brier`` are reported in percent (x100). NaN scores are not supported
(their rank is undefined).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from nextloc.data import Batch, SampleTensors
from nextloc.metric_keys import (  # noqa: F401 (the names live there, torch-free; imported from here too)
    DEDUP_HEADLINE,
    DEDUP_KEYS,
    HEADLINE,
    METRIC_KEYS,
    NDCG_K,
    NEW_PLACE_KEYS,
    PLACE_KEYS,
    REFERENCE_KEYS,
    RESULT_KEYS,
    TOPK,
)
from nextloc.sequences import FIRST_PLACE, UNSEEN


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
        if index is not None and len(index) != len(target):
            raise ValueError(f"{len(index)} indices for {len(target)} targets")
        if (index is None and self._index) or (index is not None and self._without_index):
            raise ValueError("pass index in every update or in none")
        scores = scores.detach()
        ranks, top1 = target_ranks(scores, target)
        place, place_top1 = place_ranks(scores, target)
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
        out["place_f1"] = _weighted_f1(arrays["targets"], arrays["place_top1"])
        out.update(new_place_metrics(arrays["targets"], p_new))
        out.update(rank_metrics(arrays["ranks"]))
        out["f1"] = _weighted_f1(arrays["targets"], arrays["top1"])
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

        Means of these columns are the split's metrics; paired tests (``nextloc.evaluate``) compare models
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


def _weighted_f1(targets: np.ndarray, predicted: np.ndarray) -> float:
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
