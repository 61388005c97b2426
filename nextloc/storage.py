"""Atomic, deterministic writes: a reader never sees a half-written file.

Every writer goes to a temporary file in the destination folder and then ``os.replace``s it into place,
so a crash leaves either the old file or the new one. Parquet output is deterministic: the same table
gives the same bytes (fixed compression, no timestamps in the metadata).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from nextloc.fingerprint import hash_file

# zstd level 1 without dictionaries on numeric columns: on GeoLife's positionfixes (float coordinates,
# timestamps) dictionary encoding is tried and abandoned per page, and level 3 buys ~20% size for 2-3x the
# time. Measured on 4.3M fixes: write 1.48 s -> 0.58 s, read 1.57 s -> 0.36 s, 69 -> 84 MB
# (benchmarks/profiles/README.md). Text columns keep their dictionaries.
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "compression_level": 1}


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns worth a dictionary: text (few distinct values, long)."""
    return [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]


@contextmanager
def atomic_path(path: Path):
    """Yield a temporary path next to ``path``; on success it replaces ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_parquet(data: pa.Table | pd.DataFrame, path: Path) -> str:
    """Write a table atomically; returns the content fingerprint of the written file."""
    table = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
    # pandas metadata carries no timestamps, but drop it so the bytes depend on the data alone
    table = table.replace_schema_metadata(None)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, use_dictionary=_dictionary_columns(table.schema), **PARQUET_OPTIONS)
    return hash_file(path)


def write_json(data: Any, path: Path) -> str:
    """Write strict JSON (sorted keys, indented) atomically; returns the file's fingerprint.

    A number that is not finite (an undefined metric: an AUC with one class only) is written as ``null``:
    Python would write a bare ``NaN``, which strict readers (browsers, ``jq``, most languages) reject.
    """
    text = json.dumps(_finite(data), indent=2, sort_keys=True, default=str, allow_nan=False)
    return write_text(text + "\n", path)


def _finite(value: Any) -> Any:
    """``value`` with every float inside dicts, lists and tuples a Python float, or None where not finite."""
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_text(text: str, path: Path) -> str:
    """Write text atomically; returns the file's fingerprint."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return hash_file(path)


def write_with(writer: Callable[[Path], None], path: Path) -> str:
    """Run ``writer(tmp_path)`` and move the result into place atomically."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return hash_file(path)


def read_parquet(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    """Read a parquet file into pandas (tz-aware timestamps stay tz-aware)."""
    return pq.read_table(path, columns=columns).to_pandas()


def remove_stale_temp_files(root: Path) -> list[Path]:
    """Delete the temporary files (``.<name>.*.tmp``) that writers killed mid-write left under ``root``.

    Only call this while no writer can be active (``tasks.locking.data_dir_lock`` held); the final files
    they were meant to replace are untouched, so nothing is lost.
    """
    removed = []
    for tmp in Path(root).rglob(".*.tmp"):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed
