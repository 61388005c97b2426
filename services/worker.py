"""``nextloc worker``: a Prefect worker of the ``nextloc`` work pool, running flow runs in this project folder.

Any machine with nextloc installed, its own project folder and its data joins the team's services with::

    nextloc worker --api https://SERVICES_HOST:4200/api

It runs ``prefect worker start --pool nextloc --type process`` with ``NEXTLOC_PROJECT_DIR`` set to the
current folder: the deployments' pull step (:data:`flows.deployments.PROJECT_DIR_STEP`) starts every flow run
there, so relative paths (``data/raw/geolife``, ``data/geolife``) are this machine's. The flow runs track
into the MLflow tracking server named by the deployment (``https://`` on a network address, verified
against the CA handed over with the credentials: :mod:`services.tls`; artifacts through its proxy), so
the worker needs no database password and no shared folder. Runs go to whichever worker of the pool is free;
``--limit`` bounds this worker's runs at once (``$NEXTLOC_SERVE_LIMIT``, default 1). ``nextloc services
start`` starts one worker in the services' own folder.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from pathlib import Path

from flows import OFFLINE_DEFAULTS

#: Seconds between a worker's polls of the pool (Prefect's default is 15).
POLL_SECONDS = "5"


def worker_name(project: Path) -> str:
    """``nextloc-<host>-<folder>-<hash>``: one name per machine and project folder."""
    digest = hashlib.sha256(str(project.resolve()).encode()).hexdigest()[:6]
    return f"nextloc-{socket.gethostname()}-{project.resolve().name}-{digest}"


def worker_command(pool: str, limit: int, name: str) -> list[str]:
    """The ``prefect worker start`` command line of a process worker of ``pool``."""
    prefect = str(Path(sys.executable).parent / "prefect")
    return [prefect, "worker", "start", "--pool", pool, "--type", "process"] + [
        *("--limit", str(limit), "--name", name)
    ]


def worker_env(project: Path, api_url: str) -> dict[str, str]:
    """The worker's environment: this process's, the services' API, this project folder, offline defaults."""
    env = {**os.environ, **OFFLINE_DEFAULTS, "PREFECT_API_URL": api_url}
    env["NEXTLOC_PROJECT_DIR"] = str(project.resolve())
    env.setdefault("PREFECT_WORKER_QUERY_SECONDS", POLL_SECONDS)
    return env


def run_worker(project: Path, api_url: str, pool: str, limit: int) -> None:
    """Replace this process with the worker (it stops on SIGINT or SIGTERM)."""
    cmd = worker_command(pool, limit, worker_name(project))
    os.chdir(project)
    os.execve(cmd[0], cmd, worker_env(project, api_url))
