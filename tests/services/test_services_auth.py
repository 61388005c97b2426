"""The team services ask for credentials: real PostgreSQL, Prefect server and MLflow basic-auth server on
free 127.0.0.1 ports (:func:`tests.conftest.team_services`, one completed deployment run in them).

Without credentials and with wrong ones, "create a flow run", "set the champion alias", "delete a run"
and "read an artifact" are refused (401) and change nothing; the reader reads (runs, artifacts,
``nextloc predict``) and every write of it into what the pipeline made is refused (403); the secrets are
0600 files and reach no command line, log, MLflow param or tag, or Prefect parameter; a refused client
says which service refused it. Every request tried and its answer go to
``test-artifacts/services_auth_endpoints.json`` (git-ignored).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from services import auth
from tracking import access

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
NEXTLOC = str(Path(sys.executable).parent / "nextloc")
ANSWERS: list[dict] = []  # every request tried: who, what, the HTTP answer


def _request(method: str, url: str, body: dict | None = None, who: str = "nobody", creds: str | None = None):
    """The HTTP status and body of one request (never raises on an HTTP error); recorded in ANSWERS."""
    headers = {"Content-Type": "application/json", **(access.authorization(creds) if creds else {})}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, text = response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode(errors="replace")
    path = urllib.parse.urlsplit(url).path
    ANSWERS.append({"who": who, "method": method, "path": path, "status": status})
    return status, text


def _mlflow_creds(values: dict[str, str]) -> str:
    return f"{values[access.MLFLOW_USERNAME]}:{values[access.MLFLOW_PASSWORD]}"


@pytest.fixture(scope="module")
def state(team_services):
    """The pipeline's experiment, its runs, the model's versions (a second one registered here, so that
    moving ``champion`` would change something) and an artifact of a run."""
    s = team_services
    pipe = _mlflow_creds(s.pipeline)
    _, text = _request(
        "GET",
        f"{s.mlflow}/api/2.0/mlflow/experiments/get-by-name?experiment_name=nextloc-geolife",
        None,
        "pipeline",
        pipe,
    )
    experiment = json.loads(text)["experiment"]["experiment_id"]
    _, text = _request(
        "POST", f"{s.mlflow}/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment]}, "pipeline", pipe
    )
    runs = json.loads(text)["runs"]
    child = next(r for r in runs if any(t["key"] == "mlflow.parentRunId" for t in r["data"]["tags"]))
    run_id = child["info"]["run_id"]
    _, text = _request(
        "GET",
        f"{s.mlflow}/api/2.0/mlflow/registered-models/alias?name=nextloc-markov&alias=champion",
        None,
        "pipeline",
        pipe,
    )
    champion = json.loads(text)["model_version"]
    status, text = _request(
        "POST",
        f"{s.mlflow}/api/2.0/mlflow/model-versions/create",
        {
            "name": "nextloc-markov",
            "source": champion["source"],
            "run_id": champion["run_id"],
            "model_id": champion["source"].removeprefix("models:/"),
        },
        "pipeline",
        pipe,
    )
    assert status == 200, text
    artifact = f"{experiment}/{run_id}/artifacts/per_user.csv"
    yield {"experiment": experiment, "run_id": run_id, "champion": champion["version"], "artifact": artifact}
    out = REPO / "test-artifacts"
    out.mkdir(exist_ok=True)
    (out / "services_auth_endpoints.json").write_text(json.dumps(ANSWERS, indent=1) + "\n")


def _writes(s, st) -> list[tuple[str, str, str, dict | None]]:
    """(what, method, URL, body) of the writes: the champion alias, runs, the experiment, versions, flow
    runs (creating one: :func:`_create_flow_run`)."""
    m, api = s.mlflow, s.api
    run = {"run_id": st["run_id"]}
    return [
        (
            "set the champion alias",
            "POST",
            f"{m}/api/2.0/mlflow/registered-models/alias",
            {"name": "nextloc-markov", "alias": "champion", "version": "2"},
        ),
        (
            "delete the champion alias",
            "DELETE",
            f"{m}/api/2.0/mlflow/registered-models/alias",
            {"name": "nextloc-markov", "alias": "champion"},
        ),
        ("delete a run", "POST", f"{m}/api/2.0/mlflow/runs/delete", run),
        ("tag a run", "POST", f"{m}/api/2.0/mlflow/runs/set-tag", {**run, "key": "x", "value": "y"}),
        (
            "log a metric",
            "POST",
            f"{m}/api/2.0/mlflow/runs/log-metric",
            {**run, "key": "x", "value": 1.0, "timestamp": 0},
        ),
        ("create a run", "POST", f"{m}/api/2.0/mlflow/runs/create", {"experiment_id": st["experiment"]}),
        (
            "delete the experiment",
            "POST",
            f"{m}/api/2.0/mlflow/experiments/delete",
            {"experiment_id": st["experiment"]},
        ),
        (
            "register a version",
            "POST",
            f"{m}/api/2.0/mlflow/model-versions/create",
            {"name": "nextloc-markov", "source": f"mlflow-artifacts:/{st['experiment']}/x"},
        ),
        (
            "delete a version",
            "DELETE",
            f"{m}/api/2.0/mlflow/model-versions/delete",
            {"name": "nextloc-markov", "version": "2"},
        ),
        (
            "delete the registered model",
            "DELETE",
            f"{m}/api/2.0/mlflow/registered-models/delete",
            {"name": "nextloc-markov"},
        ),
        ("delete a flow run", "DELETE", f"{api}/flow_runs/{s.flow_run_id}", None),
    ]


def _reads(s, st) -> list[tuple[str, str, str, dict | None]]:
    m = s.mlflow
    return [
        ("read an artifact (proxy)", "GET", f"{m}/api/2.0/mlflow-artifacts/artifacts/{st['artifact']}", None),
        ("read an artifact (UI)", "GET", f"{m}/get-artifact?path=per_user.csv&run_uuid={st['run_id']}", None),
        ("list artifacts", "GET", f"{m}/api/2.0/mlflow/artifacts/list?run_id={st['run_id']}", None),
        ("search runs", "POST", f"{m}/api/2.0/mlflow/runs/search", {"experiment_ids": [st["experiment"]]}),
        (
            "read the champion",
            "GET",
            f"{m}/api/2.0/mlflow/registered-models/alias?name=nextloc-markov&alias=champion",
            None,
        ),
        ("the MLflow UI", "GET", f"{m}/", None),
        ("read flow runs", "POST", f"{s.api}/flow_runs/filter", {}),
    ]


def _unchanged(s, st) -> None:
    """The champion is still the version the deployment run promoted, the run is active, no flow run was
    added or deleted."""
    pipe = _mlflow_creds(s.pipeline)
    url = f"{s.mlflow}/api/2.0/mlflow/registered-models/alias?name=nextloc-markov&alias=champion"
    status, text = _request("GET", url, None, "pipeline", pipe)
    assert status == 200, text
    assert json.loads(text)["model_version"]["version"] == st["champion"], text
    status, text = _request(
        "GET", f"{s.mlflow}/api/2.0/mlflow/runs/get?run_id={st['run_id']}", None, "pipeline", pipe
    )
    assert json.loads(text)["run"]["info"]["lifecycle_stage"] == "active", text
    status, text = _request(
        "GET",
        f"{s.mlflow}/api/2.0/mlflow/experiments/get?experiment_id={st['experiment']}",
        None,
        "pipeline",
        pipe,
    )
    assert json.loads(text)["experiment"]["lifecycle_stage"] == "active", text
    body = {
        "deployments": {"name": {"any_": ["geolife"]}}
    }  # preprocess-train/geolife: one run, the fixture's
    status, text = _request(
        "POST", f"{s.api}/flow_runs/filter", body, "pipeline", s.pipeline[access.PREFECT_AUTH]
    )
    assert [r["id"] for r in json.loads(text)] == [s.flow_run_id], text[:3000]


def _create_flow_run(s, who: str, creds: str | None) -> int:
    [deployment] = json.loads(
        _request(
            "POST",
            f"{s.api}/deployments/filter",
            {"deployments": {"name": {"any_": ["geolife"]}}},
            "pipeline",
            s.pipeline[access.PREFECT_AUTH],
        )[1]
    )
    url = f"{s.api}/deployments/{deployment['id']}/create_flow_run"
    return _request("POST", url, {"parameters": {"data_dir": "/tmp/elsewhere"}}, who, creds)[0]


@pytest.mark.parametrize("who", ["nobody", "wrong password", "wrong user"])
def test_without_or_with_wrong_credentials_everything_is_refused(team_services, state, who):
    s = team_services
    mlflow_creds = {"nobody": None, "wrong password": "nextloc-pipeline:wrong", "wrong user": "intruder:x"}[
        who
    ]
    prefect_creds = {"nobody": None, "wrong password": "nextloc:wrong", "wrong user": "intruder:x"}[who]
    assert _create_flow_run(s, who, prefect_creds) == 401
    for what, method, url, body in _writes(s, state) + _reads(s, state):
        creds = prefect_creds if url.startswith(s.api) else mlflow_creds
        status, text = _request(method, url, body, who, creds)
        assert status == 401, (what, status, text[:300])
    _unchanged(s, state)


def test_the_reader_reads_and_every_write_into_the_pipelines_work_is_refused(team_services, state):
    s = team_services
    reader = _mlflow_creds(s.reader)
    assert access.PREFECT_AUTH not in s.reader  # Prefect OSS has one identity: the reader gets none
    for what, method, url, body in _reads(s, state):
        creds = None if url.startswith(s.api) else reader
        status, text = _request(method, url, body, "reader", creds)
        assert status == (401 if url.startswith(s.api) else 200), (what, status, text[:300])
    assert _create_flow_run(s, "reader", None) == 401
    for what, method, url, body in _writes(s, state):
        if url.startswith(s.api):
            continue
        status, text = _request(method, url, body, "reader", reader)
        assert status == 403, (what, status, text[:300])
    upload = f"{s.mlflow}/api/2.0/mlflow-artifacts/artifacts/{state['artifact']}"
    assert _request("PUT", upload, {"x": 1}, "reader", reader)[0] == 403
    _unchanged(s, state)
    # MLflow's basic-auth app lets any user create a new experiment or registered model (its creator then
    # manages it); it cannot touch the pipeline's (docs/services.md)
    status, text = _request(
        "POST", f"{s.mlflow}/api/2.0/mlflow/experiments/create", {"name": "reader-own"}, "reader", reader
    )
    assert status == 200, text
    own = json.loads(text)["experiment_id"]
    pipe = _mlflow_creds(s.pipeline)
    assert (
        _request(
            "POST", f"{s.mlflow}/api/2.0/mlflow/experiments/delete", {"experiment_id": own}, "pipeline", pipe
        )[0]
        == 200
    )


def test_reader_predicts_and_a_refused_client_names_the_service(team_services, sample_dir, tmp_path):
    s = team_services
    history = str(sample_dir / "Data" / "073" / "Trajectory")
    predict = [NEXTLOC, "predict", "--model", "markov", "--history", history, "--tracking-uri", s.mlflow]
    # in the services' folder, the reader's file is found; elsewhere, its variables
    for cwd, extra in ((s.root, {}), (tmp_path, s.reader)):
        answer = subprocess.run(
            predict, cwd=cwd, env={**s.env, **extra}, capture_output=True, text=True, timeout=300
        )
        assert answer.returncode == 0, answer.stderr[-3000:]
        assert json.loads(answer.stdout)[0]["places"]
    wrong = {access.MLFLOW_USERNAME: "nextloc-reader", access.MLFLOW_PASSWORD: "wrong"}
    for extra, said in (({}, "without credentials"), (wrong, "the credentials in")):
        refused = subprocess.run(
            predict, cwd=tmp_path, env={**s.env, **extra}, capture_output=True, text=True, timeout=300
        )
        assert refused.returncode == 2, refused.stderr[-2000:]
        message = " ".join(refused.stderr.split())
        assert f"the MLflow tracking server at {s.mlflow} refused" in message, message
        assert said in message
        assert "Traceback" not in refused.stderr
    for extra in ({}, {access.PREFECT_AUTH: "nextloc:wrong"}):
        worker = subprocess.run(
            [NEXTLOC, "worker", "--api", s.api],
            cwd=tmp_path,
            env={**s.env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert worker.returncode == 2, worker.stderr[-2000:]
        assert f"the Prefect API at {s.api} refused" in " ".join(worker.stderr.split())
        assert "Traceback" not in worker.stderr
    # `nextloc run` reporting to the services: refused before any work, naming the Prefect API
    run = [NEXTLOC, "run", "--raw-dir", str(sample_dir), "--data-dir", "data/x", "--model", "markov"]
    env = {**s.env, "PREFECT_API_URL": s.api, access.PREFECT_AUTH: "nextloc:wrong"}
    refused = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert f"the Prefect API at {s.api} refused the credentials in" in " ".join(refused.stderr.split())
    assert not (tmp_path / "data" / "x").exists()


def test_credentials_are_private_files_never_in_argv_logs_params_or_parameters(team_services, state):
    s = team_services
    folder = s.root / ".services" / "auth"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    secrets = []
    for name in ("pipeline", "reader", "mlflow-server"):
        path = folder / f"{name}.env"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        secrets += [v.split(":", 1)[-1] for k, v in auth.read_env_file(path).items() if "USERNAME" not in k]
    assert stat.S_IMODE((folder / "basic_auth.ini").stat().st_mode) == 0o600
    assert len(secrets) == 5
    assert all(len(x) >= 24 for x in secrets)
    # no command line of any process holds a secret (the servers', their workers', the flow runs')
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert not any(x in text for x in secrets), cmdline
    logs = [*(s.root / ".services").glob("*.log"), *(s.root / ".services").glob("**/*.log")]
    for log in logs:
        assert not any(x in log.read_text(errors="replace") for x in secrets), log
    pipe = _mlflow_creds(s.pipeline)
    _, runs = _request(
        "POST",
        f"{s.mlflow}/api/2.0/mlflow/runs/search",
        {"experiment_ids": [state["experiment"]]},
        "pipeline",
        pipe,
    )
    _, flow_run = _request(
        "GET", f"{s.api}/flow_runs/{s.flow_run_id}", None, "pipeline", s.pipeline[access.PREFECT_AUTH]
    )
    _, deployments = _request(
        "POST", f"{s.api}/deployments/filter", {}, "pipeline", s.pipeline[access.PREFECT_AUTH]
    )
    for text in (runs, flow_run, deployments):
        assert not any(x in text for x in secrets)
    # `nextloc services credentials` prints what a worker or a person needs
    printed = subprocess.run(
        [NEXTLOC, "services", "credentials", "--identity", "reader"],
        cwd=s.root,
        env=s.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert printed.returncode == 0, printed.stderr
    assert auth.parse_env(printed.stdout) == s.reader


def test_mlflow_answers_only_its_own_host_names(team_services):
    """``--allowed-hosts``: a request naming another host (DNS rebinding) is refused before any login."""
    s = team_services
    reader = _mlflow_creds(s.reader)
    request = urllib.request.Request(
        f"{s.mlflow}/api/2.0/mlflow/experiments/search?max_results=1",
        headers={"Host": "attacker.example", **access.authorization(reader)},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    ANSWERS.append(
        {
            "who": "reader, Host: attacker.example",
            "method": "GET",
            "path": "/api/2.0/mlflow/experiments/search",
            "status": refused.value.code,
        }
    )
    assert refused.value.code in (400, 403)
    port = s.mlflow.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        ok = urllib.request.Request(f"{s.mlflow}/health", headers={"Host": host})
        with urllib.request.urlopen(ok, timeout=30) as response:
            assert response.status == 200
    assert os.environ.get("NEXTLOC_SERVICES_HOST") in (None, "127.0.0.1")


def test_a_verified_credential_is_cached_but_a_changed_password_is_refused_at_once(team_services, state):
    """The tracking server trusts a credential it verified for a while (MLflow's credential cache, so that
    its slow password hash runs once, not on every request), and never a refused one: a password changed
    through MLflow's API is refused at the next request, the new one accepted; then it is put back."""
    s = team_services
    config = (s.root / ".services" / "auth" / "basic_auth.ini").read_text()
    assert f"auth_cache_ttl_seconds = {auth.AUTH_CACHE_S}\n" in config
    secrets = auth.read_env_file(s.root / ".services" / "auth" / f"{auth.SERVER_SECRETS}.env")
    admin = f"{auth.MLFLOW_ADMIN}:{secrets[auth.ADMIN_PASSWORD]}"
    user, old = s.reader[access.MLFLOW_USERNAME], s.reader[access.MLFLOW_PASSWORD]
    read = f"{s.mlflow}/api/2.0/mlflow/experiments/get?experiment_id={state['experiment']}"
    for _ in range(2):  # verified, then answered from the cache
        assert _request("GET", read, None, "reader", f"{user}:{old}")[0] == 200
    assert _request("GET", read, None, "wrong password", f"{user}:{old}x")[0] == 401
    change = f"{s.mlflow}/api/2.0/mlflow/users/update-password"
    new = old + "-changed"
    try:
        assert _request("PATCH", change, {"username": user, "password": new}, "admin", admin)[0] == 200
        assert _request("GET", read, None, "reader (old password)", f"{user}:{old}")[0] == 401
        assert _request("GET", read, None, "reader (new password)", f"{user}:{new}")[0] == 200
    finally:
        assert _request("PATCH", change, {"username": user, "password": old}, "admin", admin)[0] == 200
    assert _request("GET", read, None, "reader", f"{user}:{old}")[0] == 200
    assert _request("GET", read, None, "reader (new password)", f"{user}:{new}")[0] == 401
