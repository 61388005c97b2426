"""Load on the real PostgreSQL-backed services: 3 `preprocess-train/geolife` runs and a retrain run at once.

The burst of ``benchmarks/services_load.py`` (its one home), at 4 runs where the benchmark's soak has 7 (its
default; run it with ``--backend sqlite`` for the comparison): the services on free 127.0.0.1 ports with
``NEXTLOC_SERVE_LIMIT`` raised so all runs overlap, twice as many as the 2 cores, the GeoLife sample,
``markov`` training (seeds 0..2), the Prefect API polled for latency during the burst. Every run must complete, no service log may show a 503 or ``database is locked``, every MLflow
run must be FINISHED and every registered model must have exactly one ``champion``. The numbers go to
``test-artifacts/services_load_postgres.json`` (git-ignored) and are printed, the services' logs beside
them; a run that did not complete is reported with its state message and last log lines.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

import pytest

import services as svc_module

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
RUNS = 3  # deployment runs, beside one retrain run


def _load_module():
    spec = importlib.util.spec_from_file_location("services_load", REPO / "benchmarks" / "services_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(1800)
def test_burst_of_deployment_runs_on_postgres(sample_dir):
    try:
        svc_module.postgres_bin_dir()
    except RuntimeError as err:
        pytest.skip(str(err))
    load = _load_module()
    root = Path(tempfile.mkdtemp(prefix="nextloc-load-", dir="/tmp"))
    root.chmod(0o755)  # as root, PostgreSQL runs as the postgres user, which must reach .services/pg
    out = REPO / "test-artifacts"
    out.mkdir(exist_ok=True)
    try:
        result = load.run_load("postgres", root, sample=sample_dir, runs=RUNS, timeout_s=1500)
    finally:
        for log in (root / ".services").glob("*.log"):  # the services' and the runs' logs, kept
            shutil.copyfile(log, out / f"services_load_postgres_{log.name}")
        shutil.rmtree(root, ignore_errors=True)
    (out / "services_load_postgres.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "flow_run_ids"}, indent=1))

    # a run that did not complete: its own state message and last log lines, read from the Prefect API
    failures = json.dumps(result.get("failed_runs"), indent=1)
    assert not result["timed_out"], failures
    assert result["flow_run_states"] == {"COMPLETED": RUNS + 1}, failures
    assert result["db_error_count"] == 0, result["db_error_lines"]
    # no client raced another into a duplicate key (experiment, tags, registered model, metrics); the one race
    # Prefect's task-run recorder retries itself (counted apart) lost no event
    assert result["postgres_error_count"] == 0, result["postgres_error_lines"]
    assert result["task_run_recorder_lost_events"] == [], result["task_run_recorder_lost_events"]
    assert result["mlflow_parent_runs"] == RUNS + 1
    assert result["mlflow_runs"] == 2 * (RUNS + 1)  # a parent and a markov child per run
    assert result["mlflow_run_statuses"] == {"FINISHED": 2 * (RUNS + 1)}
    assert result["champions_per_model"] == {"nextloc-markov": 1}
    assert result["api_health_latency"]["errors"] == 0
    assert result["api_flow_run_read_latency"]["errors"] == 0
    assert result["client_http_errors"] == {}
    assert result["services_stopped"]
