"""Scale-out: per-user preprocessing on a 2-worker Dask LocalCluster gives the local runner's bytes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def _digests(root: Path) -> dict[str, str]:
    outputs = [
        p for p in root.rglob("*") if p.is_file() and "_cache" not in p.parts and not p.name.startswith(".")
    ]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in outputs}


@pytest.fixture(scope="module")
def local_run(sample_dir, tmp_path_factory):
    from flows.preprocess import preprocess
    from runtime.runners import make_task_runner

    root = tmp_path_factory.mktemp("local")
    result = preprocess.with_options(task_runner=make_task_runner("local", 2))(
        raw_dir=str(sample_dir), data_dir=str(root)
    )
    return result, _digests(root)


def test_dask_local_cluster_outputs_are_byte_identical(sample_dir, tmp_path, local_run):
    from flows.preprocess import preprocess
    from runtime.runners import make_task_runner

    local, a = local_run
    dask = preprocess.with_options(task_runner=make_task_runner("dask", 2))(
        raw_dir=str(sample_dir), data_dir=str(tmp_path / "dask")
    )
    assert dask["stats"] == local["stats"]
    b = _digests(tmp_path / "dask")
    assert len(a) > 20  # per-user partitions, staypoints, samples, vocabulary, metadata, report
    assert a == b


def test_dbscan_tiles_on_dask_workers_give_the_same_bytes(sample_dir, tmp_path, local_run, monkeypatch):
    """DBSCAN by 4 spatial tiles, the tiles run on the cluster's workers: the local default's bytes."""
    import distributed

    from flows.preprocess import preprocess
    from runtime.runners import make_task_runner

    mapped = []
    real_map = distributed.Client.map

    def recording_map(self, func, *iterables, **kwargs):
        mapped.append(getattr(func, "func", func).__name__)
        return real_map(self, func, *iterables, **kwargs)

    monkeypatch.setattr(distributed.Client, "map", recording_map)
    local, a = local_run
    dask = preprocess.with_options(task_runner=make_task_runner("dask", 2))(
        raw_dir=str(sample_dir), data_dir=str(tmp_path / "dask"), dbscan_tiles=4
    )
    assert mapped == ["tile_core_counts", "tile_links"]
    assert dask["stats"] == local["stats"]
    assert _digests(tmp_path / "dask") == a


def test_runner_choices_are_checked():
    from runtime.runners import make_task_runner

    with pytest.raises(ValueError, match="'local' or 'dask'"):
        make_task_runner("spark")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only used with task_runner='dask'"):
        make_task_runner("local", dask_address="tcp://127.0.0.1:8786")


def test_tile_map_is_the_builtin_map_off_dask():
    """Outside a flow, or on the local runner, DBSCAN tiles run in this process."""
    from runtime.runners import tile_map

    assert tile_map() is map


VOLATILE = {"train_seconds", "stage_seconds", "mlflow_run_id", "model_uri", "registered_version"}


def _trained(data_dir: Path) -> dict[str, object]:
    """Each run's test answers (bytes) and results (timing and MLflow ids left out)."""
    out: dict[str, object] = {}
    for run in sorted((data_dir / "results").glob("*/seed*")):
        name = f"{run.parent.name}/{run.name}"
        out[name] = hashlib.sha256((run / "test_per_sample.parquet").read_bytes()).hexdigest()
        results = json.loads((run / "results.json").read_text())
        out[f"{name}/results"] = {k: v for k, v in results.items() if k not in VOLATILE}
    return out


def test_trainings_on_a_dask_local_cluster_give_the_process_pools_results(preprocessed_copy, tmp_path):
    """Each (kind, seed) one task on a 2-worker LocalCluster: the process pool's answers and results."""
    from flows.train import train
    from runtime.runners import make_training_runner

    digests = []
    for runner in ("local", "dask"):
        data_dir = preprocessed_copy(tmp_path / runner)
        result = train.with_options(task_runner=make_training_runner(runner, 2))(
            data_dir=str(data_dir),
            training={"models": ["markov", "ranker"], "seeds": [0, 1], "device": "cpu"},
            tracking={"tracking_uri": f"sqlite:///{tmp_path / f'{runner}.db'}", "experiment": "test"},
            promote=False,
        )
        assert len(result["runs"]) == 4
        digests.append(_trained(data_dir))
    assert len(digests[0]) == 8
    assert digests[0] == digests[1]
