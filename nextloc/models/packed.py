"""The packed history format, its one home: a history as an int64 array ``(B, T, 6)``, right-padded with 0.

Registries want one array in and one array out. The columns are :data:`PACKED_FEATURES`: the location id,
the visit's start (minutes after midnight), its weekday, its duration in minutes, days before the target
day, and the encoded user (the same in every row of a history). Built from dicts of lists
(:func:`pack_histories`), from per-column arrays (:func:`pack_columns`: the answers' histories) or from a
:class:`~nextloc.models.batch.Batch` (:func:`pack_batch`); read back into a Batch by :func:`packed_batch`,
binning times and durations as training does. This module imports torch only inside the two functions
that take or give tensors, so a routine kind's answer never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nextloc.config import SampleConfig

if TYPE_CHECKING:
    import torch

    from nextloc.models.batch import Batch

PACKED_FEATURES = ("location", "start_min", "weekday", "duration_min", "diff_days", "user")


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


def pack_columns(columns: Mapping[str, np.ndarray], user: np.ndarray) -> np.ndarray:
    """``(H, T, 6)`` from the five sequence columns of :data:`PACKED_FEATURES` (each ``(H, T)``, right-padded
    with 0) and each history's encoded ``user`` ``(H,)``."""
    location = np.asarray(columns["location"])
    packed = np.zeros((*location.shape, len(PACKED_FEATURES)), dtype=np.int64)
    for j, key in enumerate(PACKED_FEATURES[:5]):
        packed[:, :, j] = columns[key]
    packed[:, :, 5] = np.asarray(user, dtype=np.int64)[:, None]
    return packed


def pack_batch(batch: Batch) -> torch.Tensor:
    """A :class:`~nextloc.models.batch.Batch` back into the packed ``(B, T, 6)`` form (the inverse of
    :func:`packed_batch`, durations as the batch's bins)."""
    import torch

    from nextloc.models.batch import DURATION_BIN_MIN, TIME_SLOT_MIN

    user = batch.user[:, None].expand_as(batch.loc)
    columns = [batch.loc, batch.time * TIME_SLOT_MIN, batch.weekday, batch.duration * DURATION_BIN_MIN]
    return torch.stack([*columns, batch.diff, user], dim=-1)


def packed_batch(packed: torch.Tensor, duration_cap_min: int = SampleConfig().duration_cap_min) -> Batch:
    """The :class:`~nextloc.models.batch.Batch` view of packed histories ``(B, T, 6)`` (the inverse of
    :func:`pack_batch`); durations are capped at ``duration_cap_min`` first."""
    import torch

    from nextloc.models.batch import DURATION_BIN_MIN, TIME_SLOT_MIN, Batch

    packed = packed.long()
    loc = packed[..., 0]
    lengths = (loc != 0).sum(dim=1).clamp(min=1)
    return Batch(
        loc=loc,
        time=packed[..., 1] // TIME_SLOT_MIN,
        weekday=packed[..., 2],
        duration=packed[..., 3].clamp(max=duration_cap_min) // DURATION_BIN_MIN,
        diff=packed[..., 4],
        user=packed[:, 0, 5],
        lengths=lengths,
        target=torch.zeros_like(lengths),
        index=torch.arange(len(lengths), device=packed.device),
    )
