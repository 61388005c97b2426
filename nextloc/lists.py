"""A list column of a samples table as a right-padded array (numpy and pyarrow only: nextloc.models.batch, which
imports torch, and nextloc.predict.histories, which answers without it, both use it)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def pad_lists(column: pa.ChunkedArray, lengths: np.ndarray, width: int) -> np.ndarray:
    """Right-pad a list column into an ``(N, width)`` int64 array (0 = padding)."""
    values = column.combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    out = np.zeros((len(lengths), width), dtype=np.int64)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.arange(len(values)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[rows, cols] = values
    return out
