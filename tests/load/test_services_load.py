"""Load on the real PostgreSQL-backed services, taken by two machines' workers on loopback: one burst of 6
`preprocess-train/geolife` runs and a retrain run at once, then everything read from MLflow alone.

The services start with no worker of their own (``--no-worker``); two `nextloc worker`s run in separate
project folders that share no files, each with its own Prefect home and its own copy of the GeoLife sample
(``data/raw/geolife``, and the retrain run's raw store and dump made by ``benchmarks/services_load.py``'s
``prepare``). The burst is that benchmark's (its one home; ``--bursts`` soaks it): ``markov`` training,
seeds 0..5, each run in its own data folder, the Prefect API polled for latency throughout. Each worker
takes 4 runs at most, so all 7 runs overlap and both workers must take runs.

Checked, as the load: every run completes, no service or worker log shows a 503 or ``database is
locked``, PostgreSQL logged no error, every MLflow run is FINISHED, every registered model has exactly one
``champion``, the API answered every poll. As the two machines: each folder holds the results of the runs
it did, and only those; then both workers stop and both folders are deleted, and every run FINISHED with
its artifacts listed and downloaded, every registered version loaded, and `nextloc predict` answering
from the champion, all through the MLflow tracking server alone. Without PostgreSQL the burst runs on
SQLite and only the two-machine half is checked. The numbers go to ``test-artifacts/services_load.json``
(git-ignored), the services' and workers' logs beside them.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import services as svc_module
from services.processes import post_json

_post = functools.partial(post_json, timeout_s=30)  # a slow server under load still answers

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
NEXTLOC = str(Path(sys.executable).parent / "nextloc")
OUT = REPO / "test-artifacts"
RUNS = 6  # preprocess-train runs; the burst adds one retrain run
LIMIT = 4  # runs a worker takes at once: 2 * LIMIT >= RUNS + 1 (all overlap) and LIMIT < RUNS + 1 (both take)


def _load_module():
    spec = importlib.util.spec_from_file_location("services_load", REPO / "benchmarks" / "services_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _folder(prefix: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)  # as root, PostgreSQL runs as the postgres user, which must reach .services/pg
    return root


def _env() -> tuple[dict[str, str], str]:
    """The services' and workers' environment (free ports; PostgreSQL where installed) and the backend."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NEXTLOC_TORCH_THREADS": "1"}
    for key in ("PREFECT_API_URL", "NEXTLOC_DB_URL", "NEXTLOC_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    env.update({f"NEXTLOC_{p}_PORT": str(_free_port()) for p in ("PREFECT", "MLFLOW", "PG")})
    env["PREFECT_API_LOG_RETRYABLE_ERRORS"] = "true"  # the server logs every 503 it answers
    try:
        svc_module.postgres_bin_dir()
        backend = "postgres"
    except RuntimeError:
        backend = "sqlite"
    env["NEXTLOC_SERVICES_BACKEND"] = backend
    return env, backend


def _start_worker(folder: Path, env: dict[str, str], api: str) -> subprocess.Popen:
    log = open(folder / "worker.log", "ab")  # noqa: SIM115 - the worker's log for its whole life
    worker_env = {**env, "PREFECT_HOME": str(folder / ".prefect"), "PREFECT_WORKER_QUERY_SECONDS": "2"}
    return subprocess.Popen(
        [NEXTLOC, "worker", "--api", api, "--limit", str(LIMIT)],
        cwd=folder,
        env=worker_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_online(api: str, n: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = _post(f"{api}/work_pools/nextloc/workers/filter", {})
        if sum(w["status"] == "ONLINE" for w in workers) >= n:
            return
        time.sleep(1)
    raise AssertionError(f"{n} workers not online in {timeout_s} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _keep_logs(services: Path, folders: list[Path]) -> None:
    OUT.mkdir(exist_ok=True)
    for log in [*(services / ".services").glob("*.log"), *(f / "worker.log" for f in folders)]:
        if log.is_file():
            shutil.copyfile(log, OUT / f"services_load_{log.parent.name}_{log.name}")


def _worker_log_errors(load, folders: list[Path]) -> list[str]:
    """The workers' log lines that show a 503 or a locked database (the services' logs: ``_scan_logs``)."""
    return [
        line.strip()[:300]
        for folder in folders
        if (folder / "worker.log").is_file()
        for line in (folder / "worker.log").read_text(errors="replace").splitlines()
        if load.DB_ERROR.search(line)
    ]


@pytest.mark.timeout(1800)
def test_burst_on_postgres_taken_by_two_workers_and_mlflow_holds_everything(sample_dir, tmp_path):
    load = _load_module()
    services = _folder("nextloc-pool-")
    folders = [_folder(f"nextloc-worker{i}-") for i in (1, 2)]
    for folder in folders:
        shutil.copytree(sample_dir, folder / "data" / "raw" / "geolife")
        load.prepare(folder, sample_dir)  # the retrain run's raw store and dump, whichever worker takes it
    env, backend = _env()
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
    result: dict = {"backend": backend}
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        workers = [_start_worker(folder, env, api) for folder in folders]
        _wait_online(api, 2)
        # each run's raw data is its worker's own copy: a path relative to the worker's folder
        result.update(load._burst(api, services, Path("data/raw/geolife"), RUNS, False, 1500))
        took = [sorted(p.parent.name for p in (f / "data").glob("load-*/results")) for f in folders]
        result["worker_db_error_lines"] = _worker_log_errors(load, folders)
    finally:
        for proc in workers:
            _stop(proc)
        _keep_logs(services, folders)
        for folder in folders:  # the workers' machines are gone: no file of theirs is read from here on
            shutil.rmtree(folder, ignore_errors=True)
    try:
        _check_runs(result, took)
        result.update(load._check_mlflow(services))
        _check_mlflow_alone(mlflow_url, tmp_path, sample_dir)
    finally:
        stopped = subprocess.run(
            [NEXTLOC, "services", "stop"], cwd=services, env=services_env, capture_output=True
        )
        result["services_stopped"] = stopped.returncode == 0
        result.update(load._scan_logs(services))
        _keep_logs(services, [])
        shutil.rmtree(services, ignore_errors=True)
    (OUT / "services_load.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "flow_run_ids"}, indent=1))
    _check_load(result, backend)


def _check_runs(result: dict, took: list[list[str]]) -> None:
    # a run that did not complete: its own state message and last log lines, read from the Prefect API
    failures = json.dumps(result.get("failed_runs"), indent=1)
    assert not result["timed_out"], failures
    assert result["flow_run_states"] == {"COMPLETED": RUNS + 1}, failures
    # both machines took runs: each folder holds the results of the runs it did, and only those
    assert all(took), took
    assert sorted(took[0] + took[1]) == sorted([f"load-{i}" for i in range(RUNS)] + ["load-retrain"]), took


def _check_load(result: dict, backend: str) -> None:
    assert result["services_stopped"]
    if backend != "postgres":
        return
    assert result["db_error_count"] == 0, result["db_error_lines"]
    assert result["worker_db_error_lines"] == []
    # no client raced another into a duplicate key (experiment, tags, registered model, metrics)
    assert result["postgres_error_count"] == 0, result["postgres_error_lines"]
    assert result["mlflow_parent_runs"] == RUNS + 1
    assert result["mlflow_runs"] == 2 * (RUNS + 1)  # a parent and a markov child per run
    assert result["mlflow_run_statuses"] == {"FINISHED": 2 * (RUNS + 1)}
    assert result["champions_per_model"] == {"nextloc-markov": 1}
    assert result["api_health_latency"]["errors"] == 0
    assert result["api_flow_run_read_latency"]["errors"] == 0
    assert result["client_http_errors"] == {}


def _check_mlflow_alone(mlflow_url: str, tmp_path: Path, sample_dir: Path) -> None:
    """Every run, artifact and model of the burst, read through the tracking server and its artifact proxy."""
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_url, registry_uri=mlflow_url)
    experiment = client.get_experiment_by_name("nextloc-geolife")
    assert experiment.artifact_location.startswith("mlflow-artifacts:")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2 * (RUNS + 1)  # a parent and a markov child per flow run
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
    assert len(versions) == RUNS + 1
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
