"""Samples on the training device: one padded tensor per feature, batches by index gather.

The reference loads a pickled list of dicts, builds tensors per sample in ``__getitem__`` and pads every
batch in a Python ``collate_fn``. Here each split's parquet file is read once into right-padded
``(N, L_max)`` tensors that live on the device; a batch is ``tensor[idx, :batch_max_len]``.
Batches can be bucketed by history length (``bucket=True``) so that little compute goes into padding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from nextloc.lists import pad_lists

# Reference feature transforms (both reference repos): 15-minute slots, 30-minute duration bins.
TIME_SLOT_MIN = 15
DURATION_BIN_MIN = 30
SCORE_PIECE_CPU = 64  # samples per length-sorted piece when scoring on a CPU (see by_length)
SEQUENCE_FIELDS = ("loc", "time", "weekday", "duration", "diff")
ID_COLUMNS = ("hist_len", "user", "user_id", "target_loc")  # what a SampleTensors reads when it is made


@dataclass
class Batch:
    """A batch, batch-first and right-padded with 0 (0 also means Monday / 00:00, as in the reference).

    Shapes: ``loc``, ``time``, ``weekday``, ``duration``, ``diff``: ``(B, T)``; ``user``, ``lengths``,
    ``target``, ``index``: ``(B,)``.
    """

    loc: torch.Tensor  # location ids (0 pad, 1 unseen, 2.. known)
    time: torch.Tensor  # start_min // 15, 0..95
    weekday: torch.Tensor  # 0..6
    duration: torch.Tensor  # capped minutes // 30, 0..95
    diff: torch.Tensor  # target day - history day, 0..7
    user: torch.Tensor  # encoded user 1..U
    lengths: torch.Tensor  # history length >= 1
    target: torch.Tensor  # next location id
    index: torch.Tensor  # row of the sample in its split (for per-user results)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """Move every tensor (``non_blocking`` overlaps the copy with compute when memory is pinned)."""
        return Batch(
            **{f.name: getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)}
        )

    @property
    def padding_mask(self) -> torch.Tensor:
        """``(B, T)`` True where padded."""
        return self.loc == 0

    def take(self, rows: torch.Tensor) -> Batch:
        """The samples at ``rows`` (positions in this batch, a 1-D long tensor on its device), trimmed to their
        own longest history."""
        lengths = self.lengths[rows]
        width = int(lengths.max()) if len(rows) else 1
        seq = {k: getattr(self, k)[rows, :width] for k in SEQUENCE_FIELDS}
        return Batch(
            **seq, user=self.user[rows], lengths=lengths, target=self.target[rows], index=self.index[rows]
        )


def by_length(fn: Callable[[Batch], torch.Tensor], batch: Batch, piece: int | None = None) -> torch.Tensor:
    """``fn``'s per-sample rows for ``batch``, computed on length-sorted pieces of it, in ``batch``'s order.

    For scoring, where each row depends on its own sample only, so that only the padding changes: each
    piece is trimmed to its own longest history. Validation and test batches come in split order, and on
    GeoLife half of their tokens are padding; attention's cost grows with the square of the padded width.
    On a CPU, pieces of 64 samples (``piece`` default, :data:`SCORE_PIECE_CPU`) score GeoLife's validation
    split 2.5-2.8x faster (pointer_plus 0.73 -> 0.27 s, mhsa 0.73 -> 0.24 s on one thread). Rows equal
    ``fn(batch)``'s to within float rounding: a padded matmul sums in another order (up to 1e-5 on the
    pointer's log-probabilities, 6e-7 on mhsa's logits; the LSTM's are bit-equal). Elsewhere (a GPU is paid
    per kernel, not per padded token) the default is the whole batch, i.e. ``fn(batch)``.
    """
    n = len(batch.index)
    size = piece or (SCORE_PIECE_CPU if batch.loc.device.type == "cpu" else n)
    if size >= n:
        return fn(batch)
    order = torch.argsort(batch.lengths, stable=True)
    pieces = torch.split(order, size)
    rows = [fn(batch.take(p)) for p in pieces]
    out = rows[0].new_empty((n, *rows[0].shape[1:]))
    for p, r in zip(pieces, rows, strict=True):
        out[p] = r
    return out


class SampleTensors:
    """One split's samples as padded tensors plus the per-sample metadata used by the metrics.

    Args:
        table: a samples table written by preprocessing (``loc_hist`` ... ``target_loc``).
        device: where the tensors live (the whole GeoLife split is a few MB).
    """

    def __init__(self, table: pa.Table, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.table = table
        lengths = table.column("hist_len").to_numpy().astype(np.int64)
        self.n = len(lengths)
        self.max_len = int(lengths.max()) if self.n else 1
        self.lengths_np = lengths
        self.user_np = table.column("user").to_numpy().astype(np.int64)
        self.user_id_np = table.column("user_id").to_numpy().astype(np.int64)
        self.target_np = table.column("target_loc").to_numpy().astype(np.int64)

    @cached_property
    def history_np(self) -> np.ndarray:
        """``(N, T)`` each sample's history of places, right-padded with 0."""
        return pad_lists(self.table.column("loc_hist"), self.lengths_np, self.max_len)

    @cached_property
    def _all(self) -> Batch:
        """The whole split as one batch (a batch is a gather from it, :meth:`Batch.take`), padded when first
        read: a routine kind reads a training split's ids and targets only, and its padded histories would
        be most of its memory on a large dataset."""
        column, lengths, width = self.table.column, self.lengths_np, self.max_len
        tensors = {
            "loc": self.history_np,
            "time": pad_lists(column("start_min_hist"), lengths, width) // TIME_SLOT_MIN,
            "weekday": pad_lists(column("weekday_hist"), lengths, width),
            "duration": pad_lists(column("duration_hist"), lengths, width) // DURATION_BIN_MIN,
            "diff": pad_lists(column("diff_hist"), lengths, width),
        }
        pin = self.device.type == "cuda"
        return Batch(
            **{k: _to(v, self.device, pin) for k, v in tensors.items()},
            user=_to(self.user_np, self.device, pin),
            lengths=_to(lengths, self.device, pin),
            target=_to(self.target_np, self.device, pin),
            index=_to(np.arange(self.n, dtype=np.int64), self.device, pin),
        )

    @classmethod
    def from_parquet(
        cls, path: Path, device: torch.device | str = "cpu", columns: Sequence[str] | None = None
    ) -> SampleTensors:
        """Read a ``samples/<split>.parquet`` file (``columns``: only these, with :data:`ID_COLUMNS`)."""
        wanted = None if columns is None else list(dict.fromkeys([*ID_COLUMNS, *columns]))
        return cls(pq.read_table(path, columns=wanted), device)

    def __len__(self) -> int:
        return self.n

    def concat(self, other: SampleTensors) -> SampleTensors:
        """Both splits' samples in one set (e.g. train + val for a final refit), on this device."""
        return SampleTensors(pa.concat_tables([self.table, other.table]), self.device)

    def batch(self, index: torch.Tensor) -> Batch:
        """Gather the samples at ``index`` (a 1-D long tensor on this device), trimmed to their max length."""
        return self._all.take(index)

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
        drop_last: bool = False,
        bucket: bool = False,
        bucket_pool: int = 50,
    ):
        """Yield batches; ``bucket`` groups similar lengths.

        The shuffled samples are cut into pools of ``bucket_pool`` batches, each pool is sorted by history
        length and cut into batches, and the batches of all pools are shuffled. A small pool keeps each
        batch a near-random draw and still trims most of the padding (GeoLife train, batch 32: padded
        tokens 2.40x the real ones for plain batches, 1.34x with pools of 4 batches, 1.03x with 50).
        """
        if bucket_pool < 1:
            raise ValueError(f"bucket_pool must be >= 1 batch, got {bucket_pool}")
        order = torch.randperm(self.n, generator=generator) if shuffle else torch.arange(self.n)
        if bucket and shuffle:
            lengths = torch.from_numpy(self.lengths_np)
            chunk = batch_size * bucket_pool
            parts = []
            for start in range(0, self.n, chunk):
                part = order[start : start + chunk]
                parts.append(part[torch.argsort(lengths[part], stable=True)])
            order = torch.cat(parts)
            groups = list(torch.split(order, batch_size))
            if drop_last and groups and len(groups[-1]) < batch_size:
                groups = groups[:-1]
            perm = torch.randperm(len(groups), generator=generator)
            groups = [groups[i] for i in perm]
        else:
            groups = list(torch.split(order, batch_size))
            if drop_last and groups and len(groups[-1]) < batch_size:
                groups = groups[:-1]
        for idx in groups:
            yield self.batch(idx.to(self.device))

    def target_in_history(self) -> np.ndarray:
        """Per sample: does the target location occur in its history (the ceiling for copy models)."""
        return (self.history_np == self.target_np[:, None]).any(axis=1)


def _to(array: np.ndarray, device: torch.device, pin: bool) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if pin:
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=pin)
