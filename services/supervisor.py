"""Start, stop and report the services of one project folder, in their order."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import services.auth as auth
import services.tls as tls
from flows import OFFLINE_DEFAULTS
from flows.deployments import WORK_POOL
from services.layout import MLFLOW_AUTH_DB, MLFLOW_DB, PREFECT_DB, SERVICE_NAMES, Services
from services.postgres import ensure_databases, start_postgres
from services.processes import (
    launch,
    running_pid,
    terminate,
    wait_http,
    wait_worker,
    write_private,
)

#: Chosen by :func:`start` for each service, never inherited from the caller's environment.
_NOT_INHERITED = (
    "PREFECT_API_URL",
    "NEXTLOC_DB_URL",
    "NEXTLOC_TRACKING_URI",
    "MLFLOW_BACKEND_STORE_URI",
    "PREFECT_API_DATABASE_CONNECTION_URL",
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
    "PREFECT_SERVER_API_AUTH_STRING",
    "MLFLOW_AUTH_CONFIG_PATH",
    auth.PREFECT_AUTH,
    auth.MLFLOW_USERNAME,
    auth.MLFLOW_PASSWORD,
)


def start(services: Services, timeout_s: float = 180.0, worker: bool = True) -> None:
    """Start whatever is not running yet and wait until all answer; ``worker=False`` starts no worker here
    (flow runs then wait for ``nextloc worker`` on other machines).

    Raises:
        RuntimeError: if a service exits or does not answer in ``timeout_s``; its log is named. Also when
            PostgreSQL is wanted but its binaries or an unprivileged user to run them are missing.
    """
    services.folder.mkdir(parents=True, exist_ok=True)
    services.artifacts.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in {**os.environ, **OFFLINE_DEFAULTS}.items() if k not in _NOT_INHERITED}
    certificate = tls.server_files(services) if services.tls else None
    auth.ensure_credentials(services)
    # the UI asks the API at PREFECT_UI_API_URL (default 127.0.0.1:4200): on another port it must be told
    server_env = {
        **base,
        "PREFECT_HOME": str(services.folder / "prefect"),
        "PREFECT_UI_API_URL": services.api_url,
        **auth.prefect_server_env(services),
    }
    if services.backend == "postgres":
        if services.db_url is None:
            start_postgres(services, timeout_s)
        ensure_databases(services.server_url(), (PREFECT_DB, MLFLOW_DB, MLFLOW_AUTH_DB), timeout_s)
        server_env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = services.database_url(PREFECT_DB, "asyncpg")
        store_uri = services.database_url(MLFLOW_DB, "psycopg")
        auth_uri = services.database_url(MLFLOW_AUTH_DB, "psycopg")
    else:
        store_uri = f"sqlite:///{services.root.resolve() / 'mlruns' / 'mlflow.db'}"
        auth_uri = f"sqlite:///{services.auth_folder.resolve() / 'basic_auth.db'}"
    # clients get the tracking server's URL, never the store's (which may hold the password)
    client = {
        "tracking_uri": services.mlflow_url,
        "api_url": services.api_url,
        "mlflow_url": services.mlflow_url,
    }
    write_private(services.client_file, json.dumps(client, indent=1) + "\n")
    _launch_prefect_server(services, server_env, certificate)
    _launch_mlflow(services, {**base, **auth.mlflow_server_env(services, auth_uri)}, store_uri, certificate)
    context = auth.client_context(services)
    wait_http(services, "prefect-server", f"{services.api_url}/health", timeout_s, context)
    wait_http(services, "mlflow", f"{services.mlflow_url}/health", timeout_s, context)
    auth.provision_mlflow_users(services)
    _register_deployments(services, base, timeout_s)
    if worker:
        nextloc = str(Path(sys.executable).parent / "nextloc")
        launch(services, "worker", [nextloc, "worker"], _run_env(services, base))
        pipeline = auth.credentials(services, auth.PIPELINE)
        headers = auth.authorization(pipeline[auth.PREFECT_AUTH])
        wait_worker(services, WORK_POOL, timeout_s, headers, context)


def _launch_prefect_server(
    services: Services, env: dict[str, str], certificate: tuple[Path, Path] | None
) -> None:
    """``prefect server start``; over TLS (``certificate``: its file and key) the same app, API, UI and
    background services, under uvicorn with the certificate, which ``prefect server start`` cannot give."""
    where = ["--host", services.host, "--port", str(services.prefect_port)]
    if certificate is None:
        launch(
            services,
            "prefect-server",
            [str(Path(sys.executable).parent / "prefect"), "server", "start", *where],
            env,
        )
        return
    cert, key = (str(p.resolve()) for p in certificate)
    app = [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app", *where]
    tls_options = ["--ssl-certfile", cert, "--ssl-keyfile", key, "--timeout-keep-alive", "5"]
    # as `prefect server start` runs it: the last app of the process, its background services in it
    launch(services, "prefect-server", app + tls_options, {**env, "PREFECT__SERVER_FINAL": "1"})


#: The tracking server's environment: no job runner. MLflow's server otherwise starts a job runner and
#: seven huey consumers (its GenAI jobs, which nextloc never submits), each a process with MLflow loaded.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def _launch_mlflow(
    services: Services, env: dict[str, str], store_uri: str, certificate: tuple[Path, Path] | None
) -> None:
    """``mlflow server`` over ``store_uri`` (in its environment, not argv: it may hold the password), with
    its artifact proxy over ``mlruns/artifacts``: new experiments store artifacts at ``mlflow-artifacts:/``,
    which clients read and write through the server. MLflow's basic-auth app asks every request but
    ``/health`` and static files for a user (:mod:`services.auth`); only the services' own host names are
    answered (``--allowed-hosts``). Over TLS its uvicorn serves the certificate (``certificate``)."""
    mlflow = str(Path(sys.executable).parent / "mlflow")
    tls_options = []
    if certificate is not None:
        cert, key = (shlex.quote(str(p.resolve())) for p in certificate)
        tls_options = ["--uvicorn-opts", f"--ssl-certfile {cert} --ssl-keyfile {key}"]
    launch(
        services,
        "mlflow",
        [mlflow, "server", "--serve-artifacts", "--artifacts-destination", str(services.artifacts.resolve())]
        + ["--host", services.host, "--port", str(services.mlflow_port), "--workers", "1"]
        + ["--app-name", "basic-auth", "--allowed-hosts", auth.allowed_hosts(services), *tls_options],
        {**env, **MLFLOW_SERVER_ENV, "MLFLOW_BACKEND_STORE_URI": store_uri},
    )


def _run_env(services: Services, base: dict[str, str]) -> dict[str, str]:
    """What a client of the services needs (the registration and the services' worker): their Prefect API,
    the MLflow tracking server, the pipeline's credentials, a Prefect home of this project folder."""
    return {
        **base,
        **auth.credentials(services, auth.PIPELINE),  # with the CA's variables over TLS
        "PREFECT_API_URL": services.api_url,
        "NEXTLOC_TRACKING_URI": services.mlflow_url,
        "NEXTLOC_MLFLOW_UI_URL": services.mlflow_url,
        "PREFECT_HOME": os.environ.get("PREFECT_HOME", str(services.root / ".prefect")),
    }


def _register_deployments(services: Services, base: dict[str, str], timeout_s: float) -> None:
    """``python -m flows.deployments``: the work pool, the registry lock's limit and the deployments, once."""
    with open(services.log_file("register"), "ab") as out:
        done = subprocess.run(
            [sys.executable, "-m", "flows.deployments"],
            cwd=services.root,
            env=_run_env(services, base),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
        )
    if done.returncode != 0:
        raise RuntimeError(f"registering the deployments failed; see {services.log_file('register')}")


def client_settings(root: Path) -> dict[str, str] | None:
    """While the services of ``root`` run: ``tracking_uri`` (their MLflow store), ``api_url``, ``mlflow_url``."""
    services = Services(root, backend="postgres", db_url=None)  # only its paths are used
    if running_pid(services, "mlflow") is None:
        return None
    try:
        return json.loads(services.client_file.read_text())
    except (FileNotFoundError, ValueError):
        return None


def stop(services: Services, timeout_s: float = 30.0) -> list[str]:
    """Stop the worker, MLflow, the Prefect server, then PostgreSQL; returns what was stopped.

    PostgreSQL gets a fast shutdown (SIGINT to the postmaster alone, which stops its own children); an
    external server (``$NEXTLOC_DB_URL``) is never touched.
    """
    stopped = []
    signals = {"worker": signal.SIGINT, "mlflow": signal.SIGTERM, "prefect-server": signal.SIGTERM}
    for name in SERVICE_NAMES:
        pid = running_pid(services, name)
        if pid is not None:
            terminate(pid, signals.get(name, signal.SIGINT), timeout_s, group=name != "postgres")
            stopped.append(name)
        services.pid_file(name).unlink(missing_ok=True)
    services.client_file.unlink(missing_ok=True)
    return stopped


def status(services: Services) -> dict[str, int | None]:
    """``{service: pid or None}``."""
    return {name: running_pid(services, name) for name in reversed(SERVICE_NAMES)}
