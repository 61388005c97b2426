"""Where the services of one project folder keep their state, their ports and database URLs."""

from __future__ import annotations

import ipaddress
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
BACKENDS = ("postgres", "sqlite")
PREFECT_DB = "nextloc_prefect"
MLFLOW_DB = "nextloc_mlflow"
#: MLflow's basic-auth app keeps its users and permissions here (:mod:`services.auth`).
MLFLOW_AUTH_DB = "nextloc_mlflow_auth"
DB_USER = "nextloc"
#: Stop order: the worker first, PostgreSQL last (everything else talks to it).
SERVICE_NAMES = ("worker", "mlflow", "prefect-server", "postgres")


@dataclass(frozen=True)
class Services:
    """Where the services of one project folder keep their state, and their ports."""

    root: Path
    prefect_port: int = field(default_factory=lambda: int(os.environ.get("NEXTLOC_PREFECT_PORT", "4200")))
    mlflow_port: int = field(default_factory=lambda: int(os.environ.get("NEXTLOC_MLFLOW_PORT", "5000")))
    pg_port: int = field(default_factory=lambda: int(os.environ.get("NEXTLOC_PG_PORT", "5433")))
    backend: str = field(default_factory=lambda: os.environ.get("NEXTLOC_SERVICES_BACKEND", "postgres"))
    db_url: str | None = field(default_factory=lambda: os.environ.get("NEXTLOC_DB_URL") or None)
    #: Where the Prefect server and the MLflow tracking server listen and are reached: 127.0.0.1, or this
    #: machine's address on the team's network so that workers on other machines can join.
    host: str = field(default_factory=lambda: os.environ.get("NEXTLOC_SERVICES_HOST", HOST))
    #: The team's own server certificate (:mod:`services.tls`); given, the services speak HTTPS on loopback too.
    tls_cert: str | None = field(default_factory=lambda: os.environ.get("NEXTLOC_TLS_CERT") or None)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"services backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.db_url is not None:
            check_server_url(self.db_url)

    @property
    def folder(self) -> Path:
        """``.services/``: logs, pid files, the Prefect server's home."""
        return self.root / ".services"

    @property
    def tls(self) -> bool:
        """Whether the Prefect and MLflow servers speak HTTPS only (:mod:`services.tls`): on any address
        but loopback, or with the team's own certificate."""
        return not is_loopback(self.host) or self.tls_cert is not None

    @property
    def scheme(self) -> str:
        """``https`` or ``http``: :attr:`tls`."""
        return "https" if self.tls else "http"

    @property
    def api_url(self) -> str:
        """The Prefect API every client needs in ``PREFECT_API_URL``."""
        return f"{self.scheme}://{self.host}:{self.prefect_port}/api"

    @property
    def mlflow_url(self) -> str:
        """The MLflow tracking server: the UI, the tracking URI of every client, the artifact proxy."""
        return f"{self.scheme}://{self.host}:{self.mlflow_port}"

    @property
    def tls_folder(self) -> Path:
        """``.services/tls``: the generated CA and server certificate (:mod:`services.tls`), keys 0600."""
        return self.folder / "tls"

    @property
    def artifacts(self) -> Path:
        """``mlruns/artifacts``: where the tracking server's artifact proxy keeps the artifacts."""
        return self.root / "mlruns" / "artifacts"

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
    def auth_folder(self) -> Path:
        """``.services/auth``: the generated credentials (:mod:`services.auth`), each file mode 0600."""
        return self.folder / "auth"

    def credentials_file(self, name: str) -> Path:
        """``.services/auth/<name>.env``: one identity's credentials (``pipeline``, ``reader``) or the
        tracking server's own secrets (``mlflow-server``), as ``KEY=VALUE`` lines."""
        return self.auth_folder / f"{name}.env"

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


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_server_url(url: str) -> None:
    """Refuse a ``$NEXTLOC_DB_URL`` that is not ``postgresql://USER:PASSWORD@HOST:PORT`` (no database)."""
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
