"""Supervise nextloc's services on this machine: PostgreSQL, a Prefect server, the MLflow tracking server,
the work pool and a worker.

``nextloc services start`` (``make services``) starts, in the background, each with its log and pid file
under ``.services/``:

* a PostgreSQL server (Debian's binaries) on 127.0.0.1:5433, data directory ``.services/pg/data``, a
  generated password in ``.services/pg/password`` (mode 0600), no Unix socket; it holds two databases,
  ``nextloc_prefect`` and ``nextloc_mlflow``. ``$NEXTLOC_DB_URL`` (``postgresql://USER:PASSWORD@HOST:PORT``)
  uses an existing server instead (the two databases are created there if missing);
* ``prefect server start`` on 127.0.0.1:4200 over ``nextloc_prefect`` (asyncpg; its own ``PREFECT_HOME``
  in ``.services/prefect``);
* ``mlflow server`` on 127.0.0.1:5000, tracking and registry store ``nextloc_mlflow`` (psycopg), with its
  artifact proxy over ``mlruns/artifacts``: clients use ``http://`` and ``mlflow-artifacts:``, never the
  database;
* ``python -m flows.deployments`` once: the process work pool ``nextloc``, the deployments in it, and the limit
  behind :func:`runtime.locking.registry_lock`;
* ``nextloc worker`` (:mod:`services.worker`): a worker of the pool in this folder (``--no-worker``: none);
  other machines join with the same command.

``backend="sqlite"`` (``nextloc services start --backend sqlite``) puts Prefect on SQLite in
``.services/prefect`` and MLflow over ``mlruns/mlflow.db``. Secrets travel in environment
variables only, never on a command line. The tracking server's URL is written to ``.services/client.json``
(0600), which ``nextloc run`` reads when ``PREFECT_API_URL`` is set, so a run started by hand lands in
the same place as the deployment runs. ``$NEXTLOC_SERVICES_HOST`` makes Prefect and MLflow listen on an
address other machines reach (PostgreSQL stays on 127.0.0.1), over HTTPS only (:mod:`services.tls`).

It waits until each answers, then says how to use them. ``nextloc services stop`` stops them in the safe
order: the worker first (it talks to the Prefect server while it shuts down), then MLflow, Prefect, and
PostgreSQL last. Ports: ``$NEXTLOC_PREFECT_PORT``, ``$NEXTLOC_MLFLOW_PORT``,
``$NEXTLOC_PG_PORT``. By default everything stays on 127.0.0.1, offline.

Modules: :mod:`services.layout` (the folder, ports and database URLs), :mod:`services.processes` (start,
find, wait for and stop one process), :mod:`services.postgres` (the local PostgreSQL server and the
databases), :mod:`services.supervisor` (all of them, in order), :mod:`services.worker` (``nextloc
worker``), :mod:`services.model_server` (``nextloc
serve``: MLflow's scoring server for one registered model, in the foreground). This package is not a flow and is no part
of the ``nextloc`` library: it starts Prefect's and MLflow's servers as processes.
"""

from services.auth import credentials_text
from services.layout import MLFLOW_DB, PREFECT_DB, SERVICE_NAMES, Services
from services.postgres import ensure_databases, postgres_bin_dir, start_postgres
from services.processes import running_pid
from services.supervisor import client_settings, start, status, stop

__all__ = [
    "MLFLOW_DB",
    "PREFECT_DB",
    "SERVICE_NAMES",
    "Services",
    "client_settings",
    "credentials_text",
    "ensure_databases",
    "postgres_bin_dir",
    "running_pid",
    "start",
    "start_postgres",
    "status",
    "stop",
]
