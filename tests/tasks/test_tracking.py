"""MLflow helpers against a real SQLite store."""

from __future__ import annotations

import threading
from pathlib import Path

import mlflow
import pytest

from tasks import tracking


@pytest.fixture
def store(tmp_path: Path) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.configure(uri, "t")
    return uri


def test_log_input_survives_concurrent_first_insert(store: str, tmp_path: Path) -> None:
    """Several runs log the same dataset at the same moment on a fresh store; none fails."""
    from mlflow.data.dataset_source_registry import get_registered_sources
    from mlflow.data.meta_dataset import MetaDataset

    local = next(s for s in get_registered_sources() if s._get_source_type() == "local")
    dataset = MetaDataset(source=local(str(tmp_path)), name="geolife-samples", digest="d" * 32)
    experiment = tracking.configure(store, "t")
    client = tracking.MlflowClient()
    run_ids = [client.create_run(experiment).info.run_id for _ in range(6)]
    barrier = threading.Barrier(len(run_ids))
    errors: list[BaseException] = []

    def log(run_id: str) -> None:
        try:
            barrier.wait()
            with mlflow.start_run(run_id=run_id, nested=True):
                tracking.log_input(dataset, context="training")
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
    experiment = tracking.configure(store, "t")
    client = tracking.MlflowClient()
    tags = {"model": "mhsa", "seed": "0", "data_dir": "/d"}
    stale = client.create_run(experiment, tags=tags).info.run_id
    other_seed = client.create_run(experiment, tags={**tags, "seed": "1"}).info.run_id
    finished = client.create_run(experiment, tags=tags).info.run_id
    client.set_terminated(finished, "FINISHED")
    assert tracking.close_interrupted_runs(experiment, tags) == [stale]
    assert client.get_run(stale).info.status == "KILLED"
    assert client.get_run(stale).data.tags["nextloc.interrupted"] == "true"
    assert client.get_run(other_seed).info.status == "RUNNING"
    assert client.get_run(finished).info.status == "FINISHED"
