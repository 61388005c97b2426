"""The flows take typed sections: few parameters, each section frozen and checked when made, and a flat name
from before the sections refused in one line naming its new place (:mod:`runtime.sections`)."""

from __future__ import annotations

import inspect

import pytest
from prefect.exceptions import ParameterTypeError
from pydantic import BaseModel, ValidationError


def _flows() -> dict:
    from flows.pipeline import preprocess_train
    from flows.preprocess import preprocess
    from flows.retrain import retrain
    from flows.train import train

    return {
        "preprocess-train": preprocess_train,
        "train": train,
        "retrain": retrain,
        "preprocess": preprocess,
    }


def test_every_flow_takes_at_most_ten_parameters() -> None:
    counts = {name: len(inspect.signature(f.fn).parameters) for name, f in _flows().items()}
    assert max(counts.values()) <= 10, counts


def test_no_flow_takes_a_dict_typed_rule() -> None:
    """The settings are typed sections: the only dict-typed parameter left is ``columns`` (input column names)."""
    for name, f in _flows().items():
        for parameter, annotation in inspect.get_annotations(f.fn, eval_str=True).items():
            if parameter != "return" and "dict" in str(annotation):
                assert parameter == "columns", (name, parameter, annotation)


def test_the_sections_are_frozen_and_refuse_unknown_keys() -> None:
    from nextloc.config import PreprocessConfig
    from runtime.runners import Runner
    from tasks.dumps import DumpIntake
    from tasks.promotion import PromotionRule
    from tasks.train import TrainRun
    from tracking.settings import Tracking

    for section in (PreprocessConfig, TrainRun, PromotionRule, Runner, Tracking, DumpIntake):
        assert issubclass(section, BaseModel)
        assert section.model_config.get("frozen"), section
        assert section.model_config.get("extra") == "forbid", section
        with pytest.raises(ValidationError, match="bogus"):
            section.model_validate({"bogus": 1})


def test_the_runner_refuses_an_address_without_dask() -> None:
    from runtime.runners import Runner

    with pytest.raises(ValidationError, match="only used with task_runner='dask'"):
        Runner(dask_address="tcp://127.0.0.1:8786")
    assert Runner(task_runner="dask", dask_address="tcp://127.0.0.1:8786").dask_address


@pytest.mark.parametrize(
    ("flow", "old", "new"),
    [
        ("preprocess-train", "promote_metric", "promotion.promote_metric"),
        ("preprocess-train", "locations", "preprocess.locations"),
        ("preprocess-train", "models", "training.models"),
        ("preprocess-train", "task_runner", "runner.task_runner"),
        ("preprocess-train", "dbscan_tiles", "runner.dbscan_tiles"),
        ("preprocess-train", "experiment", "tracking.experiment"),
        ("train", "match_radius_m", "promotion.match_radius_m"),
        ("train", "device", "training.device"),
        ("retrain", "min_age_s", "intake.min_age_s"),
        ("retrain", "decision_metric", "promotion.decision_metric"),
    ],
)
def test_an_old_name_fails_in_one_line_naming_its_section(flow: str, old: str, new: str) -> None:
    f = _flows()[flow]
    with pytest.raises(ParameterTypeError, match=rf"^{old} is now {new} \(") as raised:
        f.validate_parameters({old: 1, "data_dir": "data/x"})
    assert "\n" not in str(raised.value)
    with pytest.raises(ParameterTypeError, match=rf"^{old} is now {new}"):
        f(**{old: 1})  # called from Python: the same line, before any work


def test_retrains_old_pipeline_dict_names_the_sections() -> None:
    with pytest.raises(ParameterTypeError, match=r"^pipeline is now one of retrain's sections \(preprocess"):
        _flows()["retrain"].validate_parameters({"pipeline": {"workers": 1}})


def test_the_run_form_shows_the_sections() -> None:
    """The parameter schema Prefect's UI builds its *Custom run* form from has one object per section."""
    schema = _flows()["preprocess-train"].parameters.model_dump()
    properties = schema["properties"]
    for section, model in (
        ("preprocess", "PreprocessConfig"),
        ("training", "TrainRun"),
        ("promotion", "PromotionRule"),
        ("runner", "Runner"),
        ("tracking", "Tracking"),
    ):
        assert properties[section]["$ref"] == f"#/definitions/{model}"
        assert schema["definitions"][model]["type"] == "object"
