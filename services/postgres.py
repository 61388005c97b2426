"""The local PostgreSQL server the services keep Prefect's and MLflow's state in (Debian's binaries), and
the two databases on it (or on ``$NEXTLOC_DB_URL``'s server)."""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import secrets
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

from services.layout import DB_USER, HOST, Services
from services.processes import launch, running_pid, write_private

log = logging.getLogger("nextloc.cli")


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
        write_private(services.password_file, password + "\n")
        pwfile = services.pg_folder / ".initdb-password"
        write_private(pwfile, password + "\n")
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
    launch(
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


def _connect(server_url: str, timeout_s: float, database: str = "postgres") -> Any:
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


def _postmaster_ready(data: Path) -> bool:
    """Whether the server in ``data`` says it is ready (line 8 of ``postmaster.pid``, what ``pg_ctl -w`` reads).

    Asking before that, a connection is refused with a logged ``FATAL:  the database system is starting up``.
    """
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
    except OSError:  # not written yet
        return False
    return len(lines) >= 8 and lines[7].strip() == "ready"


def _wait_postgres(services: Services, timeout_s: float) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running_pid(services, "postgres") is None:
            raise RuntimeError(f"postgres exited; see {services.log_file('postgres')}")
        if not _postmaster_ready(services.pg_folder / "data"):
            time.sleep(0.1)
            continue
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
