"""Two machines' workers on loopback: the services with no worker of their own, two `nextloc worker`s in
separate project folders that share no files, and a burst of deployment runs between them.

Each worker folder holds its own copy of the GeoLife sample (``data/raw/geolife``) and nothing else; its
Prefect home is its own. Three runs of ``preprocess-train/geolife`` (``markov``, seeds 0..2) go to a pool
whose two workers take two runs at most each, so both must take runs. Then both workers stop and both
folders are deleted, and everything is read from the MLflow tracking server alone: every run FINISHED
with its artifacts listed and downloaded, every registered version loaded, and `nextloc predict` answers
from the champion. The services' and workers' logs go to ``test-artifacts/`` (git-ignored).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import services as svc_module
from services import auth
from services.processes import free_port_env, post_json, write_private
from tracking import access

_post = functools.partial(post_json, timeout_s=30)  # a slow server under load still answers

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
NEXTLOC = str(Path(sys.executable).parent / "nextloc")
RUNS = 3  # one more than a worker's limit: both workers must take runs


def _folder(prefix: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)  # as root, PostgreSQL runs as the postgres user, which must reach .services/pg
    return root


def _start_worker(folder: Path, env: dict[str, str], api: str) -> subprocess.Popen:
    """``nextloc worker`` in ``folder``, with the pipeline's credentials in ``env`` or in the folder's
    ``.services/auth/pipeline.env``, as another machine gets them from ``nextloc services credentials``."""
    log = open(folder / "worker.log", "ab")  # noqa: SIM115 - the worker's log for its whole life
    worker_env = {**env, "PREFECT_HOME": str(folder / ".prefect"), "PREFECT_WORKER_QUERY_SECONDS": "2"}
    return subprocess.Popen(
        [NEXTLOC, "worker", "--api", api, "--limit", "2"],
        cwd=folder,
        env=worker_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_online(api: str, n: int, headers: dict[str, str], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = _post(f"{api}/work_pools/nextloc/workers/filter", {}, headers=headers)
        if sum(w["status"] == "ONLINE" for w in workers) >= n:
            return
        time.sleep(1)
    raise AssertionError(f"{n} workers not online in {timeout_s} s")


def _burst(api: str, headers: dict[str, str]) -> list[str]:
    flows = {f["id"]: f["name"] for f in _post(f"{api}/flows/filter", {}, headers=headers)}
    [deployment] = [
        d["id"]
        for d in _post(f"{api}/deployments/filter", {}, headers=headers)
        if (flows.get(d["flow_id"]), d["name"]) == ("preprocess-train", "geolife")
    ]
    ids = []
    for seed in range(RUNS):
        params = {
            "data_dir": f"data/w-{seed}",
            "training": {"models": ["markov"], "seeds": [seed], "workers": 1},
        }
        run = _post(
            f"{api}/deployments/{deployment}/create_flow_run", {"parameters": params}, headers=headers
        )
        ids.append(run["id"])
    return ids


def _wait_done(api: str, ids: list[str], headers: dict[str, str], timeout_s: float = 900) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        runs = _post(f"{api}/flow_runs/filter", {"flow_runs": {"id": {"any_": ids}}}, headers=headers)
        states = {r["id"]: r["state_type"] for r in runs}
        if all(s in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for s in states.values()) and len(
            states
        ) == len(ids):
            break
        time.sleep(2)
    return states


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.timeout(1800)
def test_two_workers_share_a_burst_and_mlflow_holds_everything(sample_dir, tmp_path, monkeypatch):
    services = _folder("nextloc-pool-")
    folders = [_folder(f"nextloc-worker{i}-") for i in (1, 2)]
    for folder in folders:
        shutil.copytree(sample_dir, folder / "data" / "raw" / "geolife")
    env = {**os.environ, "PYTHONPATH": str(REPO), "NEXTLOC_TORCH_THREADS": "1"}
    for key in ("PREFECT_API_URL", "NEXTLOC_DB_URL", "NEXTLOC_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    env.update(free_port_env())
    try:
        svc_module.postgres_bin_dir()
    except RuntimeError:
        env["NEXTLOC_SERVICES_BACKEND"] = "sqlite"
    api = f"http://127.0.0.1:{env['NEXTLOC_PREFECT_PORT']}/api"
    mlflow_url = f"http://127.0.0.1:{env['NEXTLOC_MLFLOW_PORT']}"
    services_env = {**env, "PREFECT_HOME": str(services / ".prefect")}
    started = subprocess.run(
        [NEXTLOC, "services", "start", "--no-worker"],
        cwd=services,
        env=services_env,
        capture_output=True,
        text=True,
    )
    workers: list[subprocess.Popen] = []
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        # what each machine is given: the first a file, the second the variables
        printed = subprocess.run(
            [NEXTLOC, "services", "credentials"],
            cwd=services,
            env=services_env,
            capture_output=True,
            text=True,
        )
        assert printed.returncode == 0, printed.stderr[-3000:]
        (folders[0] / ".services" / "auth").mkdir(parents=True)
        write_private(folders[0] / ".services" / "auth" / "pipeline.env", printed.stdout)
        pipeline = auth.parse_env(printed.stdout)
        bare = {k: v for k, v in env.items() if k not in pipeline}  # the first machine has only the file
        workers = [_start_worker(folders[0], bare, api), _start_worker(folders[1], {**env, **pipeline}, api)]
        headers = access.authorization(pipeline[access.PREFECT_AUTH])
        _wait_online(api, 2, headers)
        states = _wait_done(api, _burst(api, headers), headers)
        assert list(states.values()) == ["COMPLETED"] * RUNS, states
        # both machines took runs: each folder holds the results of the runs it did, and only those
        took = [sorted(p.parent.name for p in (f / "data").glob("w-*/results")) for f in folders]
        assert all(took), took
        assert sorted(took[0] + took[1]) == [f"w-{seed}" for seed in range(RUNS)], took
    finally:
        for proc in workers:
            _stop(proc)
        out = REPO / "test-artifacts"
        out.mkdir(exist_ok=True)
        for log in [*(services / ".services").glob("*.log"), *(f / "worker.log" for f in folders)]:
            if log.is_file():
                shutil.copyfile(log, out / f"two_workers_{log.parent.name}_{log.name}")
        for folder in folders:  # the workers' machines are gone: no file of theirs is read from here on
            shutil.rmtree(folder, ignore_errors=True)
    try:  # read by the people's read-only identity
        reader = auth.credentials(svc_module.Services(services, db_url=None), auth.READER)
        for key, value in reader.items():
            monkeypatch.setenv(key, value)
        _check_mlflow_alone(mlflow_url, tmp_path, sample_dir)
    finally:
        subprocess.run([NEXTLOC, "services", "stop"], cwd=services, env=services_env, capture_output=True)
        shutil.rmtree(services, ignore_errors=True)


def _check_mlflow_alone(mlflow_url: str, tmp_path: Path, sample_dir: Path) -> None:
    """Every run, artifact and model of the burst, read through the tracking server and its artifact proxy
    (as the user in ``$MLFLOW_TRACKING_USERNAME``)."""
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_url, registry_uri=mlflow_url)
    experiment = client.get_experiment_by_name("nextloc-geolife")
    assert experiment.artifact_location.startswith("mlflow-artifacts:")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2 * RUNS  # a parent and a markov child per flow run
    assert {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        assert run.info.artifact_uri.startswith("mlflow-artifacts:")
        listed = [a.path for a in client.list_artifacts(run.info.run_id)]
        assert listed, run.info.run_name
        local = mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id, dst_path=str(tmp_path / run.info.run_id), tracking_uri=mlflow_url
        )
        assert any(Path(local).rglob("*.json")), run.info.run_name
    mlflow.set_tracking_uri(mlflow_url)
    mlflow.set_registry_uri(mlflow_url)
    versions = client.search_model_versions("name = 'nextloc-markov'")
    assert len(versions) == RUNS
    for version in versions:
        mlflow.pyfunc.load_model(f"models:/nextloc-markov/{version.version}")
    trajectory = sample_dir / "Data" / "073" / "Trajectory"
    answer = subprocess.run(
        [NEXTLOC, "predict", "--model", "markov", "--history", str(trajectory), "--tracking-uri", mlflow_url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert answer.returncode == 0, answer.stderr[-3000:]
    (place_answer,) = json.loads(answer.stdout)
    assert place_answer["known_user"] is True
    assert place_answer["places"], answer.stdout
