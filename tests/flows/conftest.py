"""Fixtures of the flow tests: the GeoLife sample preprocessed once per session."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _preprocessed_sample(sample_dir, prefect_api, tmp_path_factory) -> Path:
    """The preprocess flow's outputs for the GeoLife sample (default config), run once; never handed out."""
    from flows.preprocess import preprocess

    data_dir = tmp_path_factory.mktemp("preprocessed-sample") / "data"
    preprocess(raw_dir=str(sample_dir), data_dir=str(data_dir))
    return data_dir


@pytest.fixture(scope="session")
def preprocessed_copy(_preprocessed_sample) -> Callable[[Path], Path]:
    """``preprocessed_copy(data_dir)``: a copy of the sample preprocessed by the flow (default config) at
    ``data_dir``, exactly what ``preprocess(raw_dir=sample, data_dir=data_dir)`` writes there (its content
    cache included: a copied data directory is all cache hits, tests/flows/test_content_cache.py)."""

    def copy(data_dir: Path) -> Path:
        shutil.copytree(_preprocessed_sample, data_dir)
        return data_dir

    return copy
