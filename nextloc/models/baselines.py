"""Non-neural baselines: a first-order Markov chain, most-frequent-in-history and last location.

Each baseline is built with the vocabulary size ``V`` (``total_loc_num``), fitted with ``fit(train)`` and
scores a :class:`~nextloc.models.batch.Batch` with ``scores(batch) -> (B, V)`` float32 on the batch's device, so it is
evaluated with :func:`nextloc.evaluation.tensor_metrics.evaluate_scores` like any model::

    markov = MarkovBaseline(total_loc_num).fit(train)
    metrics, _ = evaluate_scores(markov.scores, test)

Scores rank the candidate classes above a constant fill; ties are broken by :mod:`nextloc.evaluation.metrics`'
convention (lowest class index first).
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from nextloc.models.batch import Batch, SampleTensors

# V2 markov1st.py: logits = log(p + 1e-10) for candidates, -1e9 elsewhere.
MARKOV_EPS = 1e-10
MARKOV_FILL = -1e9


class MarkovBaseline:
    """First-order Markov chain over locations: V2 "Markov1st" (``src/models/baseline/markov1st.py``).

    **Fit.** Every train sample contributes the consecutive pairs of ``X + [Y]`` (history then target) to three
    count tables: per user ``(user, from, to)``, over all users ``(from, to)``, and a global frequency of the
    destination ``to`` of every pair. Overlapping 7-day windows repeat the same visits in many samples and so
    inflate the counts; that is the reference behaviour and is kept.

    **Predict** from the last history location ``X[-1]`` and the sample's encoded user, with this fallback chain
    (the V2 ``predict_as_logits``, in that order; each level is used only when the previous one has no count):

    1. the user's own transitions from ``X[-1]`` (counted from that user's train samples only);
    2. the user's transitions from *any* location, summed (the user's destination distribution);
    3. all users' transitions from ``X[-1]``;
    4. the global destination frequency.

    Step 2 applies to every user with train samples, so steps 3-4 are reached only for users absent from the
    train split (never in GeoLife, where every user has train samples). The protocol summary lists the same
    chain ("user → (all user transitions) → global from loc → global frequency"); a shorter reading,
    user-from-loc → all-users-from-loc → global frequency, is available with ``user_marginal_fallback=False``.
    "No match" means a zero count total at that level (equivalently: the reference's dictionary has no entry).

    Scores are ``log(count / total + 1e-10)`` over the chosen level's candidates and ``-1e9`` elsewhere.

    Reference result on the full GeoLife test split (N = 3,502, V2 ``experiments/geolife_markov1st_20251226_170200``):
    Acc@1 27.64, Acc@5 49.49, Acc@10 53.14, MRR 36.80, NDCG@10 39.68, F1 22.26. These scores reproduce all six
    numbers exactly when ranked the reference's way (Acc@k from ``torch.topk``, MRR/NDCG from a separate
    ``torch.argsort(descending=True)``, both with arbitrary tie order). Under :mod:`nextloc.evaluation.metrics`' stable
    convention (lowest index first among ties) the same scores give 27.64 / 49.46 / 53.37 / 38.32 / 41.27 /
    22.26: the differences are all ties, mostly among the ``-1e9`` fill of the 43.6% of test targets that are
    not candidates (a low-index target then ranks right after the candidates).

    Args:
        num_locations: vocabulary size ``V`` (``total_loc_num``); every location id must be ``< V``.
        user_marginal_fallback: use step 2 (the reference). ``False`` goes from step 1 straight to step 3.

    Examples:
        >>> markov = MarkovBaseline(1187).fit(train)  # doctest: +SKIP
        >>> scores = markov.scores(batch)  # (B, 1187)  # doctest: +SKIP
    """

    def __init__(self, num_locations: int, *, user_marginal_fallback: bool = True) -> None:
        self.num_locations = int(num_locations)
        self.user_marginal_fallback = user_marginal_fallback
        self.num_users = 0
        self.user_from: sp.csr_matrix | None = None  # (num_users * V, V): row user * V + from
        self.user_any: np.ndarray | None = None  # (num_users, V): the user's destination counts
        self.global_from: sp.csr_matrix | None = None  # (V, V)
        self.global_freq: np.ndarray | None = None  # (V,)

    def fit(self, train: SampleTensors) -> MarkovBaseline:
        """Count the transitions of every train sample's ``history + [target]``.

        Args:
            train: the train split.

        Returns:
            ``self``.

        Raises:
            ValueError: if a location id is ``>= num_locations``.
        """
        v = self.num_locations
        src, dst, users = transition_pairs(train)
        if len(dst) and max(src.max(), dst.max()) >= v:
            raise ValueError(f"location id {max(src.max(), dst.max())} >= num_locations {v}")
        self.num_users = int(users.max()) + 1 if len(users) else 0
        ones = np.ones(len(dst), dtype=np.float64)
        user_from = sp.coo_matrix((ones, (users * v + src, dst)), shape=(self.num_users * v, v)).tocsr()
        user_from.sum_duplicates()
        self.user_from = user_from
        self.user_any = np.zeros((self.num_users, v))
        np.add.at(self.user_any, (users, dst), 1.0)
        self.global_from = sp.coo_matrix((ones, (src, dst)), shape=(v, v)).tocsr()
        self.global_from.sum_duplicates()
        self.global_freq = np.bincount(dst, minlength=v).astype(np.float64)
        return self

    def counts(self, last: np.ndarray, user: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Transition counts of the fallback level chosen for each sample.

        Args:
            last: ``(B,)`` last history location of each sample.
            user: ``(B,)`` encoded user of each sample.

        Returns:
            ``(counts, level)``: ``(B, V)`` float64 counts and ``(B,)`` the level used (1-4, as in the class doc).
        """
        if self.user_from is None:
            raise RuntimeError("call fit() first")
        v = self.num_locations
        last = np.asarray(last, dtype=np.int64)
        user = np.asarray(user, dtype=np.int64)
        b = len(last)
        known_loc = (last >= 0) & (last < v)
        known_user = (user >= 0) & (user < self.num_users)
        safe_user = np.where(known_user, user, 0)
        safe_last = np.where(known_loc, last, 0)
        out = np.zeros((b, v))
        level = np.zeros(b, dtype=np.int64)
        if self.num_users:
            has_user = known_user & (self.user_any[safe_user].sum(axis=1) > 0)
        else:
            has_user = np.zeros(b, dtype=bool)

        rows = np.flatnonzero(has_user & known_loc)
        if len(rows):
            out[rows] = self.user_from[safe_user[rows] * v + safe_last[rows]].toarray()
        level[out.sum(axis=1) > 0] = 1
        if self.user_marginal_fallback:
            rows = np.flatnonzero(has_user & (level == 0))
            out[rows] = self.user_any[safe_user[rows]]
            level[rows] = 2
        rows = np.flatnonzero((level == 0) & known_loc)
        if len(rows):
            out[rows] = self.global_from[safe_last[rows]].toarray()
            level[rows[out[rows].sum(axis=1) > 0]] = 3
        rows = np.flatnonzero(level == 0)
        out[rows] = self.global_freq
        level[rows] = 4
        return out, level

    def scores(self, batch: Batch) -> torch.Tensor:
        """``(B, V)`` float32 scores: ``log(p + 1e-10)`` for candidates, ``-1e9`` elsewhere.

        Args:
            batch: a batch (``loc``, ``lengths``, ``user`` are used).

        Returns:
            Scores on the batch's device.
        """
        last = last_locations(batch).cpu().numpy()
        counts, _ = self.counts(last, batch.user.cpu().numpy())
        total = counts.sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            logp = np.log(counts / np.where(total > 0, total, 1.0) + MARKOV_EPS)
        scores = np.where(counts > 0, logp, MARKOV_FILL).astype(np.float32)
        return torch.from_numpy(scores).to(batch.loc.device)

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The fitted chain as plain parameters and named arrays (the sparse tables as their CSR arrays).

        Stored as JSON and safetensors beside each other, nothing pickled; :meth:`from_state` reads them back.
        """
        if self.user_from is None:
            raise RuntimeError("call fit() first")
        params = {
            "num_locations": self.num_locations,
            "user_marginal_fallback": self.user_marginal_fallback,
            "num_users": self.num_users,
        }
        arrays = {"user_any": self.user_any, "global_freq": self.global_freq}
        for name in ("user_from", "global_from"):
            matrix: sp.csr_matrix = getattr(self, name)
            arrays[f"{name}.data"] = matrix.data
            arrays[f"{name}.indices"] = matrix.indices.astype(np.int64)
            arrays[f"{name}.indptr"] = matrix.indptr.astype(np.int64)
        return params, {k: np.ascontiguousarray(v) for k, v in arrays.items()}

    @classmethod
    def from_state(cls, params: dict[str, Any], arrays: dict[str, np.ndarray]) -> MarkovBaseline:
        """The inverse of :meth:`state`."""
        markov = cls(
            int(params["num_locations"]), user_marginal_fallback=bool(params["user_marginal_fallback"])
        )
        v = markov.num_locations
        markov.num_users = int(params["num_users"])
        markov.user_any = np.asarray(arrays["user_any"], dtype=np.float64).reshape(markov.num_users, v)
        markov.global_freq = np.asarray(arrays["global_freq"], dtype=np.float64)
        for name, rows in (("user_from", markov.num_users * v), ("global_from", v)):
            parts = (arrays[f"{name}.data"], arrays[f"{name}.indices"], arrays[f"{name}.indptr"])
            setattr(markov, name, sp.csr_matrix(parts, shape=(rows, v)))
        return markov


class _HistoryBaseline:
    """Scaffold shared by the history-only baselines: nothing is learned, scores come from :func:`history_stats`.

    Subclasses implement :meth:`_scores_from_stats`, which turns the per-class history statistics into scores.

    Args:
        num_locations: vocabulary size ``V``.
    """

    def __init__(self, num_locations: int) -> None:
        self.num_locations = int(num_locations)

    def fit(self, train: SampleTensors) -> Self:
        """No-op (the baseline only reads each sample's own history).

        Args:
            train: ignored.

        Returns:
            ``self``.
        """
        return self

    def scores(self, batch: Batch) -> torch.Tensor:
        """``(B, V)`` float32 scores on the batch's device.

        Args:
            batch: a batch (``loc``, ``lengths`` are used).

        Returns:
            Scores from :meth:`_scores_from_stats` (see the class doc for the ranking).
        """
        return self._scores_from_stats(*history_stats(batch, self.num_locations))

    def _scores_from_stats(
        self, counts: torch.Tensor, recency: torch.Tensor, earliness: torch.Tensor
    ) -> torch.Tensor:
        """``(B, V)`` scores from :func:`history_stats`' ``(counts, recency, earliness)``."""
        raise NotImplementedError

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Plain parameters (nothing is learned: no arrays); :meth:`from_state` reads them back."""
        return {"num_locations": self.num_locations}, {}

    @classmethod
    def from_state(cls, params: dict[str, Any], arrays: dict[str, np.ndarray]) -> Self:
        """The inverse of :meth:`state`."""
        return cls(**params)


class MostFrequentBaseline(_HistoryBaseline):
    """Predicts the location visited most often in the sample's own history.

    Scores: ``count + tie_break`` for each location in the history, ``0`` for every other class, where
    ``tie_break`` lies in ``(0, 1)`` so the count decides and ties are ordered by:

    - ``"first_seen"`` (default): the location that first appears earliest in the history ranks higher. The
      candidate order is then exactly ``collections.Counter(history).most_common()``, which is what the
      reference analysis script uses: it reproduces the protocol's test Acc@1 of **44.20%** exactly.
    - ``"recent"``: the most recently visited location ranks higher (42.00% Acc@1 on the same test split).

    Class 1 (unseen) in a history is a candidate like any other. Nothing is learned; :meth:`fit` is a no-op.

    Args:
        num_locations: vocabulary size ``V``.
        tie_break: ``"first_seen"`` or ``"recent"``.

    Raises:
        ValueError: on an unknown ``tie_break``.
    """

    TIE_BREAKS = ("first_seen", "recent")

    def __init__(self, num_locations: int, *, tie_break: str = "first_seen") -> None:
        if tie_break not in self.TIE_BREAKS:
            raise ValueError(f"tie_break {tie_break!r} is unknown; use one of {list(self.TIE_BREAKS)}")
        super().__init__(num_locations)
        self.tie_break = tie_break

    def _scores_from_stats(
        self, counts: torch.Tensor, recency: torch.Tensor, earliness: torch.Tensor
    ) -> torch.Tensor:
        """History locations ranked by count, then by ``tie_break``; 0 elsewhere."""
        tie = earliness if self.tie_break == "first_seen" else recency
        return torch.where(counts > 0, counts + tie, torch.zeros_like(counts))

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Plain parameters (``num_locations``, ``tie_break``); nothing is learned."""
        return {"num_locations": self.num_locations, "tie_break": self.tie_break}, {}


class LastLocationBaseline(_HistoryBaseline):
    """Predicts the last history location ``X[-1]`` ("persistent" model).

    Scores: ``(last position + 1) / (T + 1)`` for each location in the history, so ``X[-1]`` ranks first and
    the other history locations follow from the most to the least recently visited; ``0`` for every other
    class. Nothing is learned; :meth:`fit` is a no-op.

    Protocol reference on the GeoLife test split (V2 analysis scripts): last-location Acc@1 27.18% (reproduced
    exactly).

    Args:
        num_locations: vocabulary size ``V``.
    """

    def _scores_from_stats(
        self, counts: torch.Tensor, recency: torch.Tensor, earliness: torch.Tensor
    ) -> torch.Tensor:
        """History locations ranked by recency; 0 elsewhere."""
        return recency


class BaselineModule(nn.Module):
    """A fitted baseline as a module (``forward(batch) -> (B, V)`` scores), so it is registered, loaded and
    served like any model kind.

    Args:
        baseline: a fitted baseline (a kind of family ``baseline``, :mod:`nextloc.models.registry`).
    """

    def __init__(self, baseline) -> None:
        super().__init__()
        self.baseline = baseline

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.baseline.scores(batch)


def transition_pairs(data: SampleTensors) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Consecutive ``(from, to)`` pairs of every sample's ``history + [target]``, with the sample's user.

    Args:
        data: a split.

    Returns:
        ``(from, to, user)``: three int64 arrays of length ``sum(lengths)``, sample by sample.
    """
    n, width = data.history_np.shape
    sequence = np.zeros((n, width + 1), dtype=np.int64)  # (N, Lmax + 1)
    sequence[:, :width] = data.history_np
    sequence[np.arange(n), data.lengths_np] = data.target_np
    valid = np.arange(width)[None, :] < data.lengths_np[:, None]  # (N, Lmax): pair j = (seq[j], seq[j+1])
    src = sequence[:, :-1][valid]
    dst = sequence[:, 1:][valid]
    users = np.broadcast_to(data.user_np[:, None], valid.shape)[valid]
    return src, dst, users


def last_locations(batch: Batch) -> torch.Tensor:
    """``(B,)`` last history location ``X[-1]`` of each sample (right-padded ``loc``)."""
    return batch.loc.gather(1, (batch.lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)


def history_stats(batch: Batch, num_locations: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample and class: visit count, recency of the last visit and earliness of the first visit.

    Args:
        batch: a batch (``loc`` right-padded with 0, ``lengths``).
        num_locations: vocabulary size ``V``.

    Returns:
        ``(counts, recency, earliness)``: three ``(B, V)`` float32 tensors on the batch's device. For a class
        visited at positions ``p`` of a width-``T`` batch, ``recency = (max p + 1) / (T + 1)`` and
        ``earliness = (T - min p) / (T + 1)``, both in ``(0, 1)``; both are 0 for unvisited classes.
    """
    loc = batch.loc
    b, t = loc.shape
    positions = torch.arange(t, device=loc.device).expand(b, t)  # (B, T)
    valid = positions < batch.lengths.unsqueeze(1)
    loc = torch.where(valid, loc, torch.zeros_like(loc))  # padding goes to class 0 with weight 0
    counts = torch.zeros(b, num_locations, device=loc.device)
    counts.scatter_add_(1, loc, valid.float())
    zero = torch.zeros((), device=loc.device)
    recency = torch.zeros(b, num_locations, device=loc.device)
    recency.scatter_reduce_(1, loc, torch.where(valid, (positions + 1) / (t + 1), zero), reduce="amax")
    earliness = torch.zeros(b, num_locations, device=loc.device)
    earliness.scatter_reduce_(1, loc, torch.where(valid, (t - positions) / (t + 1), zero), reduce="amax")
    return counts, recency, earliness
