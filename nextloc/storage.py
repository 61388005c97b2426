"""Atomic, deterministic writes: a reader never sees a half-written file.

Every writer goes through :func:`nextloc.atomic.atomic_path` (a temporary file in the destination folder,
then ``os.replace``), so a crash leaves either the old file or the new one. ``atomic_path`` and
``remove_stale_temp_files`` live in :mod:`nextloc.atomic` (standard library only, for the modules that
run before the environment is installed) and are re-exported here. Parquet output is deterministic: the
same table gives the same bytes (fixed compression, no timestamps in the metadata).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from nextloc.atomic import atomic_path, remove_stale_temp_files, write_text_atomic
from nextloc.fingerprint import hash_bytes, hash_file
from nextloc.io.geoparquet import geometry_columns, with_point_geometry

__all__ = [
    "PARQUET_OPTIONS",
    "atomic_path",
    "read_parquet",
    "remove_stale_temp_files",
    "write_geoparquet",
    "write_json",
    "write_parquet",
    "write_parquet_parts",
    "write_with",
]

# zstd level 1 without dictionaries on numeric columns: on GeoLife's positionfixes (float coordinates,
# timestamps) dictionary encoding is tried and abandoned per page, and level 3 buys ~20% size for 2-3x the
# time. Measured on 4.3M fixes: write 1.48 s -> 0.58 s, read 1.57 s -> 0.36 s, 69 -> 84 MB.
# Text columns keep their dictionaries.
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "compression_level": 1}


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns worth a dictionary: text (few distinct values, long)."""
    return [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]


def _as_table(data: pa.Table | pd.DataFrame) -> pa.Table:
    table = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
    # pandas metadata carries no timestamps, but drop it so the bytes depend on the data alone
    return table.replace_schema_metadata(None)


def write_parquet(data: pa.Table | pd.DataFrame, path: Path) -> str:
    """Write a table atomically; returns the content fingerprint of the written file."""
    return _write_table(_as_table(data), path)


def write_parquet_parts(parts: Iterable[pd.DataFrame], schema: pa.Schema, path: Path) -> str:
    """Write a table given part by part (one row group each, one part held at a time) atomically, each
    part cast to ``schema``; returns the content fingerprint of the written file."""

    def write(tmp: Path) -> None:
        options = {"use_dictionary": _dictionary_columns(schema), **PARQUET_OPTIONS}
        with pq.ParquetWriter(tmp, schema, **options) as writer:
            for part in parts:
                writer.write_table(pa.Table.from_pandas(part, schema=schema, preserve_index=False))

    return write_with(write, path)


def write_geoparquet(data: pa.Table | pd.DataFrame, path: Path) -> str:
    """Write a table with ``latitude`` / ``longitude`` columns as GeoParquet (a WKB point ``geometry``
    column and the ``geo`` metadata: :mod:`nextloc.io.geoparquet`) atomically; returns the fingerprint."""
    return _write_table(with_point_geometry(_as_table(data)), path)


def _write_table(table: pa.Table, path: Path) -> str:
    """Write ``table`` atomically; the fingerprint is taken from the bytes written, not read back from disk.

    The file is encoded in memory first (the parquet writer gives the same bytes to any sink), hashed there
    and written in one call: no second read of each output to fingerprint it.
    """
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, use_dictionary=_dictionary_columns(table.schema), **PARQUET_OPTIONS)
    data = sink.getvalue()
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
    return hash_bytes(data)


def write_json(data: Any, path: Path) -> str:
    """Write strict JSON (sorted keys, indented) atomically; returns the file's fingerprint.

    A number that is not finite (an undefined metric: an AUC with one class only) is written as ``null``:
    Python would write a bare ``NaN``, which strict readers (browsers, ``jq``, most languages) reject.
    """
    text = json.dumps(_finite(data), indent=2, sort_keys=True, default=str, allow_nan=False) + "\n"
    write_text_atomic(path, text)
    return hash_bytes(text.encode("utf-8"))


def _finite(value: Any) -> Any:
    """``value`` with every float inside dicts, lists and tuples a Python float, or None where not finite."""
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_with(writer: Callable[[Path], None], path: Path) -> str:
    """Run ``writer(tmp_path)`` and move the result into place atomically."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return hash_file(path)


def read_parquet(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    """Read a parquet file into pandas (tz-aware timestamps stay tz-aware).

    Without ``columns``, a GeoParquet file's geometry column is left out: the library works on the
    ``latitude`` / ``longitude`` columns, and WKB as Python bytes costs time for nothing.
    """
    if columns is None:
        schema = pq.read_schema(path)
        skip = set(geometry_columns(schema))
        columns = [name for name in schema.names if name not in skip] if skip else None
    return pq.read_table(path, columns=columns).to_pandas()
