"""End to end as a team runs it: `nextloc services start`, `prefect deployment run preprocess-train/geolife`.

A real PostgreSQL server (SQLite where its binaries are missing) behind a real Prefect server (temporary
PREFECT_HOME) and the MLflow UI on free 127.0.0.1 ports, the deployments registered by
`flows/deployments.py`, a run triggered with the Prefect CLI on the real GeoLife sample with a short training
config, then the MLflow store checked through the MLflow server's REST API: parent and child runs, the
registered model and its `champion` alias. Everything is stopped at the end.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

import services as services_module
from services import auth
from services.processes import free_port_env, post_json
from tracking import access

_post = functools.partial(post_json, timeout_s=30)  # a slow server under load still answers

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _deployment_run(root: Path, env: dict[str, str], *params: str, watch_timeout: int = 600):
    """``prefect deployment run preprocess-train/geolife --param ... --watch`` against the test's server."""
    api = f"http://127.0.0.1:{env['NEXTLOC_PREFECT_PORT']}/api"
    args = [a for p in params for a in ("--param", p)]
    return subprocess.run(
        [str(BIN / "prefect"), "deployment", "run", "preprocess-train/geolife", *args]
        + ["--watch", "--watch-interval", "2", "--watch-timeout", str(watch_timeout)],
        cwd=root,
        env={**env, "PREFECT_API_URL": api, access.PREFECT_AUTH: _pipeline(root)[access.PREFECT_AUTH]},
        capture_output=True,
        text=True,
        timeout=watch_timeout + 100,
    )


def _pipeline(root: Path) -> dict[str, str]:
    """The pipeline's credentials (``make services`` turns authentication on: docs/services.md)."""
    return auth.credentials(services_module.Services(root, db_url=None), auth.PIPELINE)


def _get(url: str, headers: dict[str, str]) -> dict:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def services():
    # under /tmp, mode 0755: as root, PostgreSQL runs as the postgres user, which must reach .services/pg
    # (pytest's temporary root is closed to other users)
    root = Path(tempfile.mkdtemp(prefix="nextloc-service-", dir="/tmp"))
    root.chmod(0o755)
    env = {
        **os.environ,
        **free_port_env(),
        "PREFECT_HOME": str(root / ".prefect"),
    }
    env.pop("PREFECT_API_URL", None)
    try:
        services_module.postgres_bin_dir()
    except RuntimeError:
        env["NEXTLOC_SERVICES_BACKEND"] = "sqlite"
    nextloc = str(BIN / "nextloc")
    started = subprocess.run(
        [nextloc, "services", "start"], cwd=root, env=env, capture_output=True, text=True
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield root, env, started.stdout
    finally:
        stopped = subprocess.run(
            [nextloc, "services", "stop"], cwd=root, env=env, capture_output=True, text=True
        )
        assert stopped.returncode == 0, stopped.stderr
        status = subprocess.run(
            [nextloc, "services", "status"], cwd=root, env=env, capture_output=True, text=True
        )
        assert "running" not in status.stdout, status.stdout
        shutil.rmtree(root, ignore_errors=True)


def test_deployment_run_completes_and_lands_in_mlflow(services, sample_dir):
    root, env, started = services
    api = f"http://127.0.0.1:{env['NEXTLOC_PREFECT_PORT']}/api"
    assert f"export PREFECT_API_URL={api}" in started
    run = _deployment_run(
        root,
        env,
        f"raw_dir={sample_dir}",
        "data_dir=data/sample",
        'training={"models": ["markov", "mhsa"], "train_overrides": {"mhsa": {"max_epochs": 1, "min_epochs": 0}}}',
        'preprocess={"locations": {"epsilon_m": 20}}',
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Completed" in run.stdout
    assert (root / "data" / "sample" / "samples" / "test.parquet").is_file()

    # the MLflow UI's server sees the runs the deployment wrote into ./mlruns
    mlflow = f"http://127.0.0.1:{env['NEXTLOC_MLFLOW_PORT']}"
    login = access.mlflow_login(_pipeline(root))
    experiment = _get(
        f"{mlflow}/api/2.0/mlflow/experiments/get-by-name?experiment_name=nextloc-geolife", login
    )
    exp_id = experiment["experiment"]["experiment_id"]
    runs = _post(f"{mlflow}/api/2.0/mlflow/runs/search", {"experiment_ids": [exp_id]}, headers=login)["runs"]
    tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
    parents = [r for r, t in zip(runs, tags, strict=True) if t.get("kind") == "pipeline"]
    children = [t for t in tags if t.get("mlflow.parentRunId")]
    assert len(parents) == 1
    parent_id = parents[0]["info"]["run_id"]
    assert {(t["model"], t["mlflow.parentRunId"]) for t in children} == {
        ("markov", parent_id),
        ("mhsa", parent_id),
    }
    parent_tags = {t["key"]: t["value"] for t in parents[0]["data"]["tags"]}
    assert parent_tags["champion_challenger.mhsa.decision"] == "promoted"
    assert parent_tags["champion_challenger.markov.decision"] == "promoted"  # baselines take part too
    assert parent_tags["ingest.rows_skipped"] == "0"
    champion = _get(
        f"{mlflow}/api/2.0/mlflow/registered-models/alias?name=nextloc-mhsa&alias=champion", login
    )
    assert champion["model_version"]["version"] == "1"

    # the run's summary is a markdown artifact in Prefect, with links into the MLflow UI
    artifacts = _post(
        f"{api}/artifacts/filter",
        {"artifacts": {"key": {"any_": ["preprocess-train-summary"]}}},
        headers=access.authorization(_pipeline(root)[access.PREFECT_AUTH]),
    )
    assert artifacts, "no summary artifact"
    summary = artifacts[0]["data"]
    assert f"{mlflow}/#/experiments/{exp_id}/runs/{parent_id}" in summary
    # place metrics lead; the reference protocol's metrics follow
    assert (
        summary.index("Place metrics") < summary.index("P(new place)") < summary.index("Reference protocol")
    )
    assert "| place_acc@1 |" in summary


def test_bad_parameter_is_rejected_before_any_work(services):
    root, env, _ = services
    run = _deployment_run(
        root, env, "data_dir=data/bad", 'preprocess={"locations": {"epsilon_m": -5}}', watch_timeout=300
    )
    assert run.returncode != 0
    assert "epsilon_m" in run.stdout + run.stderr
    assert not (root / "data" / "bad").exists()


def test_a_parameter_name_from_before_the_sections_is_refused(services):
    """``--param promote_metric=...`` (a flat name the flow took before its sections): the Prefect CLI
    refuses it before creating a run, naming it and the parameters there are, the sections among them (a
    run created another way fails naming its section: tests/flows/test_deployments.py)."""
    root, env, _ = services
    run = _deployment_run(root, env, "data_dir=data/old", "promote_metric=val_place_mrr_at_selected")
    assert run.returncode != 0
    output = run.stdout + run.stderr
    assert "promote_metric" in output
    assert "promotion" in output
    assert not (root / "data" / "old").exists()
