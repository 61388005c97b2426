"""A single-tensor interface to the models, for model registries and ``nextloc predict``.

Registries (MLflow's signature, pyfunc ``predict``) want one array in and one array out. A history is
packed into an int64 array ``(B, T, 6)`` with the columns :data:`PACKED_FEATURES`, right-padded with 0;
the output is ``(B, total_loc_num)`` probabilities.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from nextloc.data import DURATION_BIN_MIN, TIME_SLOT_MIN, Batch

PACKED_FEATURES = ("location", "start_min", "weekday", "duration_min", "diff_days", "user")


class PackedScorer(nn.Module):
    """Wraps a model: ``(B, T, 6)`` int64 packed histories -> ``(B, V)`` probabilities."""

    def __init__(self, model: nn.Module, log_prob_output: bool, duration_cap_min: int = 2879) -> None:
        super().__init__()
        self.model = model
        self.log_prob_output = log_prob_output
        self.duration_cap_min = duration_cap_min

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        packed = packed.long()
        loc = packed[..., 0]
        lengths = (loc != 0).sum(dim=1).clamp(min=1)
        batch = Batch(
            loc=loc,
            time=packed[..., 1] // TIME_SLOT_MIN,
            weekday=packed[..., 2],
            duration=packed[..., 3].clamp(max=self.duration_cap_min) // DURATION_BIN_MIN,
            diff=packed[..., 4],
            user=packed[:, 0, 5],
            lengths=lengths,
            target=torch.zeros_like(lengths),
            index=torch.arange(len(lengths), device=packed.device),
        )
        out = self.model(batch).float()
        return out.exp() if self.log_prob_output else out.softmax(dim=-1)


def pack_histories(histories: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Pack histories given as dicts of equal-length lists into a ``(B, T, 6)`` int64 array.

    Each history has the keys ``location``, ``start_min``, ``weekday``, ``duration_min``, ``diff_days``
    (lists, oldest first) and ``user`` (an int, the encoded user).

    Raises:
        ValueError: naming the history and the field that is missing or of the wrong length.

    Examples:
        >>> pack_histories([{"location": [5, 7], "start_min": [480, 1020], "weekday": [0, 0],
        ...                  "duration_min": [540, 60], "diff_days": [0, 0], "user": 3}]).shape
        (1, 2, 6)
    """
    if not histories:
        raise ValueError("no history given")
    width = 0
    for i, hist in enumerate(histories):
        for key in PACKED_FEATURES:
            if key not in hist:
                raise ValueError(f"history {i}: missing field {key!r}")
        n = len(hist["location"])
        if n == 0:
            raise ValueError(f"history {i}: 'location' is empty")
        for key in PACKED_FEATURES[1:5]:
            if len(hist[key]) != n:
                raise ValueError(
                    f"history {i}: field {key!r} has {len(hist[key])} values, 'location' has {n}"
                )
        width = max(width, n)
    out = np.zeros((len(histories), width, len(PACKED_FEATURES)), dtype=np.int64)
    for i, hist in enumerate(histories):
        n = len(hist["location"])
        for j, key in enumerate(PACKED_FEATURES[:5]):
            out[i, :n, j] = np.asarray(hist[key], dtype=np.int64)
        out[i, :, 5] = int(hist["user"])
    return out


def top_k(probabilities: np.ndarray, k: int = 5) -> list[list[tuple[int, float]]]:
    """The ``k`` most likely locations per row as ``(location_id, probability)``, ties by lower id."""
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return [[(int(c), float(probabilities[r, c])) for c in row] for r, row in enumerate(order)]
