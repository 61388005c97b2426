"""MLflow helpers against a real SQLite store."""

from __future__ import annotations

import threading
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from tracking import mlflow_runs


@pytest.fixture
def store(tmp_path: Path) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow_runs.configure(uri, "t")
    return uri


def test_log_input_survives_concurrent_first_insert(store: str, tmp_path: Path) -> None:
    """Several runs log the same dataset at the same moment on a fresh store; none fails."""
    from mlflow.data.dataset_source_registry import get_registered_sources
    from mlflow.data.meta_dataset import MetaDataset

    local = next(s for s in get_registered_sources() if s._get_source_type() == "local")
    dataset = MetaDataset(source=local(str(tmp_path)), name="geolife-samples", digest="d" * 32)
    experiment = mlflow_runs.configure(store, "t")
    client = MlflowClient()
    run_ids = [client.create_run(experiment).info.run_id for _ in range(6)]
    barrier = threading.Barrier(len(run_ids))
    errors: list[BaseException] = []

    def log(run_id: str) -> None:
        try:
            barrier.wait()
            with mlflow.start_run(run_id=run_id, nested=True):
                mlflow_runs.log_input(dataset, context="training")
        except BaseException as err:  # noqa: BLE001 - collected for the assertion
            errors.append(err)

    threads = [threading.Thread(target=log, args=(r,)) for r in run_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(len(client.get_run(r).inputs.dataset_inputs) == 1 for r in run_ids)


def test_close_interrupted_runs_only_touches_matching_running_runs(store: str) -> None:
    experiment = mlflow_runs.configure(store, "t")
    client = MlflowClient()
    tags = {"model": "mhsa", "seed": "0", "data_dir": "/d"}
    stale = client.create_run(experiment, tags=tags).info.run_id
    other_seed = client.create_run(experiment, tags={**tags, "seed": "1"}).info.run_id
    finished = client.create_run(experiment, tags=tags).info.run_id
    client.set_terminated(finished, "FINISHED")
    assert mlflow_runs.close_interrupted_runs(experiment, tags) == [stale]
    assert client.get_run(stale).info.status == "KILLED"
    assert client.get_run(stale).data.tags["nextloc.interrupted"] == "true"
    assert client.get_run(other_seed).info.status == "RUNNING"
    assert client.get_run(finished).info.status == "FINISHED"


def test_configure_presents_the_experiment_for_the_ui(store: str) -> None:
    """A model-training experiment with a description and the comparison view; a description the user
    edited in the UI is kept."""
    import json

    experiment = mlflow_runs.configure(store, "t")
    client = MlflowClient()
    tags = client.get_experiment(experiment).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags[f"mlflow.sharedViewState.{mlflow_runs.COMPARISON_VIEW}"])
    assert view["name"] == mlflow_runs.COMPARISON_VIEW_NAME
    state = json.loads(view["state"])
    assert state["selectedColumns"][:2] == ["metrics.`test_place_acc_at_1`", "metrics.`test_place_mrr`"]
    assert (state["orderByKey"], state["orderByAsc"]) == ("metrics.`test_place_acc_at_1`", False)
    client.set_experiment_tag(experiment, "mlflow.note.content", "ours")
    mlflow_runs.configure(store, "t")
    assert client.get_experiment(experiment).tags["mlflow.note.content"] == "ours"
    assert mlflow_runs.comparison_url("http://h:5000/", experiment) == (
        f"http://h:5000/#/experiments/{experiment}/runs"
        f"?workflowType=machine_learning&viewStateShareKey={mlflow_runs.COMPARISON_VIEW}"
    )


def test_run_names() -> None:
    from datetime import UTC, datetime

    assert mlflow_runs.child_run_name("pointer_plus", 3) == "pointer_plus s3"
    started = datetime(2026, 11, 23, 21, 40, tzinfo=UTC)
    assert (
        mlflow_runs.parent_run_name(started, ["markov", "mhsa", "markov"]) == "2026-11-23 21:40 markov, mhsa"
    )


GOLDEN = Path(__file__).parents[1] / "golden" / "leaderboard"


def test_data_tags_name_the_protocol(tmp_path: Path) -> None:
    """Every run's data tags carry the protocol of its samples; a dataset from before the switch is the
    reference protocol's."""
    from nextloc.config import PreprocessConfig
    from nextloc.storage import write_json

    metadata = tmp_path / "metadata.json"
    write_json({"config": PreprocessConfig(protocol="deployment").model_dump(mode="json")}, metadata)
    assert mlflow_runs.data_tags("abc", metadata) == {"data_fingerprint": "abc", "protocol": "deployment"}
    write_json({"config": {"timezone": "UTC"}}, metadata)
    assert mlflow_runs.data_tags("abc", str(metadata))["protocol"] == "reference"


def test_log_leaderboard_records_the_board_on_the_parent_run(store: str) -> None:
    """The parent run's description (pinned text), leaderboard.json and the mean/std metrics."""
    import json

    sample = json.loads((GOLDEN / "sample.json").read_text())
    experiment_id = mlflow_runs.configure(store, "t")
    links = {"prefect.root_flow_run_id": "x", "prefect.root_flow_run_url": "http://p/x"}
    with mlflow_runs.parent_run(experiment_id, "p", links, {}) as run_id:
        mlflow_runs.log_leaderboard(run_id, sample["leaderboard"], sample["runs"], sample["promotion"])
    run = mlflow.MlflowClient().get_run(run_id)
    assert run.data.tags[mlflow_runs.DESCRIPTION_TAG] == (GOLDEN / "description.md").read_text()
    assert run.data.metrics["mhsa.test_place_acc_at_1_mean"] == pytest.approx(20.185)
    assert run.data.metrics["markov.test_new_place_brier_std"] == 0.0
    assert "ranker.test_place_acc_at_1_std" in run.data.metrics
    assert "ranker.test_place_acc_at_1_mean" not in run.data.metrics  # NaN is not logged
    folder = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="leaderboard.json")
    logged = json.loads(Path(folder).read_text())
    assert set(logged) == {"leaderboard", "promotion", "runs"}
    assert logged["promotion"]["ranker"]["decision"] == "kept: no registered ranker version in this run"
    assert logged["promotion"]["mhsa"]["decision"].startswith("promoted: v3 (seed 1) is the champion")


def test_champion_alias_and_decision_records(store: str) -> None:
    """tracking.versions: who holds the alias, moving it, and the decision on runs and versions."""
    from tracking import versions

    client = MlflowClient()
    experiment_id = mlflow_runs.configure(store, "t")
    name = mlflow_runs.registered_name("mhsa")
    client.create_registered_model(name)
    runs = [client.create_run(experiment_id).info.run_id for _ in range(2)]
    for run_id in runs:
        client.create_model_version(name, f"runs:/{run_id}/model", run_id=run_id)
    assert versions.champion_holder("mhsa") is None
    assert versions.champion_holder("never_registered") is None
    versions.move_champion("mhsa", "1")
    assert versions.champion_holder("mhsa") == versions.Holder("1", runs[0])
    decision = {
        "metric": "val place_mrr",  # the split the decision read, then the metric
        "promoted": False,
        "reason": "not better",
        "challenger_version": "2",
        "challenger_run_id": runs[1],
        "champion_version": "1",
        "challenger_score": 10.0,
        "champion_score": 11.0,
        "delta": -1.0,
        "p_value": 0.9,
        "decision": "kept: v1 stays the champion",
    }
    with mlflow_runs.parent_run(experiment_id, "p", {}, {}) as parent_id:
        versions.record_decision(parent_id, "mhsa", decision)
    parent = client.get_run(parent_id).data
    assert parent.metrics["champion_challenger.mhsa.champion_val_place_mrr"] == 11.0
    assert parent.metrics["champion_challenger.mhsa.challenger_val_place_mrr"] == 10.0
    assert not [k for k in parent.metrics if "_test_" in k]  # the decision read no test outcome
    assert parent.metrics["champion_challenger.mhsa.p_value"] == 0.9
    assert parent.tags["champion_challenger.mhsa.decision"] == "kept"
    assert mlflow_runs.run_tags(runs[1])["champion_decision"] == "kept: v1 stays the champion"
    assert client.get_model_version(name, "2").tags["champion_decision"] == "kept: v1 stays the champion"
    assert client.get_model_version(name, "1").tags["champion_kept"] == "kept: v1 stays the champion"
    assert versions.champion_holder("mhsa") == versions.Holder("1", runs[0])


def test_search_model_runs_and_run_artifacts(store: str, tmp_path: Path) -> None:
    experiment_id = mlflow_runs.configure(store, "t")
    client = MlflowClient()
    model_run = client.create_run(experiment_id, tags={"model": "markov", "seed": "0"}).info.run_id
    client.create_run(experiment_id, tags={"kind": "pipeline"})
    mlflow_runs.set_run_tags(model_run, {"a": "1", "b": "2"})
    assert {"a": "1", "b": "2"}.items() <= mlflow_runs.run_tags(model_run).items()
    assert list(mlflow_runs.search_model_runs("t")["run_id"]) == [model_run]
    mlflow_runs.log_dict_artifact(model_run, {"x": 1}, "x.json")
    assert (mlflow_runs.download_run_artifacts(model_run, "x.json", tmp_path)).read_text().startswith("{")
    with pytest.raises(FileNotFoundError):
        mlflow_runs.download_run_artifacts(model_run, "vocabulary", tmp_path / "missing")
