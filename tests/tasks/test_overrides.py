"""Model and training overrides are checked before any work (tasks.train.check_overrides).

A deployment run or a command with a misspelt option used to fail in the training task, after the
preprocessing (minutes on the full data); the flows now check them first.
"""

from __future__ import annotations

import pytest

from flows.pipeline import preprocess_train
from flows.train import train
from nextloc.models import ENSEMBLES, MODEL_REGISTRY
from tasks.train import NEURAL, check_overrides


@pytest.mark.parametrize(
    ("model_overrides", "train_overrides", "message"),
    [
        (
            {"mhsa": {"d_modle": 64}},
            None,
            r"mhsa: unknown 'mhsa' config key\(s\) \['d_modle'\]",
        ),
        (None, {"pointer_plus": {"bogus": 1}}, r"pointer_plus: unknown training option\(s\) \['bogus'\]"),
        (
            None,
            {"lstm": {"dropout_rng": "mt"}},
            r"lstm: training option dropout_rng='mt': expected one of \['torch', 'pcg64'\]",
        ),
        (None, {"mhsa": {"bucket_pool": 0}}, r"mhsa: bucket_pool must be >= 1"),
        (None, {"markov": {"lr": 1e-3}}, r"name unknown models \['markov'\]"),
        # an ensemble is checked as its members' kind
        (
            {"pointer_plus_ensemble": {"nope": 1}},
            None,
            r"pointer_plus_ensemble: unknown 'pointer_plus' config key\(s\) \['nope'\]",
        ),
    ],
)
def test_bad_overrides_are_rejected_naming_the_kind_and_key(model_overrides, train_overrides, message):
    with pytest.raises(ValueError, match=message):
        check_overrides(model_overrides, train_overrides)


def test_valid_overrides_pass():
    check_overrides(
        {"mhsa": {"d_model": 64}, "pointer_plus_ensemble": {"d_model": 64}},
        {"mhsa": {"bucket": False, "max_epochs": 2}, "lstm": {"dropout_rng": "torch"}},
    )
    check_overrides(None, None)


def test_the_flows_check_them_before_preprocessing_or_training(tmp_path):
    """Both flows' bodies raise before touching the data folder (called without orchestration)."""
    data_dir = tmp_path / "data"
    with pytest.raises(ValueError, match="bogus"):
        preprocess_train.fn(
            raw_dir=str(tmp_path / "raw"), data_dir=str(data_dir), train_overrides={"mhsa": {"bogus": 1}}
        )
    with pytest.raises(ValueError, match="d_modle"):
        train.fn(data_dir=str(data_dir), models=["mhsa"], model_overrides={"mhsa": {"d_modle": 64}})
    assert not data_dir.exists()


def test_the_neural_kinds_are_the_librarys_models_and_ensembles():
    """The command checks overrides before Prefect is imported, so it tells the neural kinds by the library's
    registries; they must be tasks.train.NEURAL."""
    assert set(NEURAL) == set(MODEL_REGISTRY) | set(ENSEMBLES)
