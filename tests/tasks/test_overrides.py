"""Model and training overrides are checked before any work (nextloc.training.overrides.resolve_overrides).

A deployment run or a command with a misspelt option used to fail in the training task, after the
preprocessing (minutes on the full data); the flows now check them first.
"""

from __future__ import annotations

import pytest

from flows.pipeline import preprocess_train
from flows.train import train
from nextloc.models.registry import KINDS, neural_kinds
from nextloc.training.overrides import ModelOverrides, TrainOverrides, resolve_overrides


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
        # a network refit on train + val would fit its new-place head on answers it trained on
        (
            None,
            {"pointer_plus": {"refit_on_train_val": True}},
            r"pointer_plus: training option refit_on_train_val=True is refused: .*new-place head",
        ),
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
        resolve_overrides(model_overrides, train_overrides)


def test_valid_overrides_pass_as_plain_per_kind_dicts():
    model, train = resolve_overrides(
        {"mhsa": {"d_model": 64}, "pointer_plus_ensemble": {"d_model": 64}},
        {"mhsa": {"bucket": False, "max_epochs": 2}, "lstm": {"dropout_rng": "torch"}, "pointer": {}},
    )
    assert model == {"mhsa": {"d_model": 64}, "pointer_plus_ensemble": {"d_model": 64}}
    assert train == {
        "mhsa": {"bucket": False, "max_epochs": 2},
        "pointer": {},
        "lstm": {"dropout_rng": "torch"},
    }
    assert resolve_overrides(None, None) == ({}, {})


def test_the_flows_check_them_before_preprocessing_or_training(tmp_path):
    """Both flows' bodies raise before touching the data folder (called without orchestration, with a
    ``training`` section built unchecked)."""
    from tasks.train import TrainRun

    data_dir = tmp_path / "data"
    with pytest.raises(ValueError, match="bogus"):
        preprocess_train.fn(
            raw_dir=str(tmp_path / "raw"),
            data_dir=str(data_dir),
            training=TrainRun.model_construct(train_overrides={"mhsa": {"bogus": 1}}),
        )
    training = TrainRun.model_construct(models=["mhsa"], model_overrides={"mhsa": {"d_modle": 64}})
    with pytest.raises(ValueError, match="d_modle"):
        train.fn(data_dir=str(data_dir), training=training)
    assert not data_dir.exists()


def test_the_neural_kinds_are_the_registrys_networks_and_ensembles():
    """The kinds that take overrides are read from the registry, and each has a typed field in both models."""
    assert set(neural_kinds()) == {k for k, e in KINDS.items() if e.family in ("neural", "ensemble")}
    assert set(ModelOverrides.model_fields) == set(TrainOverrides.model_fields) == set(neural_kinds())


@pytest.mark.parametrize(
    ("train_overrides", "allowed"),
    [
        ({"monitor": "val_foo"}, "'val_loss', 'val_acc@1', 'val_mrr', 'val_place_acc@1', 'val_place_mrr'"),
        ({"recipe": "foo"}, "'mhsa', 'pointer'"),
    ],
)
def test_a_misspelt_choice_names_the_key_and_the_allowed_values(train_overrides, allowed):
    """``--train-set monitor=val_foo`` / ``recipe=foo``: rejected before any work, naming key and values."""
    ((key, value),) = train_overrides.items()
    with pytest.raises(
        ValueError, match=rf"mhsa: training option {key}='{value}': expected one of \[{allowed}\]"
    ):
        resolve_overrides(None, {"mhsa": train_overrides})


def test_an_unknown_key_is_named_with_the_allowed_keys():
    with pytest.raises(
        ValueError, match=r"lstm: unknown 'lstm' config key\(s\) \['hidden'\]; allowed: \[.*'hidden_size'"
    ):
        resolve_overrides({"lstm": {"hidden": 64}}, None)
    with pytest.raises(
        ValueError, match=r"mhsa: unknown training option\(s\) \['epochs'\]; allowed: \[.*'max_epochs'"
    ):
        resolve_overrides(None, {"mhsa": {"epochs": 2}})


def test_the_flows_reject_bad_overrides_when_their_parameters_are_validated():
    """Prefect validates the typed parameters: the error names the kind and the key, and no work starts."""
    from prefect.exceptions import ParameterTypeError

    with pytest.raises(
        ParameterTypeError,
        match=r"training.train_overrides.pointer_plus.monitor: Input should be 'val_loss'",
    ):
        train.validate_parameters({"training": {"train_overrides": {"pointer_plus": {"monitor": "val_foo"}}}})
    with pytest.raises(
        ParameterTypeError,
        match=r"training.model_overrides.mhsa: .*unknown 'mhsa' config key\(s\) \['d_modle'\]",
    ):
        preprocess_train.validate_parameters({"training": {"model_overrides": {"mhsa": {"d_modle": 64}}}})
    with pytest.raises(ParameterTypeError, match=r"name unknown models \['markov'\]"):
        preprocess_train.validate_parameters({"training": {"train_overrides": {"markov": {"lr": 1e-3}}}})
    given = {"mhsa": {"max_epochs": 2}}
    validated = preprocess_train.validate_parameters({"training": {"train_overrides": given}})["training"]
    assert validated.train_overrides.by_kind() == given
