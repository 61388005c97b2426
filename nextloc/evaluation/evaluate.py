"""One home for evaluation: scoring a model on a split, the new-place head, and the packed form of histories
that registered models take (summaries over seeds: :mod:`nextloc.evaluation.leaderboard`; the champion rule's
statistics: :mod:`nextloc.evaluation.champion`).

Protocol (the same data budget as the reference for every headline number): a model is fit on train; every
choice (epoch, seed, the new-place head's coefficients, the champion) is made on validation; test is scored
once and read by no decision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
import torch
from torch import nn

from nextloc.evaluation.metrics import (
    DEDUP_KEYS,
    SET_LEVELS,
    SET_TOLERANCE,
    reliability,
    set_metrics,
    set_outcomes,
)
from nextloc.evaluation.tensor_metrics import MetricAccumulator
from nextloc.models.batch import Batch, SampleTensors, by_length
from nextloc.preprocessing.sequences import FIRST_PLACE, UNSEEN
from nextloc.routine.novelty import (
    FEATURE_SETS,
    FEATURES,
    NewPlaceHead,
    history_features,
    novelty_features,
    with_new_place,
)
from nextloc.routine.sparse import SparseAnswers

if TYPE_CHECKING:
    from nextloc.routine.data import RoutineData
    from nextloc.routine.ranking import CandidateScorer

# a batch's answers: (B, V) scores over the vocabulary, or a routine kind's sparse answers
ScoreFn = Callable[[Batch], torch.Tensor | SparseAnswers]


@dataclass
class SplitScores:
    """A split scored by a model: the metric accumulator and the new-place head's inputs, in split order."""

    accumulator: MetricAccumulator
    features: np.ndarray  # (N, F): novelty.FEATURES, then the routine's explore features if given
    # (N,) split order, scored with a head: the one distribution's top probability and whether its class is the target
    top_p: np.ndarray | None = None
    top_hit: np.ndarray | None = None
    # (N, len(SET_LEVELS)) split order, scored with a head: whether the one distribution's answer set at each
    # level holds the target, and its size
    set_covered: np.ndarray | None = None
    set_sizes: np.ndarray | None = None

    def reliability(self) -> tuple[list[dict], float]:
        """:func:`~nextloc.evaluation.metrics.reliability` of the one distribution (scored with a head)."""
        if self.top_p is None or self.top_hit is None:
            raise ValueError("a split scored without a new-place head has no one distribution")
        return reliability(self.top_p, self.top_hit)

    def answer_sets(self) -> dict[str, float]:
        """:func:`~nextloc.evaluation.metrics.set_metrics` of the one distribution (scored with a head)."""
        if self.set_covered is None or self.set_sizes is None:
            raise ValueError("a split scored without a new-place head has no one distribution")
        return set_metrics(self.set_covered, self.set_sizes)

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
    # (N_test,) whether each test target is a copy of another user's staypoint (nextloc.raw.duplicates), split
    # order; None when not known (no final staypoints next to the samples)
    test_copied: np.ndarray | None = None
    # the one distribution's reliability on validation (a routine kind's: evaluate(joint=True)), else None
    val_reliability: list[dict] | None = None
    # a routine kind's test metrics with the head reading the share of the unseen places that have at least
    # 2 visits before now (the protocol's DBSCAN effect, docs/protocol.md), else None
    past_places: dict[str, float] | None = None
    # validation's new-place head inputs (the model's features, then the explore features) and whether each
    # target was a new place: what retest() fits another head on
    head_inputs: tuple[np.ndarray, np.ndarray] | None = None
    # validation scored by the model chosen there (what the champion rule reads), its head's P(new place)
    # (split order) and, like test_copied, whether each target is a copy
    val_scores: SplitScores | None = None
    val_p_new: np.ndarray | None = None
    val_copied: np.ndarray | None = None

    def per_sample(self, split: Literal["val", "test"] = "test") -> pd.DataFrame:
        """Outcomes per sample of ``split`` (hits and gains of both families, P(new place), and
        ``target_is_copy`` when the copies are known), in split order: test's are the tested model's,
        validation's the model chosen on validation (for a refit, the model before it trained on them)."""
        scores, p_new, copied = (
            (self.val_scores, self.val_p_new, self.val_copied)
            if split == "val"
            else (self.test_scores, self.test_p_new, self.test_copied)
        )
        if scores is None or p_new is None:
            raise ValueError(f"this evaluation kept no per-sample outcomes of {split!r}")
        frame = scores.accumulator.per_sample()
        frame["p_new"] = p_new[np.argsort(scores.accumulator.index(), kind="stable")]
        if copied is not None:
            frame["target_is_copy"] = np.asarray(copied, dtype=bool)
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

    return lambda batch: by_length(score, batch)  # length-sorted pieces: the same rows, little padding


def routine_scores(data: RoutineData, model: CandidateScorer, split: str, scores: np.ndarray) -> ScoreFn:
    """Batch -> a routine kind's answers to the batch's questions of ``split`` (``scores``: its candidates'
    scores) as :class:`~nextloc.routine.sparse.SparseAnswers`: neither a split's ``(N, V)`` nor a batch's
    ``(B, V)`` is ever held."""
    tail = data.tail(model)
    return lambda batch: data.answers(model, split, scores, batch.index.cpu().numpy(), tail)


def score_split(
    score_fn: ScoreFn,
    data: SampleTensors,
    batch_size: int = 512,
    explore: np.ndarray | None = None,
    head: NewPlaceHead | None = None,
    joint: bool = True,
    window: np.ndarray | None = None,
) -> SplitScores:
    """Score every sample of ``data`` in split order (under ``torch.no_grad``); ``explore`` ``(N, E)``, the
    routine's explore features in split order, joins the new-place head's inputs; ``window`` ``(N, T)``, the
    places of each question's window anchored at its now (a routine kind's,
    :func:`nextloc.routine.visits.window_places`), is what the head's window inputs read instead of the
    sample's history.

    With ``head``, each sample's answer is also read as one distribution over the known places and "a new
    place" (:func:`~nextloc.routine.novelty.with_new_place`: the head's P(new place) on class 1, the model's
    place probabilities times ``1 - P(new)``; what ``nextloc predict`` answers with): its answer sets at
    :data:`~nextloc.evaluation.metrics.SET_LEVELS` and its top answer (:meth:`SplitScores.answer_sets`,
    :meth:`SplitScores.reliability`). With ``joint`` too (a routine kind's answer), the metrics read that
    distribution rather than the model's own scores; the features stay those of the model's own answer
    (what the head reads)."""
    accumulator = MetricAccumulator()
    features = []
    n, levels = len(data), len(SET_LEVELS)
    top_p, top_hit = np.full(n, np.nan), np.zeros(n, dtype=bool)
    covered, sizes = np.zeros((n, levels), dtype=bool), np.zeros((n, levels), dtype=np.int64)
    with torch.no_grad():
        for batch in data.batches(batch_size):
            answer = score_fn(batch)
            batch_features = _novelty_features(answer, _with_window(batch, window))
            features.append(batch_features)
            if head is not None:
                rows, target = batch.index.cpu().numpy(), batch.target.cpu().numpy()
                x = batch_features.astype(np.float64)
                if explore is not None:
                    x = np.column_stack([x, explore[rows]])
                one = _with_new_place(answer, head.predict(x))
                top_p[rows], top_hit[rows], covered[rows], sizes[rows] = _one_outcomes(one, target)
                if joint:
                    answer = one
            _accumulate(accumulator, answer, batch)
    stacked = np.concatenate(features) if features else np.zeros((0, len(FEATURES)), dtype=np.float32)
    stacked = stacked.astype(np.float64)
    split_features = stacked if explore is None else np.column_stack([stacked, explore])
    if head is None:
        return SplitScores(accumulator, split_features)
    return SplitScores(accumulator, split_features, top_p, top_hit, covered, sizes)


def _novelty_features(answer: torch.Tensor | SparseAnswers, batch: Batch) -> np.ndarray:
    """``(B, len(FEATURES))`` float32: the new-place head's inputs of a batch's answers."""
    if isinstance(answer, SparseAnswers):
        loc = batch.loc.cpu().numpy()
        return np.concatenate([answer.novelty_scores(loc), history_features(loc)], axis=1)
    return novelty_features(answer, batch).cpu().numpy()


def _with_new_place(answer: torch.Tensor | SparseAnswers, p_new: np.ndarray) -> np.ndarray | SparseAnswers:
    """The one distribution over the known places and "a new place" of a batch's answers."""
    if isinstance(answer, SparseAnswers):
        return answer.with_new_place(p_new)
    return with_new_place(answer.cpu().numpy(), p_new)


def _one_outcomes(one: np.ndarray | SparseAnswers, target: np.ndarray) -> tuple[np.ndarray, ...]:
    """A batch's one distribution read: its top answer's probability and whether it came, whether each
    answer set at :data:`SET_LEVELS` holds the target and its size."""
    if isinstance(one, SparseAnswers):
        top, value = one.top()
        return (
            np.exp(value.astype(np.float64)),
            top == target,
            *one.set_outcomes(target, SET_LEVELS, SET_TOLERANCE),
        )
    top_p, top_hit = np.exp(one.max(axis=1).astype(np.float64)), one.argmax(axis=1) == target
    return (top_p, top_hit, *set_outcomes(np.exp(one.astype(np.float64)), target, SET_LEVELS))


def _accumulate(
    accumulator: MetricAccumulator, answer: torch.Tensor | np.ndarray | SparseAnswers, batch: Batch
) -> None:
    """Add a batch's answers' ranks to ``accumulator``."""
    if not isinstance(answer, SparseAnswers):
        scores = torch.as_tensor(answer).to(batch.loc.device)
        accumulator.update(scores, batch.target, batch.index)
        return
    target = batch.target.cpu().numpy()
    (top1, _), (place_top1, _) = answer.top(), answer.top(FIRST_PLACE)
    ranks = (answer.ranks(target), top1, answer.ranks(target, FIRST_PLACE), place_top1)
    accumulator.add(
        *(torch.from_numpy(np.asarray(r, dtype=np.int64)) for r in ranks), batch.target, batch.index
    )


def _with_window(batch: Batch, window: np.ndarray | None) -> Batch:
    """``batch`` with each sample's history places replaced by its row of ``window`` (None: as it is)."""
    if window is None:
        return batch
    rows = window[batch.index.cpu().numpy()]
    return dataclasses.replace(batch, loc=torch.from_numpy(rows).to(batch.loc.device, batch.loc.dtype))


def evaluate(
    val_scores: ScoreFn,
    test_scores: ScoreFn,
    val: SampleTensors,
    test: SampleTensors,
    batch_size: int = 512,
    head: NewPlaceHead | None = None,
    explore: tuple[np.ndarray, np.ndarray] | None = None,
    head_val_scores: ScoreFn | None = None,
    joint: bool = False,
    windows: tuple[np.ndarray, np.ndarray] | None = None,
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
        joint: score the one distribution over the known places and "a new place" (a routine kind's answer,
            :func:`score_split` with the head) rather than the model's own; the head is fit on the model's own.
        windows: each val and test question's window anchored at its now (:func:`score_split`'s
            ``window``; a routine kind's), else the samples' histories.

    Returns:
        An :class:`Evaluation`. Validation metrics carry ``new_place_rate`` but no AUC/Brier (the head is fit
        there); test metrics carry all of :data:`nextloc.evaluation.metrics.METRIC_KEYS` and
        :data:`~nextloc.evaluation.metrics.SET_KEYS` (the answer sets of the one distribution that ``nextloc
        predict`` answers with: for a kind scored without ``joint``, its place probabilities times ``1 - P(new
        place)`` and the head's P(new place)); with ``joint`` both also carry ``top1_ece``, the expected
        calibration error of the one distribution's top answer.
    """
    val_explore, test_explore = explore if explore is not None else (None, None)
    val_window, test_window = windows if windows is not None else (None, None)
    val_split = score_split(val_scores, val, batch_size, val_explore, window=val_window)
    head_scores = head_val_scores or test_scores
    head_split = (
        val_split
        if head_scores is val_scores
        else score_split(head_scores, val, batch_size, val_explore, window=val_window)
    )
    head = head or _fit_head(head_split.features, head_split.is_new)
    if joint:
        val_split = score_split(val_scores, val, batch_size, val_explore, head, window=val_window)
    test_split = score_split(test_scores, test, batch_size, test_explore, head, joint, test_window)
    test_metrics, p_new = _test_metrics(test_split, head, joint)
    val_metrics, table = val_split.accumulator.compute(), None
    if joint:  # how well the one distribution's probabilities are calibrated (its top answer's)
        table, val_metrics["top1_ece"] = val_split.reliability()
    return Evaluation(
        val=val_metrics,
        test=test_metrics,
        head=head,
        test_scores=test_split,
        test_p_new=p_new,
        per_user=test_split.accumulator.per_user(test.user_id_np),
        target_in_history=float(100 * test.target_in_history().mean()) if len(test) else float("nan"),
        val_reliability=table,
        head_inputs=(head_split.features, head_split.is_new),
        val_scores=val_split,
        val_p_new=head.predict(val_split.features),
    )


def retest(
    evaluation: Evaluation,
    test_scores: ScoreFn,
    test: SampleTensors,
    explore: tuple[np.ndarray, np.ndarray],
    batch_size: int = 512,
    joint: bool = False,
    window: np.ndarray | None = None,
) -> dict[str, float]:
    """The test metrics of :func:`evaluate`'s model with its new-place head fit again, on the same validation
    scores, reading ``explore`` (val's, test's) as the routine's explore features instead: what
    :func:`evaluate` with ``explore`` would report on test, without scoring validation again (its features
    are kept in :attr:`Evaluation.head_inputs`)."""
    if evaluation.head_inputs is None:
        raise ValueError("this evaluation kept no validation features to fit another head on")
    features, is_new = evaluation.head_inputs
    val_features = np.column_stack([features[:, : len(FEATURES)], explore[0]])
    head = _fit_head(val_features, is_new)
    test_split = score_split(test_scores, test, batch_size, explore[1], head, joint, window)
    return _test_metrics(test_split, head, joint)[0]


def _fit_head(features: np.ndarray, is_new: np.ndarray) -> NewPlaceHead:
    """The new-place head fit on validation's inputs (its feature names from their number of columns)."""
    names = next(names for names in FEATURE_SETS if len(names) == features.shape[1])
    return NewPlaceHead.fit(features, is_new, names=names)


def _test_metrics(
    test_split: SplitScores, head: NewPlaceHead, joint: bool
) -> tuple[dict[str, float], np.ndarray]:
    """The test split's metrics with ``head``'s P(new place) (and the one distribution's answer sets, and its
    top answer's calibration error when ``joint``), and that P(new place)."""
    p_new = head.predict(test_split.features)
    metrics = test_split.accumulator.compute(p_new)
    metrics.update(test_split.answer_sets())  # what `nextloc predict --coverage` answers, measured
    if joint:
        metrics["top1_ece"] = test_split.reliability()[1]
    return metrics, p_new


def without_copies(per_sample: pd.DataFrame, copied: np.ndarray) -> dict[str, float]:
    """The place rank metrics over the samples whose target is not a copy (:data:`DEDUP_KEYS`), and their
    count ``n_test_dedup``.

    Each metric is the mean of its :meth:`MetricAccumulator.per_sample` column (what the split's metric
    is) over the samples kept; ``place_f1`` is left out: it is not a mean over samples.

    Args:
        per_sample: :meth:`Evaluation.per_sample` (split order).
        copied: ``(N,)`` whether each sample's target is a copy (:func:`nextloc.raw.duplicates.copied_targets`),
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
