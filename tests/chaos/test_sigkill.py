"""Kill the pipeline with SIGKILL mid-ingestion, mid-staypoints and mid-training; the rerun must finish,
reuse what was finished, and give exactly the outputs of a run that was never interrupted.

Each run is a real ``nextloc`` process (its own temporary Prefect API, real parquet files, a real MLflow
store) on the real GeoLife sample; the whole process group is killed, the Prefect server included.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
NEXTLOC = str(Path(sys.executable).parent / "nextloc")
FINAL = [
    "staypoints.parquet",
    "samples/train.parquet",
    "samples/val.parquet",
    "samples/test.parquet",
    "vocabulary/locations.parquet",
    "vocabulary/users.parquet",
    "metadata.json",
]
# Long enough to kill in the middle (the first epoch's checkpoint marks the point; three epochs remain), no
# early stop: the rerun resumes from the epoch the kill left and must end on the uninterrupted run's bits.
LONG_TRAINING = [
    "--model",
    "mhsa",
    "--workers",
    "1",
    "--train-set",
    "max_epochs=4",
    "--train-set",
    "patience=1000",
]
RESULT_KEYS = (
    "acc@1",
    "acc@5",
    "acc@10",
    "mrr",
    "ndcg@10",
    "f1",
    "n_test",
    "n_params",
    "selected_epoch",
    "val",
)


def _env(project: Path) -> dict[str, str]:
    env = {**os.environ, "PREFECT_HOME": str(project / ".prefect")}
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)  # mlflow.set_tracking_uri in an earlier test exports it
    return env


def _run(project: Path, args: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [NEXTLOC, *args], cwd=project, env=_env(project), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _kill_when(project: Path, args: list[str], ready: Callable[[], bool], timeout_s: float = 300) -> None:
    """Start ``nextloc args``; SIGKILL its whole process group as soon as ``ready()``; fail if it never was."""
    proc = subprocess.Popen(
        [NEXTLOC, *args],
        cwd=project,
        env=_env(project),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not ready():
            assert proc.poll() is None, f"finished (rc {proc.returncode}) before the point to kill it"
            assert time.monotonic() < deadline, "never reached the point to kill it"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def _files(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.glob(pattern) if p.is_file())


def _assert_same_outputs(data: Path, reference: Path) -> None:
    for name in FINAL:
        assert (data / name).read_bytes() == (reference / name).read_bytes(), name
    for layer in ("01_positionfixes", "02_staypoints", "03_locations"):
        mine = {str(p.relative_to(data)): p.read_bytes() for p in _files(data / layer, "**/*.parquet")}
        theirs = {
            str(p.relative_to(reference)): p.read_bytes() for p in _files(reference / layer, "**/*.parquet")
        }
        assert mine == theirs, layer
    assert not list(data.rglob(".*.tmp")), "temporary files left behind"


@pytest.fixture(scope="module")
def reference(lone_preprocess) -> Path:
    return lone_preprocess


def test_killed_during_ingestion(sample_dir, reference, tmp_path):
    data = tmp_path / "data"
    _kill_when(
        tmp_path,
        ["preprocess", "--raw-dir", str(sample_dir), "--data-dir", "data"],
        lambda: len(_files(data / "01_positionfixes", "*/part-0.parquet")) >= 2,
    )
    finished_before = {p: p.stat().st_mtime_ns for p in _files(data / "01_positionfixes", "*/part-0.parquet")}
    assert 2 <= len(finished_before) < 11, "not killed in the middle of ingestion"
    assert not (data / "samples").exists()
    _run(tmp_path, ["preprocess", "--raw-dir", str(sample_dir), "--data-dir", "data"])
    _assert_same_outputs(data, reference)


def test_killed_during_staypoints(sample_dir, reference, tmp_path):
    """Each user's staypoints follow its ingestion in the same batch: killed once some users have both, the
    rerun reuses those users' ingestion (their cache record is written before their staypoints start)."""
    data = tmp_path / "data"
    _kill_when(
        tmp_path,
        ["preprocess", "--raw-dir", str(sample_dir), "--data-dir", "data"],
        lambda: len(_files(data / "02_staypoints", "*/part-0.parquet")) >= 2,
    )
    assert not (data / "samples").exists(), "not killed before the dataset steps"
    with_staypoints = {p.parent.name for p in _files(data / "02_staypoints", "*/part-0.parquet")}
    ingested = {
        p: p.stat().st_mtime_ns
        for p in _files(data / "01_positionfixes", "*/part-0.parquet")
        if p.parent.name in with_staypoints
    }
    assert len(ingested) == len(with_staypoints) >= 2
    _run(tmp_path, ["preprocess", "--raw-dir", str(sample_dir), "--data-dir", "data"])
    _assert_same_outputs(data, reference)
    # the finished ingestion of those users was reused, not redone
    assert {p: p.stat().st_mtime_ns for p in ingested} == ingested


def test_killed_during_training_resumes_from_its_checkpoint(reference, tmp_path_factory):
    uninterrupted = tmp_path_factory.mktemp("train-ref")
    shutil.copytree(reference, uninterrupted / "data")
    _run(uninterrupted, ["train", "--data-dir", "data", *LONG_TRAINING])
    expected = json.loads((uninterrupted / "data/results/mhsa/seed0/results.json").read_text())

    project = tmp_path_factory.mktemp("train-kill")
    shutil.copytree(reference, project / "data")
    checkpoint = project / "data/results/mhsa/seed0/checkpoints/selection.pt"
    _kill_when(project, ["train", "--data-dir", "data", *LONG_TRAINING], checkpoint.exists)
    assert not (project / "data/results/mhsa/seed0/results.json").exists(), "not killed during training"
    _run(project, ["train", "--data-dir", "data", *LONG_TRAINING])
    got = json.loads((project / "data/results/mhsa/seed0/results.json").read_text())
    assert got["resumed_from_epoch"] >= 1, "the rerun trained from scratch"
    assert expected["resumed_from_epoch"] == 0
    assert {k: got[k] for k in RESULT_KEYS} == {k: expected[k] for k in RESULT_KEYS}
    assert not checkpoint.parent.exists(), "checkpoints are removed once the run is recorded"

    # MLflow stays consistent: the killed run is marked KILLED, the finished one FINISHED, nothing RUNNING
    from mlflow import MlflowClient

    uri = f"sqlite:///{project / 'mlruns' / 'mlflow.db'}"
    client = MlflowClient(uri, uri)
    experiment = client.get_experiment_by_name("nextloc-geolife")
    runs = client.search_runs([experiment.experiment_id], "tags.model = 'mhsa'")
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED"]
