"""One deployment per dataset profile (:func:`flows.deployments.deployments`).

The deployments are built from the shipped profiles and from a temporary profile folder with a third
profile, registered with a real (temporary) Prefect API and read back from it; their parameters are the
ones ``nextloc run --dataset NAME`` resolves (the same function), and a deployment whose input is missing
fails its run naming the path.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from commands import main as cli
from flows.deployments import deployments
from nextloc.config import PreprocessConfig
from nextloc.profiles import PROFILE_DIR, PROFILE_DIR_ENV

THIRD = """\
input:
  format: geolife
  raw_dir: /nonexistent/beijing-raw
preprocess:
  timezone: Asia/Shanghai
  locations: {epsilon_m: 50, coordinate_order: lat_lon}
models:
  pointer_plus: {d_model: 96}
"""


def _by_name(built: list) -> dict[str, Any]:
    return {d.full_name: d for d in built}


@pytest.fixture
def profile_root(tmp_path: Path) -> Path:
    """The shipped profiles plus a third one (GeoLife format, its own protocol and a missing raw folder)."""
    root = tmp_path / "datasets"
    shutil.copytree(PROFILE_DIR, root)
    (root / "beijing.yaml").write_text(THIRD)
    return root


class TestDeployments:
    def test_one_per_shipped_profile(self) -> None:
        found = _by_name(deployments())
        assert set(found) == {"preprocess-train/geolife", "preprocess-train/diy", "retrain/geolife-dumps"}

        geolife = found["preprocess-train/geolife"].parameters
        assert (geolife["raw_dir"], geolife["data_dir"]) == (None, "data/geolife")
        assert "input_format" not in geolife  # the GeoLife input: the flow's defaults
        assert geolife["preprocess"] == PreprocessConfig().model_dump(mode="json")
        assert geolife["training"] == {"model_overrides": {}, "train_overrides": {}}

        diy = found["preprocess-train/diy"].parameters
        assert (diy["raw_dir"], diy["data_dir"], diy["input_format"]) == (
            "data/raw/diy",
            "data/diy",
            "visits",
        )
        protocol, training = diy["preprocess"], diy["training"]
        assert protocol["locations"]["epsilon_m"] == 50.0
        quality = protocol["quality"]
        assert (quality["day_filter"], quality["min_thres"], quality["mean_thres"]) == (60, 0.6, 0.7)
        split = protocol["split"]
        assert (split["train"], split["val"], split["test"]) == (0.8, 0.1, 0.1)
        assert training["model_overrides"]["mhsa"]["d_model"] == 96
        assert training["model_overrides"]["pointer"]["nhead"] == 4
        assert training["train_overrides"]["mhsa"] == {"batch_size": 256}
        assert training["train_overrides"]["pointer_plus"] == {"lr": 0.0007}

        dumps = found["retrain/geolife-dumps"]
        assert dumps.parameters["incoming_dir"] == "data/incoming"
        assert (dumps.parameters["raw_dir"], dumps.parameters["data_dir"]) == (
            "data/raw/geolife",
            "data/geolife",
        )
        assert dumps.schedules, "retrain/geolife-dumps lost its cron schedule"

    def test_a_third_profile_gets_its_deployments(self, profile_root: Path, monkeypatch) -> None:
        monkeypatch.setenv(PROFILE_DIR_ENV, str(profile_root))
        found = _by_name(deployments())  # the folder from $NEXTLOC_DATASETS_DIR
        assert set(found) == {
            "preprocess-train/geolife",
            "preprocess-train/diy",
            "preprocess-train/beijing",
            "retrain/geolife-dumps",
            "retrain/beijing-dumps",
        }
        beijing = found["preprocess-train/beijing"].parameters
        assert (beijing["raw_dir"], beijing["data_dir"]) == ("/nonexistent/beijing-raw", "data/beijing")
        assert beijing["preprocess"]["timezone"] == "Asia/Shanghai"
        assert beijing["preprocess"]["locations"]["coordinate_order"] == "lat_lon"
        assert beijing["training"]["model_overrides"] == {"pointer_plus": {"d_model": 96}}
        dumps = found["retrain/beijing-dumps"].parameters
        assert dumps["incoming_dir"] == "data/incoming-beijing"  # not inside geolife's data/incoming
        assert (dumps["raw_dir"], dumps["data_dir"]) == ("/nonexistent/beijing-raw", "data/beijing")
        assert dumps["preprocess"]["locations"]["epsilon_m"] == 50.0
        assert dumps["preprocess"]["timezone"] == "Asia/Shanghai"
        assert dumps["training"]["model_overrides"] == {"pointer_plus": {"d_model": 96}}

    def test_an_empty_or_bad_profile_folder_is_named(self, tmp_path: Path) -> None:
        with pytest.raises(FileNotFoundError, match=str(tmp_path)):
            deployments(tmp_path)
        (tmp_path / "bad.yaml").write_text("preprocess:\n  locations:\n    epsilon: 5\n")
        with pytest.raises(ValueError, match="epsilon"):
            deployments(tmp_path)

    def test_same_parameters_as_nextloc_run(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """``nextloc run --dataset diy`` passes the flow exactly the deployment's parameters (one path)."""
        import flows.pipeline

        deployed = _by_name(deployments())["preprocess-train/diy"].parameters
        calls: dict[str, Any] = {}

        def stub(**kwargs: Any) -> None:
            calls.update(kwargs)
            raise _FlowCalled

        monkeypatch.setattr(flows.pipeline, "preprocess_train", stub)
        monkeypatch.setattr(cli, "configure_environment", lambda: None)
        monkeypatch.setattr(cli, "check_raw_dir", lambda raw_dir: None)
        with pytest.raises(_FlowCalled):
            cli.main(["run", "--dataset", "diy", "--model", "markov,mhsa,pointer,pointer_plus"])
        assert {k: calls[k] for k in deployed if k != "training"} == {
            k: v for k, v in deployed.items() if k != "training"
        }
        training = calls["training"]
        assert {k: training[k] for k in deployed["training"]} == deployed["training"]  # the profile's presets
        assert training["models"] == ["markov", "mhsa", "pointer", "pointer_plus"]


class _FlowCalled(Exception):
    pass


@pytest.mark.usefixtures("prefect_api")
class TestRegistered:
    def test_registered_and_a_missing_input_fails_naming_it(
        self, profile_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from prefect.client.orchestration import get_client

        from flows.pipeline import preprocess_train

        built = deployments(profile_root)
        for deployment in built:
            deployment.apply()
        with get_client(sync_client=True) as client:
            stored = {d.full_name: client.read_deployment_by_name(d.full_name) for d in built}
        assert set(stored) == {d.full_name for d in built}
        for deployment in built:
            assert stored[deployment.full_name].parameters == deployment.parameters
        assert stored["retrain/beijing-dumps"].schedules  # the cron travels

        # a run of a deployment whose input folder is missing fails, naming the path, before any output
        monkeypatch.chdir(tmp_path)
        for name, missing in (("diy", "data/raw/diy"), ("beijing", "/nonexistent/beijing-raw")):
            params = stored[f"preprocess-train/{name}"].parameters
            with pytest.raises(FileNotFoundError, match=missing):
                preprocess_train(**{**params, "training": {**params["training"], "models": ["markov"]}})
            assert not (tmp_path / "data" / name / "samples").exists()

    def test_a_run_lays_its_sections_over_the_deployments_key_by_key(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A deployment run of ``diy`` given ``training={"models": [...]}`` and ``preprocess={"locations":
        {...}}`` keeps the profile's model presets and the rest of its protocol (each key given replaces the
        deployment's, as each flat parameter did); a run of another flow, or a call from Python, is as given."""
        from prefect.client.orchestration import get_client

        from flows.pipeline import preprocess_train

        (deployment,) = [d for d in deployments() if d.full_name == "preprocess-train/diy"]
        deployment_id = deployment.apply()
        given = {"training": {"models": ["markov"]}, "preprocess": {"locations": {"min_samples": 3}}}
        with get_client(sync_client=True) as client:
            run = client.create_flow_run_from_deployment(deployment_id, parameters=given)
        deployed = deployment.parameters
        assert run.parameters["training"] == given["training"]  # Prefect replaces the section whole

        monkeypatch.setenv("PREFECT__FLOW_RUN_ID", str(run.id))  # as the worker running it sets it
        validated = preprocess_train.validate_parameters(run.parameters)
        training, protocol = validated["training"], validated["preprocess"]
        assert training.models == ["markov"]
        assert training.model_overrides.by_kind() == deployed["training"]["model_overrides"]  # presets stay
        assert training.train_overrides.by_kind() == deployed["training"]["train_overrides"]
        assert protocol.locations.min_samples == 3
        assert (
            protocol.split.model_dump() == deployed["preprocess"]["split"]
        )  # the rest of the protocol stays
        assert protocol.quality.model_dump(mode="json") == deployed["preprocess"]["quality"]

        monkeypatch.delenv("PREFECT__FLOW_RUN_ID")
        assert preprocess_train.validate_parameters(given)["training"].model_overrides is None

    def test_a_deployment_run_given_an_old_name_fails_naming_its_section(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A run of ``preprocess-train/geolife`` created with ``promote_metric`` (through the API, a schedule
        or the UI: the ``prefect`` CLI refuses a name the deployment lacks before it creates a run) fails when
        its parameters are validated, before any work, its state saying where the setting went."""
        from prefect.client.orchestration import get_client
        from prefect.flow_engine import run_flow

        from flows.pipeline import preprocess_train

        (deployment,) = [d for d in deployments() if d.full_name == "preprocess-train/geolife"]
        deployment_id = deployment.apply()
        data_dir = tmp_path / "data"
        given = {"data_dir": str(data_dir), "promote_metric": "val_place_mrr_at_selected"}
        with get_client(sync_client=True) as client:
            run = client.create_flow_run_from_deployment(deployment_id, parameters=given)
        monkeypatch.setenv("PREFECT__FLOW_RUN_ID", str(run.id))  # as the worker running it sets it
        state = run_flow(preprocess_train, flow_run=run, parameters=run.parameters, return_type="state")
        assert state.is_failed()
        with get_client(sync_client=True) as client:
            message = client.read_flow_run(run.id).state.message
        assert "promote_metric is now promotion.promote_metric" in message, message
        assert not data_dir.exists()
