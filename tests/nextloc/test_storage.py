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
