"""P(new place): how likely the next place is one the model has never seen, as an explicit probability.

A place model answers "which known place next"; a user also needs "how likely is somewhere new". In the
reference encoding a target of ``1`` is a location absent from the train split, so "new" is exactly
``target == 1``. Place models are not taught to emit ``1`` (the train split has no such target by
construction, and place metrics never credit it); instead a small binary head turns what the model and the
history say into a calibrated probability:

* from the model's scores: the probability it puts on the unseen token (its own, uncalibrated, notion of
  "new"), the entropy of its distribution over places (normalised to ``[0, 1]``), its top place probability,
  and the place mass it puts on places of the history (a routine day is a copy of the history);
* from the history: the share of its visits that were already new (``1``), whether the last one was, the
  share of distinct places and the log of its length.

The head is a logistic regression over those standardised features. Because the train split has no new
target, the only data with the real label before test is the validation split: the head is fit there (nine
coefficients: the validation split's role in the reference protocol is exactly such choices) and scored
once on test. Every model kind gets one, baselines included; the head of a model is stored with it as plain
numbers (:meth:`NewPlaceHead.to_dict`), nothing pickled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nextloc.preprocessing.sequences import FIRST_PLACE, PAD, UNSEEN
from nextloc.routine.features import EXPLORE_FEATURES

if TYPE_CHECKING:
    import torch

    from nextloc.models.batch import Batch

FEATURES = (
    "model_p_unseen",
    "model_place_entropy",
    "model_top_place_p",
    "model_history_place_mass",
    "history_unseen_share",
    "history_last_unseen",
    "history_distinct_share",
    "history_log_length",
)
MAX_LOGIT = math.log((1 - 1e-3) / 1e-3)  # P(new place) stays within [1e-3, 1 - 1e-3]
# the routine kinds' head also reads how much the user explores (nextloc.routine.features.EXPLORE_FEATURES)
# and the model's share of the unseen places the user visited (nextloc.routine.unseen); a model registered
# before that share was kept reads the explore features alone
ROUTINE_FEATURES_V1 = (*FEATURES, *EXPLORE_FEATURES)
ROUTINE_FEATURES = (*ROUTINE_FEATURES_V1, "unseen_return_share")
FEATURE_SETS = (FEATURES, ROUTINE_FEATURES_V1, ROUTINE_FEATURES)


def novelty_features(scores: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The head's inputs, :data:`FEATURES`, for one batch.

    Args:
        scores: ``(B, V)`` the model's scores over the whole vocabulary (logits or log-probabilities: both
            are turned into probabilities with a softmax).
        batch: the batch the scores are for.

    Returns:
        ``(B, len(FEATURES))`` float32 on the scores' device.
    """
    import torch  # torch: a network's batches (a routine kind's answer uses novelty_features_numpy)

    probs = torch.softmax(scores.float(), dim=-1)  # (B, V)
    p_unseen = probs[:, UNSEEN]  # (B,)
    places = probs[:, FIRST_PLACE:]
    places = places / places.sum(dim=-1, keepdim=True).clamp(min=1e-12)  # (B, V - 2)
    entropy = -(places * places.clamp(min=1e-12).log()).sum(dim=-1) / math.log(max(places.shape[1], 2))
    top = places.max(dim=-1).values if places.shape[1] else torch.zeros_like(p_unseen)

    loc = batch.loc.to(scores.device)
    valid = loc != PAD  # (B, T)
    in_history = torch.zeros_like(probs, dtype=torch.bool).scatter(1, loc, valid)  # (B, V); padding -> col 0
    in_history[:, :FIRST_PLACE] = False
    history_mass = (probs * in_history).sum(dim=-1) / probs[:, FIRST_PLACE:].sum(dim=-1).clamp(min=1e-12)

    length = valid.sum(dim=-1).clamp(min=1).float()  # (B,)
    unseen_share = ((loc == UNSEEN) & valid).sum(dim=-1) / length
    last = loc.gather(1, (length.long() - 1).unsqueeze(1)).squeeze(1)
    distinct = torch.zeros_like(probs, dtype=torch.bool).scatter(1, loc, valid)[:, 1:].sum(dim=-1) / length
    return torch.stack(
        [
            p_unseen,
            entropy,
            top,
            history_mass,
            unseen_share,
            (last == UNSEEN).float(),
            distinct,
            length.log(),
        ],
        dim=-1,
    ).float()


def novelty_features_numpy(scores: np.ndarray, loc: np.ndarray) -> np.ndarray:
    """:func:`novelty_features` in numpy, for answering without torch: the same formulas in float32 (their
    sums and exp differ from torch's in the last bits: P(new place) by up to ~3e-7, the 6th decimal of ~1% of
    answers).

    Args:
        scores: ``(B, V)`` logits or log-probabilities.
        loc: ``(B, T)`` the histories' locations, right-padded with 0.
    """
    scores = np.asarray(scores, dtype=np.float32)
    exp = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = exp / exp.sum(axis=-1, keepdims=True)
    places = probs[:, FIRST_PLACE:]
    places = places / np.maximum(places.sum(axis=-1, keepdims=True), np.float32(1e-12))
    log_places = np.log(np.maximum(places, np.float32(1e-12)))
    entropy = -(places * log_places).sum(axis=-1) / np.float32(math.log(max(places.shape[1], 2)))
    top = places.max(axis=-1) if places.shape[1] else np.zeros(len(probs), np.float32)
    valid = loc != PAD
    rows = np.broadcast_to(np.arange(len(loc))[:, None], loc.shape)
    in_history = np.zeros(probs.shape, dtype=bool)
    in_history[rows[valid], loc[valid]] = True
    in_history[:, :FIRST_PLACE] = False
    mass = (probs * in_history).sum(axis=-1) / np.maximum(
        probs[:, FIRST_PLACE:].sum(axis=-1), np.float32(1e-12)
    )
    columns = [probs[:, UNSEEN], entropy, top, mass]
    scores_part = np.stack([np.asarray(c, dtype=np.float32) for c in columns], axis=-1)
    return np.concatenate([scores_part, history_features(loc)], axis=-1)


def history_features(loc: np.ndarray) -> np.ndarray:
    """``(B, 4)`` float32 the head's inputs read from the histories alone (:data:`FEATURES`' last four:
    the share of new places, whether the last was one, the share of distinct classes, the log length), from
    ``loc`` ``(B, T)``, right-padded with 0."""
    loc = np.asarray(loc, dtype=np.int64)
    valid = loc != PAD
    length = np.maximum(valid.sum(axis=-1), 1).astype(np.float32)
    unseen_share = ((loc == UNSEEN) & valid).sum(axis=-1).astype(np.float32) / length
    last = loc[np.arange(len(loc)), length.astype(np.int64) - 1]
    ordered = np.sort(np.where(valid, loc, PAD), axis=-1)
    first_of_kind = np.ones(ordered.shape, dtype=bool)
    first_of_kind[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    distinct = (first_of_kind & (ordered != PAD)).sum(axis=-1).astype(np.float32) / length
    columns = [unseen_share, (last == UNSEEN), distinct, np.log(length)]
    return np.stack([np.asarray(c, dtype=np.float32) for c in columns], axis=-1)


@dataclass(frozen=True)
class NewPlaceHead:
    """A logistic regression ``P(new) = sigmoid(intercept + coef . (x - mean) / scale)`` over :data:`FEATURES`.

    Build it with :meth:`fit`; store it with :meth:`to_dict` / :meth:`from_dict` (plain numbers).

    Examples:
        >>> head = NewPlaceHead.constant(0.25)
        >>> head.predict(np.zeros((2, len(FEATURES)))).round(2).tolist()
        [0.25, 0.25]
    """

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    n_fit: int = 0
    rate_fit: float = float("nan")

    @classmethod
    def fit(
        cls, features: np.ndarray, is_new: np.ndarray, c: float = 1.0, names: tuple[str, ...] = FEATURES
    ) -> NewPlaceHead:
        """Fit on ``features`` ``(N, F)`` (columns ``names``, one of :data:`FEATURE_SETS`) against the
        outcome ``is_new`` ``(N,)`` (L2, ``C = c``, deterministic).

        With a single outcome (no new place, or only new places) there is nothing to separate: the head
        returns the observed rate (clipped into ``[1e-3, 1 - 1e-3]``) for every sample.
        """
        x = np.asarray(features, dtype=np.float64)
        y = np.asarray(is_new, dtype=bool)
        if x.ndim != 2 or x.shape[1] != len(names) or len(x) != len(y):
            raise ValueError(f"features must be (N, {len(names)}) with one outcome per row, got {x.shape}")
        if len(y) == 0:
            raise ValueError("no sample to fit the new-place head on")
        rate = float(y.mean())
        if y.all() or not y.any():
            return cls.constant(rate, n_fit=len(y), names=names)
        mean = x.mean(axis=0)
        scale = x.std(axis=0)
        scale = np.where(scale > 1e-12, scale, 1.0)
        from sklearn.linear_model import LogisticRegression  # sklearn takes ~1 s to import: only when fitting

        model = LogisticRegression(C=c, max_iter=1000).fit((x - mean) / scale, y)
        return cls(
            features=tuple(names),
            mean=tuple(float(v) for v in mean),
            scale=tuple(float(v) for v in scale),
            coef=tuple(float(v) for v in model.coef_[0]),
            intercept=float(model.intercept_[0]),
            n_fit=len(y),
            rate_fit=rate,
        )

    @classmethod
    def constant(cls, rate: float, n_fit: int = 0, names: tuple[str, ...] = FEATURES) -> NewPlaceHead:
        """A head that answers ``rate`` for every sample (clipped into ``[1e-3, 1 - 1e-3]``)."""
        rate_c = min(max(rate, 1e-3), 1 - 1e-3)
        zeros = tuple(0.0 for _ in names)
        return cls(
            tuple(names),
            zeros,
            tuple(1.0 for _ in names),
            zeros,
            math.log(rate_c / (1 - rate_c)),
            n_fit,
            rate,
        )

    def predict(self, features: np.ndarray | torch.Tensor) -> np.ndarray:
        """``(N,)`` float64 probabilities that the next place is new."""
        if not isinstance(features, np.ndarray) and hasattr(features, "detach"):  # a torch tensor
            features = features.detach().cpu().numpy()
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise ValueError(f"features must be (N, {len(self.features)}), got {x.shape}")
        z = self.intercept + ((x - np.asarray(self.mean)) / np.asarray(self.scale)) @ np.asarray(self.coef)
        # never certain: a question far outside what the head was fit on (a user whose only visits are new
        # places, a head fit on a small validation split) is answered at most 1 - 1e-3 either way
        return 1.0 / (1.0 + np.exp(-np.clip(z, -MAX_LOGIT, MAX_LOGIT)))

    def to_dict(self) -> dict:
        """Plain JSON-able numbers."""
        return {
            "features": list(self.features),
            "mean": list(self.mean),
            "scale": list(self.scale),
            "coef": list(self.coef),
            "intercept": self.intercept,
            "n_fit": self.n_fit,
            "rate_fit": self.rate_fit,
        }

    @classmethod
    def from_dict(cls, data: dict) -> NewPlaceHead:
        """The inverse of :meth:`to_dict`; refuses a head built for other features."""
        features = tuple(data["features"])
        if features not in FEATURE_SETS:
            expected = " or ".join(str(list(names)) for names in FEATURE_SETS)
            raise ValueError(f"new-place head built for features {list(features)}, expected {expected}")
        return cls(
            features=features,
            mean=_floats(data["mean"], len(features)),
            scale=_floats(data["scale"], len(features)),
            coef=_floats(data["coef"], len(features)),
            intercept=float(data["intercept"]),
            n_fit=int(data.get("n_fit", 0)),
            rate_fit=float(data.get("rate_fit", float("nan"))),
        )


def with_new_place(logp: np.ndarray, p_new: np.ndarray) -> np.ndarray:
    """One distribution over the known places and "a new place" from a place model's answer and P(new place).

    Args:
        logp: ``(N, V)`` log-probabilities (or scores) over the vocabulary; only the places (``>= 2``) are read.
        p_new: ``(N,)`` P(new place), from the new-place head.

    Returns:
        ``(N, V)`` float32 log-probabilities: class 1 holds ``log P(new)``, every place ``log(1 - P(new))``
        plus its log-probability among the places, class 0 (padding) ``-40``.

    Examples:
        >>> out = with_new_place(np.log(np.array([[1e-9, 1e-9, 0.75, 0.25]])), np.array([0.2]))
        >>> np.exp(out).round(3).tolist()
        [[0.0, 0.2, 0.6, 0.2]]
    """
    scores = np.asarray(logp, dtype=np.float64)
    places = scores[:, FIRST_PLACE:]
    top = places.max(axis=1, keepdims=True) if places.shape[1] else np.zeros((len(scores), 1))
    norm = top + np.log(np.exp(places - top).sum(axis=1, keepdims=True))
    p = np.clip(np.asarray(p_new, dtype=np.float64), 1e-12, 1 - 1e-12)[:, None]
    out = np.empty_like(scores)
    out[:, FIRST_PLACE:] = places - norm + np.log1p(-p)
    out[:, UNSEEN : UNSEEN + 1] = np.log(p)
    out[:, PAD] = -40.0
    return out.astype(np.float32)


def _floats(values: Sequence[float], n: int) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if len(out) != n:
        raise ValueError(f"expected {n} values, got {len(out)}")
    return out
