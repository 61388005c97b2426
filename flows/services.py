"""Run nextloc as a service on this machine: a Prefect server, the MLflow UI and the deployment server.

``nextloc services start`` (``make services``) starts, in the background, each with its log and pid file
under ``.services/``:

* a PostgreSQL server (Debian's binaries) on 127.0.0.1:5433, data directory ``.services/pg/data``, a
  generated password in ``.services/pg/password`` (mode 0600), no Unix socket; it holds two databases,
  ``nextloc_prefect`` and ``nextloc_mlflow``. ``$NEXTLOC_DB_URL`` (``postgresql://USER:PASSWORD@HOST:PORT``)
  uses an existing server instead (the two databases are created there if missing);
* ``prefect server start`` on 127.0.0.1:4200 over ``nextloc_prefect`` (asyncpg; its own ``PREFECT_HOME``
  in ``.services/prefect``);
* ``mlflow server`` on 127.0.0.1:5000, tracking and registry store ``nextloc_mlflow`` (psycopg), artifacts
  on disk in ``mlruns/artifacts``;
* ``python -m flows.serve``: registers the deployments and runs their flow runs, tracking into the same
  MLflow store (``$NEXTLOC_TRACKING_URI``).

``backend="sqlite"`` (``nextloc services start --backend sqlite``) keeps the earlier layout: Prefect on
SQLite in ``.services/prefect`` and MLflow over ``mlruns/mlflow.db``. Secrets travel in environment
variables only, never on a command line. The store the services track into is written to
``.services/client.json`` (0600), which ``nextloc run`` reads when ``PREFECT_API_URL`` is set, so a run
started by hand lands in the same place as the deployment runs.

It waits until each answers, then says how to use them. ``nextloc services stop`` stops them in the safe
order: the deployment server first (it talks to the Prefect server while it shuts down), then MLflow,
Prefect, and PostgreSQL last. Ports: ``$NEXTLOC_PREFECT_PORT``, ``$NEXTLOC_MLFLOW_PORT``,
``$NEXTLOC_PG_PORT``. Everything stays on 127.0.0.1, offline.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import secrets
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("nextloc.cli")

HOST = "127.0.0.1"
BACKENDS = ("postgres", "sqlite")
PREFECT_DB = "nextloc_prefect"
MLFLOW_DB = "nextloc_mlflow"
DB_USER = "nextloc"
#: Stop order: the deployment server first, PostgreSQL last (everything else talks to it).
SERVICE_NAMES = ("serve", "mlflow", "prefect-server", "postgres")


@dataclass(frozen=True)
class Services:
    """Where the services of one project folder keep their state, and their ports."""

    root: Path
    prefect_port: int = field(default_factory=lambda: int(os.environ.get("NEXTLOC_PREFECT_PORT", "4200")))
    mlflow_port: int = field(default_factory=lambda: int(os.environ.get("NEXTLOC_MLFLOW_PORT", "5000")))
    pg_port: int = field(default_factory=lambda: int(os.environ.get("NEXTLOC_PG_PORT", "5433")))
    backend: str = field(default_factory=lambda: os.environ.get("NEXTLOC_SERVICES_BACKEND", "postgres"))
    db_url: str | None = field(default_factory=lambda: os.environ.get("NEXTLOC_DB_URL") or None)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"services backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.db_url is not None:
            _check_server_url(self.db_url)

    @property
    def folder(self) -> Path:
        """``.services/``: logs, pid files, the Prefect server's home."""
        return self.root / ".services"

    @property
    def api_url(self) -> str:
        """The Prefect API every client needs in ``PREFECT_API_URL``."""
        return f"http://{HOST}:{self.prefect_port}/api"

    @property
    def mlflow_url(self) -> str:
        """The MLflow UI."""
        return f"http://{HOST}:{self.mlflow_port}"

    def pid_file(self, name: str) -> Path:
        """Pid file of a service."""
        return self.folder / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        """Log of a service."""
        return self.folder / f"{name}.log"

    @property
    def pg_folder(self) -> Path:
        """``.services/pg``: the local PostgreSQL server's data directory and password file."""
        return self.folder / "pg"

    @property
    def password_file(self) -> Path:
        """The generated password of the local server's user ``nextloc`` (mode 0600)."""
        return self.pg_folder / "password"

    @property
    def client_file(self) -> Path:
        """Where ``start`` records, for clients, the MLflow store the services track into and their URLs
        (JSON, mode 0600: the store URL may hold the password)."""
        return self.folder / "client.json"

    def server_url(self) -> str:
        """``postgresql://USER:PASSWORD@HOST:PORT`` of the PostgreSQL server in use."""
        if self.db_url is not None:
            return self.db_url.rstrip("/")
        password = self.password_file.read_text().strip()
        return f"postgresql://{DB_USER}:{urllib.parse.quote(password, safe='')}@{HOST}:{self.pg_port}"

    def database_url(self, database: str, driver: str) -> str:
        """SQLAlchemy URL of one database on the server, e.g. ``postgresql+psycopg://.../nextloc_mlflow``."""
        parts = urllib.parse.urlsplit(self.server_url())
        return urllib.parse.urlunsplit(
            (f"postgresql+{driver}", parts.netloc, f"/{database}", parts.query, "")
        )


def start(services: Services, timeout_s: float = 180.0) -> None:
    """Start whatever is not running yet and wait until all answer.

    Raises:
        RuntimeError: if a service exits or does not answer in ``timeout_s``; its log is named. Also when
            PostgreSQL is wanted but its binaries or an unprivileged user to run them are missing.
    """
    services.folder.mkdir(parents=True, exist_ok=True)
    artifacts = (services.root / "mlruns" / "artifacts").resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    base = {
        **os.environ,
        "DO_NOT_TRACK": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    for key in (
        "PREFECT_API_URL",
        "NEXTLOC_DB_URL",
        "NEXTLOC_TRACKING_URI",
        "MLFLOW_BACKEND_STORE_URI",
        "PREFECT_API_DATABASE_CONNECTION_URL",
        "PREFECT_SERVER_DATABASE_CONNECTION_URL",
    ):  # chosen here, not inherited
        base.pop(key, None)
    bin_dir = Path(sys.executable).parent
    # the UI asks the API at PREFECT_UI_API_URL (default 127.0.0.1:4200): on another port it must be told
    server_env = {
        **base,
        "PREFECT_HOME": str(services.folder / "prefect"),
        "PREFECT_UI_API_URL": services.api_url,
    }
    if services.backend == "postgres":
        if services.db_url is None:
            start_postgres(services, timeout_s)
        ensure_databases(services.server_url(), (PREFECT_DB, MLFLOW_DB), timeout_s)
        server_env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = services.database_url(PREFECT_DB, "asyncpg")
        tracking_uri = services.database_url(MLFLOW_DB, "psycopg")
    else:
        tracking_uri = f"sqlite:///{services.root.resolve() / 'mlruns' / 'mlflow.db'}"
    client = {"tracking_uri": tracking_uri, "api_url": services.api_url, "mlflow_url": services.mlflow_url}
    _write_private(services.client_file, json.dumps(client, indent=1) + "\n")
    _launch(
        services,
        "prefect-server",
        [str(bin_dir / "prefect"), "server", "start", "--host", HOST, "--port", str(services.prefect_port)],
        server_env,
    )
    _launch(
        services,
        "mlflow",
        [
            str(bin_dir / "mlflow"),
            "server",
            "--default-artifact-root",
            str(artifacts),
            "--host",
            HOST,
            "--port",
            str(services.mlflow_port),
            "--workers",
            "1",
        ],
        {**base, "MLFLOW_BACKEND_STORE_URI": tracking_uri},  # env, not argv: it may hold the password
    )
    _wait_http(services, "prefect-server", f"{services.api_url}/health", timeout_s)
    serve_env = {
        **base,
        "PREFECT_API_URL": services.api_url,
        "PREFECT_RUNNER_POLL_FREQUENCY": os.environ.get("PREFECT_RUNNER_POLL_FREQUENCY", "2"),
        "NEXTLOC_MLFLOW_UI_URL": services.mlflow_url,
        "NEXTLOC_TRACKING_URI": tracking_uri,
        "PREFECT_HOME": os.environ.get("PREFECT_HOME", str(services.root / ".prefect")),
    }
    _launch(services, "serve", [sys.executable, "-m", "flows.serve"], serve_env)
    _wait_http(services, "mlflow", f"{services.mlflow_url}/health", timeout_s)
    _wait_deployments(services, timeout_s)


def client_settings(root: Path) -> dict[str, str] | None:
    """While the services of ``root`` run: ``tracking_uri`` (their MLflow store), ``api_url``, ``mlflow_url``."""
    services = Services(root, backend="postgres", db_url=None)  # only its paths are used
    if running_pid(services, "mlflow") is None:
        return None
    try:
        return json.loads(services.client_file.read_text())
    except (FileNotFoundError, ValueError):
        return None


def postgres_bin_dir() -> Path:
    """Where the PostgreSQL server binaries are: ``$NEXTLOC_PG_BIN`` or Debian's newest ``/usr/lib/postgresql/N/bin``.

    Raises:
        RuntimeError: if there is none (``make system-deps`` installs Debian's ``postgresql``).
    """
    candidates = [Path(os.environ["NEXTLOC_PG_BIN"])] if os.environ.get("NEXTLOC_PG_BIN") else []
    candidates += sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for candidate in candidates:
        if (candidate / "postgres").is_file() and (candidate / "initdb").is_file():
            return candidate
    raise RuntimeError(
        "PostgreSQL server binaries not found (looked in $NEXTLOC_PG_BIN and /usr/lib/postgresql/*/bin): "
        "run `make system-deps` (Debian's postgresql), set NEXTLOC_DB_URL to an existing server, "
        "or use `nextloc services start --backend sqlite`"
    )


def start_postgres(services: Services, timeout_s: float = 120.0) -> None:
    """Start the local PostgreSQL server of ``services`` (initialising ``.services/pg`` the first time).

    PostgreSQL refuses to run as root: as root the server runs as the unprivileged system user
    ``$NEXTLOC_PG_USER`` (default ``postgres``, created by Debian's package), which owns the data directory.
    The server listens on 127.0.0.1 only, with password authentication (scram-sha-256), and no Unix socket.

    Raises:
        RuntimeError: missing binaries or user, a data directory that user cannot reach, or a server that
            does not accept connections within ``timeout_s``.
    """
    if running_pid(services, "postgres") is not None:
        log.info("postgres already running (pid %s)", running_pid(services, "postgres"))
        return
    bin_dir = postgres_bin_dir()
    user = _postgres_user()
    data = services.pg_folder / "data"
    services.pg_folder.mkdir(parents=True, exist_ok=True)
    services.pg_folder.chmod(0o755)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
    run_as: dict = {} if user is None else {"user": user[0], "group": user[1], "extra_groups": []}
    if not (data / "PG_VERSION").is_file():
        if data.exists() and any(data.iterdir()):
            raise RuntimeError(f"{data} is not empty and holds no PostgreSQL cluster; move it away")
        data.mkdir(mode=0o700, exist_ok=True)
        if user is not None:
            os.chown(data, user[0], user[1])
        _check_reachable(data, user)
        password = secrets.token_urlsafe(24)
        _write_private(services.password_file, password + "\n")
        pwfile = services.pg_folder / ".initdb-password"
        _write_private(pwfile, password + "\n")
        try:
            if user is not None:
                os.chown(pwfile, user[0], user[1])
            init = subprocess.run(
                [str(bin_dir / "initdb"), "-D", str(data.resolve()), "-U", DB_USER, "--auth=scram-sha-256"]
                + [f"--pwfile={pwfile.resolve()}", "-E", "UTF8", "--no-locale", "--no-instructions"],
                env=env,
                capture_output=True,
                text=True,
                **run_as,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed for {data}: {init.stderr.strip()[-2000:]}")
        log.info("initialised PostgreSQL cluster %s (user %s)", data, DB_USER)
    elif not services.password_file.is_file():
        raise RuntimeError(
            f"{services.password_file} is missing for the existing cluster {data}; "
            f"remove {services.pg_folder} to start afresh"
        )
    _check_reachable(data, user)
    _launch(
        services,
        "postgres",
        [str(bin_dir / "postgres"), "-D", str(data.resolve()), "-p", str(services.pg_port)]
        + ["-c", f"listen_addresses={HOST}", "-c", "unix_socket_directories=", "-c", "max_connections=200"],
        env,
        **run_as,
    )
    _wait_postgres(services, timeout_s)


def ensure_databases(server_url: str, names: tuple[str, ...], timeout_s: float = 60.0) -> None:
    """Create the databases ``names`` on the server if missing (the user needs CREATEDB for that)."""
    import psycopg
    from psycopg import sql

    with _connect(server_url, timeout_s) as conn:
        for name in names:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                try:
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                except psycopg.errors.DuplicateDatabase:  # created concurrently
                    continue
                log.info("created database %s", name)


def _connect(server_url: str, timeout_s: float, database: str = "postgres"):
    """An autocommit psycopg connection to ``database``, retried until ``timeout_s`` (a server starting up)."""
    import psycopg

    parts = urllib.parse.urlsplit(server_url)
    url = urllib.parse.urlunsplit(("postgresql", parts.netloc, f"/{database}", parts.query, ""))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return psycopg.connect(url, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as err:
            if time.monotonic() > deadline or "password authentication failed" in str(err):
                raise RuntimeError(f"PostgreSQL at {parts.hostname}:{parts.port} refused: {err}") from err
            time.sleep(0.5)


def _wait_postgres(services: Services, timeout_s: float) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running_pid(services, "postgres") is None:
            raise RuntimeError(f"postgres exited; see {services.log_file('postgres')}")
        with contextlib.suppress(psycopg.OperationalError):
            psycopg.connect(
                urllib.parse.urlunsplit(
                    ("postgresql", urllib.parse.urlsplit(services.server_url()).netloc, "/postgres", "", "")
                ),
                connect_timeout=5,
            ).close()
            log.info("postgres is up: %s:%d", HOST, services.pg_port)
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"postgres did not accept connections within {timeout_s:.0f} s; see {services.log_file('postgres')}"
    )


def _postgres_user() -> tuple[int, int] | None:
    """``(uid, gid)`` to run the server as when this process is root; None otherwise."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("NEXTLOC_PG_USER", "postgres")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise RuntimeError(
            f"PostgreSQL refuses to run as root and there is no user {name!r} to run it as: install Debian's "
            "postgresql (make system-deps; it creates the user), set NEXTLOC_PG_USER, or set NEXTLOC_DB_URL"
        ) from None
    if entry.pw_uid == 0:
        raise RuntimeError(f"NEXTLOC_PG_USER={name} is root; PostgreSQL needs an unprivileged user")
    return entry.pw_uid, entry.pw_gid


def _check_reachable(data: Path, user: tuple[int, int] | None) -> None:
    """Fail clearly if the server's user cannot write its data directory (a parent folder closed to it)."""
    if user is None:
        return
    probe = subprocess.run(
        ["/usr/bin/test", "-w", str(data.resolve()), "-a", "-x", str(data.resolve())],
        user=user[0],
        group=user[1],
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin"},
    )
    if probe.returncode != 0:
        name = pwd.getpwuid(user[0]).pw_name
        raise RuntimeError(
            f"PostgreSQL runs as user {name!r} (it refuses root) and cannot reach {data.resolve()}: every "
            f"folder above it must be searchable by that user (chmod o+x), or set NEXTLOC_DB_URL"
        )


def _check_server_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        raise ValueError(
            f"NEXTLOC_DB_URL must look like postgresql://USER:PASSWORD@HOST:PORT, got scheme {parts.scheme!r}"
        )
    if parts.path.strip("/"):
        raise ValueError(
            f"NEXTLOC_DB_URL names a server, not a database (drop '{parts.path}'): nextloc keeps Prefect and "
            f"MLflow in the databases {PREFECT_DB} and {MLFLOW_DB} on it"
        )


def _write_private(path: Path, text: str) -> None:
    """Write a secret atomically with mode 0600 (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def stop(services: Services, timeout_s: float = 30.0) -> list[str]:
    """Stop the deployment server, MLflow, the Prefect server, then PostgreSQL; returns what was stopped.

    PostgreSQL gets a fast shutdown (SIGINT to the postmaster alone, which stops its own children); an
    external server (``$NEXTLOC_DB_URL``) is never touched.
    """
    stopped = []
    signals = {"serve": signal.SIGINT, "mlflow": signal.SIGTERM, "prefect-server": signal.SIGTERM}
    for name in SERVICE_NAMES:
        pid = running_pid(services, name)
        if pid is not None:
            _terminate(pid, signals.get(name, signal.SIGINT), timeout_s, group=name != "postgres")
            stopped.append(name)
        services.pid_file(name).unlink(missing_ok=True)
    services.client_file.unlink(missing_ok=True)
    return stopped


def status(services: Services) -> dict[str, int | None]:
    """``{service: pid or None}``."""
    return {name: running_pid(services, name) for name in ("postgres", "prefect-server", "mlflow", "serve")}


def running_pid(services: Services, name: str) -> int | None:
    """The pid of a running service (from its pid file), or None."""
    try:
        pid = int(services.pid_file(name).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def _launch(services: Services, name: str, cmd: list[str], env: dict[str, str], **run_as) -> None:
    """Start ``cmd`` in its own session with its log and pid file; ``run_as``: Popen's user/group options."""
    if running_pid(services, name) is not None:
        log.info("%s already running (pid %s)", name, running_pid(services, name))
        return
    with open(services.log_file(name), "ab") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=services.root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **run_as,
        )
    services.pid_file(name).write_text(f"{proc.pid}\n")
    log.info("started %s (pid %d), log %s", name, proc.pid, services.log_file(name))


def _wait_http(services: Services, name: str, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running_pid(services, name) is None:
            raise RuntimeError(f"{name} exited; see {services.log_file(name)}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as response:
            if response.status == 200:
                log.info("%s is up: %s", name, url)
                return
        time.sleep(0.5)
    raise RuntimeError(
        f"{name} did not answer at {url} within {timeout_s:.0f} s; see {services.log_file(name)}"
    )


def _wait_deployments(services: Services, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    wanted = {"preprocess-train/geolife", "retrain/geolife-dumps"}
    while time.monotonic() < deadline:
        if running_pid(services, "serve") is None:
            raise RuntimeError(f"the deployment server exited; see {services.log_file('serve')}")
        with contextlib.suppress(OSError, ValueError):
            flows = {f["id"]: f["name"] for f in _post_json(f"{services.api_url}/flows/filter")}
            deployments = _post_json(f"{services.api_url}/deployments/filter")
            if wanted <= {f"{flows.get(d['flow_id'], '?')}/{d['name']}" for d in deployments}:
                log.info("deployments served: %s", ", ".join(sorted(wanted)))
                return
        time.sleep(1.0)
    raise RuntimeError(
        f"deployments not registered within {timeout_s:.0f} s; see {services.log_file('serve')}"
    )


def _post_json(url: str) -> list[dict]:
    """POST ``{}`` to a Prefect API filter endpoint; the decoded answer."""
    request = urllib.request.Request(
        url, data=b"{}", headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def _terminate(pid: int, sig: signal.Signals, timeout_s: float, group: bool = True) -> None:
    """Signal a service's process group (or the process alone); SIGKILL the group if still there after ``timeout_s``."""
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if group else os.kill)(pid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    else:
        log.warning("pid %d did not stop in %.0f s; killing it", pid, timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
