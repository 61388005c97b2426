"""`make services` on PostgreSQL: a real PostgreSQL 15 server, the Prefect server (asyncpg) and MLflow (psycopg).

The services run in a temporary project folder on free 127.0.0.1 ports (PostgreSQL too) and are stopped by
the tests. As root, PostgreSQL runs as the unprivileged ``postgres`` user, so the folder lives directly
under /tmp (pytest's own temporary root is closed to other users). Checked: the generated password file
(0600) and that no password reaches a command line; that Prefect's and MLflow's state is in PostgreSQL;
``$NEXTLOC_DB_URL`` (an existing server: nothing started, nothing stopped); that ``nextloc run`` follows the
running services; the stop order; and ``nextloc services copy-store`` (SQLite store -> PostgreSQL, read
back through MLflow's client).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

import services as svc_module
from services import auth
from services.processes import free_port_env, free_ports, post_json
from tracking import access

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def _postgres_available() -> bool:
    try:
        svc_module.postgres_bin_dir()
    except RuntimeError:
        return False
    return True


if not _postgres_available():
    pytest.skip(
        "PostgreSQL server binaries missing (make system-deps installs Debian's postgresql)",
        allow_module_level=True,
    )


def _project_dir() -> Path:
    """A project folder the ``postgres`` user can reach (mode 0755 under /tmp)."""
    root = Path(tempfile.mkdtemp(prefix="nextloc-pg-", dir="/tmp"))
    root.chmod(0o755)
    return root


def _env(root: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        **free_port_env(),
        "PREFECT_HOME": str(root / ".prefect"),
        "PYTHONPATH": str(REPO),
        **extra,
    }
    for key in ("PREFECT_API_URL", "NEXTLOC_DB_URL", "NEXTLOC_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        if key not in extra:
            env.pop(key, None)
    return env


def _nextloc(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "nextloc"), *args], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )


def _sql(url: str, database: str, query: str) -> list[tuple]:
    import psycopg

    parts = url.split("@", 1)
    with psycopg.connect(f"{parts[0]}@{parts[1].split('/')[0]}/{database}", connect_timeout=10) as conn:
        return conn.execute(query).fetchall()


@pytest.fixture(scope="module")
def pg_services():
    root = _project_dir()
    env = _env(root)
    started = _nextloc(root, env, "services", "start")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield root, env
    finally:
        stopped = _nextloc(root, env, "services", "stop")
        assert stopped.returncode == 0, stopped.stderr
        # the worker first, PostgreSQL last
        assert "stopped: worker, mlflow, prefect-server, postgres" in stopped.stderr.replace("\n", " ")
        status = _nextloc(root, env, "services", "status")
        assert "running" not in status.stdout, status.stdout
        shutil.rmtree(root, ignore_errors=True)


def test_postgres_backs_prefect_and_mlflow(pg_services):
    root, env = pg_services
    services = svc_module.Services(
        root,
        prefect_port=int(env["NEXTLOC_PREFECT_PORT"]),
        mlflow_port=int(env["NEXTLOC_MLFLOW_PORT"]),
        pg_port=int(env["NEXTLOC_PG_PORT"]),
        db_url=None,
    )
    status = _nextloc(root, env, "services", "status")
    assert "postgres        running" in status.stdout, status.stdout

    # the generated password: a 0600 file; the data directory under .services/pg
    for private in (services.password_file, services.client_file):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    password = services.password_file.read_text().strip()
    assert len(password) >= 24
    assert (root / ".services" / "pg" / "data" / "PG_VERSION").read_text().strip() == "15"
    # the start waited for the server's own "ready" (postmaster.pid) before its first connection: no login
    # refused while it started up in the log (the services' load test counts every FATAL line there)
    from services.postgres import _postmaster_ready

    assert _postmaster_ready(root / ".services" / "pg" / "data")
    assert "the database system is starting up" not in services.log_file("postgres").read_text()

    # loopback only, no Unix socket
    server = services.server_url()
    assert _sql(server, "postgres", "SHOW listen_addresses") == [("127.0.0.1",)]
    assert _sql(server, "postgres", "SHOW unix_socket_directories") == [("",)]

    # the password never appears on a command line
    for name in ("postgres", "prefect-server", "mlflow", "worker"):
        pid = svc_module.running_pid(services, name)
        assert pid is not None, name
        assert password not in Path(f"/proc/{pid}/cmdline").read_text(), name

    # Prefect keeps its state in PostgreSQL: the registered deployments are rows of nextloc_prefect
    deployments = {r[0] for r in _sql(server, svc_module.PREFECT_DB, "SELECT name FROM deployment")}
    assert {"geolife", "geolife-dumps"} <= deployments
    with urllib.request.urlopen(f"{services.api_url}/health", timeout=30) as response:
        assert response.status == 200

    # MLflow's tracking store is nextloc_mlflow: an experiment made through the UI's server is a row there
    login = access.mlflow_login(auth.credentials(services, auth.PIPELINE))
    created = post_json(
        f"{services.mlflow_url}/api/2.0/mlflow/experiments/create", {"name": "pg-check"}, 30, login
    )
    assert created["experiment_id"]
    names = {r[0] for r in _sql(server, svc_module.MLFLOW_DB, "SELECT name FROM experiments")}
    assert "pg-check" in names
    # clients get the tracking server, never the database (or its password); artifacts go through its proxy
    client = json.loads(services.client_file.read_text())
    assert client["tracking_uri"] == services.mlflow_url
    assert password not in services.client_file.read_text()
    query = "SELECT experiment_id, artifact_location FROM experiments WHERE name = 'pg-check'"
    [(experiment_id, location)] = _sql(server, svc_module.MLFLOW_DB, query)
    assert location == f"mlflow-artifacts:/{experiment_id}"


def test_nextloc_run_reports_to_running_services(pg_services, monkeypatch):
    """With PREFECT_API_URL set, a command run by hand tracks into the services' MLflow store."""
    from commands import main as cli

    root, env = pg_services
    monkeypatch.chdir(root)
    monkeypatch.delenv("NEXTLOC_TRACKING_URI", raising=False)
    monkeypatch.delenv("NEXTLOC_MLFLOW_UI_URL", raising=False)
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{env['NEXTLOC_PREFECT_PORT']}/api")
    cli._report_to_services()
    uri = os.environ["NEXTLOC_TRACKING_URI"]
    assert uri == f"http://127.0.0.1:{env['NEXTLOC_MLFLOW_PORT']}"  # the tracking server, not its database
    assert os.environ["NEXTLOC_MLFLOW_UI_URL"] == f"http://127.0.0.1:{env['NEXTLOC_MLFLOW_PORT']}"
    from tracking import mlflow_runs

    assert mlflow_runs.default_tracking_uri() == uri

    # without PREFECT_API_URL: the embedded SQLite default
    monkeypatch.delenv("NEXTLOC_TRACKING_URI")
    monkeypatch.delenv("PREFECT_API_URL")
    cli._report_to_services()
    assert "NEXTLOC_TRACKING_URI" not in os.environ
    assert mlflow_runs.default_tracking_uri().startswith("sqlite:///")


def test_db_url_uses_an_existing_server(pg_services):
    """NEXTLOC_DB_URL: no local server is started or stopped; Prefect and MLflow use that server."""
    first_root, first_env = pg_services
    first = svc_module.Services(first_root, pg_port=int(first_env["NEXTLOC_PG_PORT"]), db_url=None)
    server = first.server_url()
    root = _project_dir()
    env = _env(root, NEXTLOC_DB_URL=server)
    # the same databases, so the same users: the first folder's credentials (docs/services.md)
    shutil.copytree(first.auth_folder, root / ".services" / "auth")
    try:
        started = _nextloc(root, env, "services", "start")
        assert started.returncode == 0, started.stdout + started.stderr
        assert not (root / ".services" / "pg").exists()
        status = _nextloc(root, env, "services", "status")
        assert "postgres        stopped" in status.stdout
        assert "prefect-server  running" in status.stdout
        # the tracking server keeps its store on that server: an experiment made through it is a row there
        client = json.loads((root / ".services" / "client.json").read_text())
        login = access.mlflow_login(auth.credentials(svc_module.Services(root, db_url=None), auth.PIPELINE))
        created = post_json(
            f"{client['tracking_uri']}/api/2.0/mlflow/experiments/create", {"name": "db-url-check"}, 30, login
        )
        assert created["experiment_id"]
        names = {r[0] for r in _sql(server, svc_module.MLFLOW_DB, "SELECT name FROM experiments")}
        assert "db-url-check" in names
    finally:
        stopped = _nextloc(root, env, "services", "stop")
        shutil.rmtree(root, ignore_errors=True)
    assert stopped.returncode == 0, stopped.stderr
    assert "postgres" not in stopped.stderr.split("stopped:")[-1]
    assert _sql(server, "postgres", "SELECT 1") == [(1,)]  # the existing server still runs


def test_db_url_must_name_a_server():
    with pytest.raises(ValueError, match="names a server, not a database"):
        svc_module.Services(Path("."), db_url="postgresql://u:p@127.0.0.1:5432/mydb")
    with pytest.raises(ValueError, match="postgresql://USER:PASSWORD@HOST:PORT"):
        svc_module.Services(Path("."), db_url="mysql://u:p@127.0.0.1:3306")
    with pytest.raises(ValueError, match="backend"):
        svc_module.Services(Path("."), backend="oracle")


def _make_sqlite_store(root: Path) -> dict:
    """A real SQLite MLflow store: a run with params, tags, a metric history and an artifact; a registered
    model with two versions, the second holding the ``champion`` alias."""
    script = r"""
import json, sys
from pathlib import Path
import mlflow
from mlflow import MlflowClient
root = Path(sys.argv[1])
uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
(root / "mlruns").mkdir(parents=True, exist_ok=True)
client = MlflowClient(tracking_uri=uri, registry_uri=uri)
exp = client.create_experiment("nextloc-geolife", artifact_location=(root / "mlruns" / "artifacts").as_uri())
run = client.create_run(exp, tags={"kind": "pipeline", "model": "markov"}, run_name="copy-me")
rid = run.info.run_id
client.log_param(rid, "train.max_epochs", "3")
for step, value in enumerate([1.5, 1.2, 0.9]):
    client.log_metric(rid, "val_loss", value, step=step, timestamp=1_700_000_000_000 + step)
(root / "note.txt").write_text("artifact on disk\n")
client.log_artifact(rid, str(root / "note.txt"))
client.set_terminated(rid, "FINISHED")
client.create_registered_model("nextloc-markov")
v1 = client.create_model_version("nextloc-markov", f"{run.info.artifact_uri}/model", run_id=rid)
v2 = client.create_model_version("nextloc-markov", f"{run.info.artifact_uri}/model", run_id=rid)
client.set_registered_model_alias("nextloc-markov", "champion", v2.version)
client.set_model_version_tag("nextloc-markov", v2.version, "decision", "promoted")
print(json.dumps({"run_id": rid, "experiment_id": exp, "uri": uri}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script, str(root)], capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_copy_store_sqlite_to_postgres(pg_services):
    from mlflow import MlflowClient

    first_root, first_env = pg_services
    services = svc_module.Services(first_root, pg_port=int(first_env["NEXTLOC_PG_PORT"]), db_url=None)
    root = _project_dir()
    try:
        made = _make_sqlite_store(root)
        svc_module.ensure_databases(services.server_url(), ("nextloc_copytest",))
        target = services.database_url("nextloc_copytest", "psycopg")
        env = _env(root)
        copied = _nextloc(root, env, "services", "copy-store", "--target", target)
        assert copied.returncode == 0, copied.stdout + copied.stderr
        counts = json.loads(copied.stdout)
        assert counts["runs"] == 1
        assert counts["metrics"] == 3
        assert counts["model_versions"] == 2
        assert counts["registered_model_aliases"] == 1
        assert services.password_file.read_text().strip() not in copied.stderr

        client = MlflowClient(tracking_uri=target, registry_uri=target)
        run = client.get_run(made["run_id"])  # the same run id
        assert run.info.status == "FINISHED"
        assert run.data.params == {"train.max_epochs": "3"}
        assert run.data.tags["kind"] == "pipeline"
        history = client.get_metric_history(made["run_id"], "val_loss")
        assert [(m.step, m.value, m.timestamp) for m in history] == [
            (0, 1.5, 1_700_000_000_000),
            (1, 1.2, 1_700_000_000_001),
            (2, 0.9, 1_700_000_000_002),
        ]
        champion = client.get_model_version_by_alias("nextloc-markov", "champion")
        assert str(champion.version) == "2"
        assert champion.run_id == made["run_id"]
        assert champion.tags == {"decision": "promoted"}
        # artifacts stay on disk, where the copied artifact location points
        local = client.download_artifacts(made["run_id"], "note.txt", str(root / "dl"))
        assert Path(local).read_text() == "artifact on disk\n"
        # the target keeps working: new experiments and runs get fresh ids
        new_exp = client.create_experiment("after-copy")
        assert new_exp not in {"0", made["experiment_id"]}
        client.create_run(new_exp)

        # a second copy into the now non-empty store is refused
        again = _nextloc(root, env, "services", "copy-store", "--target", target)
        assert again.returncode == 1
        assert "already holds runs" in again.stderr
    finally:
        import psycopg

        shutil.rmtree(root, ignore_errors=True)
        url = services.server_url() + "/postgres"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS nextloc_copytest WITH (FORCE)")


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user the server runs as that user")
def test_root_runs_postgres_as_an_unprivileged_user_and_says_when_it_cannot(tmp_path):
    """PostgreSQL refuses root: the server runs as ``postgres``; a folder closed to it is a clear error."""
    closed = tmp_path / "project"  # pytest's temporary root is mode 0700: closed to other users
    closed.mkdir()
    services = svc_module.Services(closed, pg_port=free_ports(1)[0], backend="postgres", db_url=None)
    with pytest.raises(RuntimeError, match="runs as user 'postgres' .* cannot reach"):
        svc_module.start_postgres(services, timeout_s=30)
    assert svc_module.running_pid(services, "postgres") is None
    assert not services.password_file.exists()
