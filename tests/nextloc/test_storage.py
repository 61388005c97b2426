"""Atomic JSON writes: strict JSON even when a metric is undefined."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nextloc.storage import write_json


def _strict(text: str):
    def reject(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=reject)


def test_undefined_numbers_are_written_as_null_and_the_rest_is_kept(tmp_path):
    data = {
        "auc": float("nan"),
        "val": {"acc@1": 12.5, "brier": np.float64("inf"), "f1": np.float32("nan")},
        "history": [1.0, float("-inf"), (2, np.float32(0.5))],
        "n": 3,
        "ok": True,
        "path": tmp_path,
    }
    path = tmp_path / "results.json"
    write_json(data, path)
    got = _strict(path.read_text())
    assert got == {
        "auc": None,
        "val": {"acc@1": 12.5, "brier": None, "f1": None},
        "history": [1.0, None, [2, 0.5]],
        "n": 3,
        "ok": True,
        "path": str(tmp_path),
    }
    assert math.isnan(data["auc"])  # the caller's data is left as it was
    assert not list(tmp_path.glob("*.tmp"))


def test_the_same_data_gives_the_same_bytes(tmp_path):
    data = {"b": [float("nan"), 1.5], "a": {"z": 1, "y": None}}
    first, second = tmp_path / "1.json", tmp_path / "2.json"
    assert write_json(data, first) == write_json(dict(reversed(list(data.items()))), second)
    assert first.read_bytes() == second.read_bytes()


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_bare_non_finite_value_is_null(tmp_path, value):
    write_json(value, tmp_path / "x.json")
    assert _strict((tmp_path / "x.json").read_text()) is None


def test_writers_return_the_fingerprint_of_the_file_written(tmp_path):
    """The fingerprint is taken from the bytes in memory (no read back): it must be the file's, and the
    parquet bytes those pyarrow writes straight to a file with the same options."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nextloc.atomic import write_text_atomic
    from nextloc.fingerprint import hash_file
    from nextloc.storage import PARQUET_OPTIONS, write_geoparquet, write_parquet

    frame = pd.DataFrame(
        {
            "user_id": [1, 1, 2],
            "latitude": [39.9, 39.91, 40.0],
            "longitude": [116.3, 116.31, 116.4],
            "name": ["a", "b", "a"],
        }
    )
    for writer, name in ((write_parquet, "plain.parquet"), (write_geoparquet, "geo.parquet")):
        path = tmp_path / name
        assert writer(frame, path) == hash_file(path)
    direct = tmp_path / "direct.parquet"
    table = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)
    pq.write_table(table, direct, use_dictionary=["name"], **PARQUET_OPTIONS)
    assert (tmp_path / "plain.parquet").read_bytes() == direct.read_bytes()
    text = tmp_path / "t.txt"
    write_text_atomic(text, "ü\nline\n")
    assert text.read_bytes() == "ü\nline\n".encode()
    assert write_json({"a": 1}, tmp_path / "j.json") == hash_file(tmp_path / "j.json")
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_table_written_part_by_part_reads_back_as_the_parts_joined(tmp_path):
    """``write_parquet_parts``: each part cast to the schema, in order; the fingerprint is the file's; no
    part at all gives an empty table of that schema."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nextloc.fingerprint import hash_file
    from nextloc.storage import write_parquet_parts

    schema = pa.schema([("index", pa.string()), ("key", pa.int64()), ("count", pa.float64())])
    parts = [
        pd.DataFrame({"index": "user", "key": [3, 1], "count": [1.0, 2.0]}),
        pd.DataFrame({"index": "place", "key": np.array([7], dtype=np.int32), "count": [5]}),
    ]
    path = tmp_path / "parts.parquet"
    assert write_parquet_parts(iter(parts), schema, path) == hash_file(path)
    back = pq.read_table(path)
    assert back.schema.equals(schema)
    assert pq.ParquetFile(path).num_row_groups == 2
    joined = pd.concat(parts, ignore_index=True).astype({"key": "int64", "count": "float64"})
    pd.testing.assert_frame_equal(back.to_pandas(), joined)
    write_parquet_parts([], schema, tmp_path / "empty.parquet")
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0
    assert not list(tmp_path.glob("*.tmp"))
