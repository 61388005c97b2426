"""nextloc.routine.trees: LightGBM's raw scores from its model text, without LightGBM."""

from __future__ import annotations

import lightgbm
import numpy as np
import pytest

from nextloc.routine.trees import TreeEnsemble


def _features(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.normal(0, 2, (n, 5))
    x[rng.random(x.shape) < 0.2] = 0.0
    x[rng.random(x.shape) < 0.05] = np.nan
    x[rng.random(x.shape) < 0.02] = 1e-36  # LightGBM counts it as 0
    return x


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"zero_as_missing": True},
        {"use_missing": False},
        {"objective": "lambdarank", "num_leaves": 7},
    ],
)
def test_same_scores_as_lightgbm(params):
    rng = np.random.default_rng(0)
    x = _features(rng, 600)
    y = (np.nan_to_num(x[:, 0]) + rng.normal(0, 1, len(x)) > 0).astype(int)
    extra = {"group": [30] * 20} if params.get("objective") == "lambdarank" else {}
    booster = lightgbm.train(
        {"objective": "binary", "verbose": -1, "min_data_in_leaf": 5, **params},
        lightgbm.Dataset(x, y, **extra),
        num_boost_round=30,
    )
    text = booster.model_to_string()
    trees = TreeEnsemble.parse(text)
    assert trees is not None
    unseen = _features(np.random.default_rng(1), 2000)
    np.testing.assert_array_equal(trees.predict(unseen), booster.predict(unseen, raw_score=True))


def test_single_leaf_trees_and_refusals():
    x = np.zeros((50, 2))
    booster = lightgbm.train(
        {"objective": "regression", "verbose": -1}, lightgbm.Dataset(x, np.ones(50)), num_boost_round=3
    )
    trees = TreeEnsemble.parse(booster.model_to_string())
    assert trees is not None
    np.testing.assert_array_equal(trees.predict(x[:4]), booster.predict(x[:4]))
    multi = lightgbm.train(
        {"objective": "multiclass", "num_class": 3, "verbose": -1},
        lightgbm.Dataset(np.arange(90.0)[:, None], np.arange(90) % 3),
        num_boost_round=2,
    )
    assert TreeEnsemble.parse(multi.model_to_string()) is None
