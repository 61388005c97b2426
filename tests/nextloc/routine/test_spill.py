"""A ranker's training rows on disk (nextloc.routine.spill): LightGBM bins them, and fits, as from one array."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from nextloc.routine.ranking import RANKER_PARAMS, CandidateSet, RoutineRanker, _ranking_set
from nextloc.routine.spill import FeatureFiles
from tests.nextloc.routine.test_ranking import candidate_set


def spilled(candidates: CandidateSet, folder, sizes: list[int]) -> CandidateSet:
    """``candidates`` with its features written as chunks of ``sizes`` rows (the last takes the rest)."""
    cuts = np.cumsum(sizes)
    chunks = np.split(candidates.features, cuts[cuts < len(candidates.query)])
    files = FeatureFiles.write(folder, chunks, candidates.features.shape[1])
    return dataclasses.replace(candidates, features=files)


def rare(features: np.ndarray, rng: np.random.Generator) -> None:
    """Two columns nonzero on 30 rows only: fewer than ``min_data_in_leaf`` (50), so LightGBM's pre-filter
    drops them from an array; from chunks too only if it is told ``min_data_in_leaf``."""
    for column in (5, 9):
        features[:, column] = 0.0
        features[rng.choice(len(features), 30, replace=False), column] = 1.0


def binned(candidates: CandidateSet, target: np.ndarray, path) -> bytes:
    """LightGBM's binned dataset of ``candidates``, as its binary file."""
    dataset = _ranking_set(candidates, target)
    dataset.params = {**RANKER_PARAMS, "seed": 0}
    dataset.construct().save_binary(str(path))
    return path.read_bytes()


@pytest.mark.parametrize("questions", [300, 45_000])  # every row sampled for the bins; 270,000 rows: a sample
def test_spilled_rows_bin_as_one_array(tmp_path, questions) -> None:
    rng = np.random.default_rng(11)
    candidates, target = candidate_set(rng, questions, per_query=6)
    features = candidates.features
    features[rng.random(features.shape) < 0.05] = np.nan  # missing values and zeros bin too
    features[rng.random(features.shape) < 0.05] = 0.0
    rare(features, rng)
    (tmp_path / "chunks").mkdir()
    files = spilled(candidates, tmp_path / "chunks", [1000, 7, 4096, 30_000])
    assert files.features.shape == features.shape
    assert binned(files, target, tmp_path / "a.bin") == binned(candidates, target, tmp_path / "b.bin")


def test_a_ranker_fit_on_spilled_rows_is_the_same_model_and_scores_them_alike(tmp_path) -> None:
    """Train's and validation's rows on disk (validation's binned by train's bins): the same trees; the
    ranker's scores and a feature column read chunk by chunk equal those of one array."""
    rng = np.random.default_rng(12)
    train, train_target = candidate_set(rng, 400, per_query=5)
    val, val_target = candidate_set(rng, 100, per_query=5)
    rare(train.features, rng)
    for name in ("train", "val"):
        (tmp_path / name).mkdir()
    train_files = spilled(train, tmp_path / "train", [333, 1, 500])
    val_files = spilled(val, tmp_path / "val", [77, 200])
    whole = RoutineRanker(0).fit(train, train_target, val, val_target)
    chunked = RoutineRanker(0).fit(train_files, train_target, val_files, val_target)
    assert chunked.state()["model"] == whole.state()["model"]
    assert len(list((tmp_path / "train").glob("features-*.npy"))) == 4
    read_back = RoutineRanker.from_state(whole.state())  # numpy trees
    for model in (whole, read_back):
        np.testing.assert_array_equal(model.scores(val_files), model.scores(val))
    np.testing.assert_array_equal(val_files.column("log_popularity"), val.column("log_popularity"))
