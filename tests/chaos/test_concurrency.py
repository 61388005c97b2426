"""Two `nextloc run` (the preprocess-train flow) at once on the same data directory and MLflow store.

They must not corrupt each other: the second waits for the data directory's lock, then finds its
predecessor's work in the cache; the outputs are byte-identical to a lone run's (a lone `nextloc
preprocess`: the flow's preprocessing writes them, the training only reads them), and the MLflow store is
consistent (every run ended, every registered version backed by a finished run, one champion).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
NEXTLOC = str(Path(sys.executable).parent / "nextloc")
FINAL = [
    "staypoints.parquet",
    "samples/train.parquet",
    "samples/val.parquet",
    "samples/test.parquet",
    "metadata.json",
]


def _args(sample_dir: Path) -> list[str]:
    return [
        "run",
        "--raw-dir",
        str(sample_dir),
        "--data-dir",
        "data",
        "--model",
        "markov,mhsa",
        "--train-set",
        "max_epochs=2",
        "--workers",
        "1",
    ]


def _env(project: Path, name: str) -> dict[str, str]:
    env = {**os.environ, "PREFECT_HOME": str(project / f".prefect-{name}")}
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)  # mlflow.set_tracking_uri in an earlier test exports it
    return env


def test_two_runs_on_one_data_dir(sample_dir, lone_preprocess, tmp_path_factory):
    shared = tmp_path_factory.mktemp("shared")
    procs = [
        subprocess.Popen(
            [NEXTLOC, *_args(sample_dir)],
            cwd=shared,
            env=_env(shared, name),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("a", "b")
    ]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    assert any("held by another run" in o for o in outputs), "the runs did not overlap"

    for name in FINAL:
        assert (shared / "data" / name).read_bytes() == (lone_preprocess / name).read_bytes(), name

    from mlflow import MlflowClient

    uri = f"sqlite:///{shared / 'mlruns' / 'mlflow.db'}"
    client = MlflowClient(uri, uri)
    experiment = client.get_experiment_by_name("nextloc-geolife")
    runs = client.search_runs([experiment.experiment_id])
    assert {r.info.status for r in runs} == {"FINISHED"}
    parents = [r for r in runs if r.data.tags.get("kind") == "pipeline"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1  # the second run was all cache hits: it adds no parent run of its own
    assert sum("no parent run of its own" in o for o in outputs) == 1
    assert sorted(r.data.tags["model"] for r in children) == ["markov", "mhsa"]
    versions = client.search_model_versions("name='nextloc-mhsa'")
    assert len(versions) == 1
    assert client.get_run(versions[0].run_id).info.status == "FINISHED"
    assert str(client.get_model_version_by_alias("nextloc-mhsa", "champion").version) == str(
        versions[0].version
    )
