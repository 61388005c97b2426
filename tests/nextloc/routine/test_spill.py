"""A ranker's training rows on disk (nextloc.routine.spill): LightGBM bins them, and fits, as from one array."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from nextloc.routine.ranking import (
    CandidateSet,
    RoutineRanker,
    _ranking_set,
    lightgbm_data_seed,
    ranker_params,
)
from nextloc.routine.spill import FeatureFiles
from tests.nextloc.routine.test_ranking import candidate_set


def spilled(candidates: CandidateSet, folder, sizes: list[int]) -> CandidateSet:
    """``candidates`` with its features written as chunks of ``sizes`` rows (the last takes the rest)."""
    cuts = np.cumsum(sizes)
    chunks = np.split(candidates.features, cuts[cuts < len(candidates.query)])
    files = FeatureFiles.write(folder, chunks, candidates.features.shape[1])
    return dataclasses.replace(candidates, features=files)


def binned(candidates: CandidateSet, target: np.ndarray, path) -> bytes:
    """LightGBM's binned dataset of ``candidates``, as its binary file."""
    dataset = _ranking_set(candidates, target)
    dataset.params = ranker_params(0)
    dataset.construct().save_binary(str(path))
    return path.read_bytes()


@pytest.mark.parametrize("questions", [300, 45_000])  # every row sampled for the bins; 270,000 rows: a sample
def test_spilled_rows_bin_as_one_array(tmp_path, questions) -> None:
    rng = np.random.default_rng(11)
    candidates, target = candidate_set(rng, questions, per_query=6)
    features = candidates.features
    features[rng.random(features.shape) < 0.05] = np.nan  # missing values and zeros bin too
    features[rng.random(features.shape) < 0.05] = 0.0
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


@pytest.mark.parametrize("seed", [0, 1, 4, 123])
def test_the_bins_seed_is_the_one_lightgbm_derives(seed) -> None:
    """LightGBM writes the seeds it used in a model's parameters: a model fit with ``seed`` alone used the
    ``data_random_seed`` that :func:`lightgbm_data_seed` gives (a new LightGBM that derives it otherwise
    fails here, not silently in the trees)."""
    import lightgbm

    x = np.random.default_rng(0).random((60, 3))
    booster = lightgbm.train(
        {"objective": "binary", "seed": seed, "verbose": -1}, lightgbm.Dataset(x, x[:, 0] > 0.5), 1
    )
    assert f"[data_random_seed: {lightgbm_data_seed(seed)}]" in booster.model_to_string()
