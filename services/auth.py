"""Who may use the team services: the credentials ``make services`` generates, the servers' side of them,
and the clients' (``nextloc worker``, ``run``, ``predict``, ``serve`` and the deployments' runs).

``nextloc services start`` always turns authentication on, loopback included: on a shared machine every
local user reaches 127.0.0.1, and one code path is the one the tests exercise. The embedded defaults
(``make run``, ``nextloc run`` with the project's local Prefect API and the SQLite MLflow store) start no
server that listens for others and need nothing configured. Identities:

* ``pipeline``: Prefect's API auth string (Prefect OSS has one identity: whoever holds it may do
  everything there) and the MLflow user ``nextloc-pipeline``, which holds ``MANAGE`` on every experiment
  and registered model (wildcard grants; no MLflow admin, so it cannot manage users);
* ``reader``: the MLflow user ``nextloc-reader``, MLflow's ``default_permission`` ``READ`` on everything;
  no Prefect credential (a Prefect credential could start runs);
* the MLflow admin ``nextloc-admin`` manages the two users at start; its password never leaves this machine.

Files, each mode 0600 in ``.services/auth/`` (:attr:`services.layout.Services.auth_folder`):
``pipeline.env`` and ``reader.env`` (``KEY=VALUE`` lines in the variables the clients read:
``PREFECT_API_AUTH_STRING``, ``MLFLOW_TRACKING_USERNAME``, ``MLFLOW_TRACKING_PASSWORD``; what ``nextloc
services credentials`` prints), ``mlflow-server.env`` (the admin's password and the Flask secret key of the
tracking server), ``basic_auth.ini`` (MLflow's auth config: its users' database, with the PostgreSQL
password). Secrets reach the servers in their environment, never on a command line.

Over HTTPS (:mod:`services.tls`) the identities' files on the services' machine also hold the CA's path in
each client's variable (:data:`tracking.access.CA_VARIABLES`), so ``set -a; . .services/auth/pipeline.env``
is all the ``prefect`` and ``mlflow`` CLIs need; what ``nextloc services credentials`` hands over carries
the CA itself instead (:data:`CA_PEM`, one line), which the first ``nextloc`` command on the other machine
writes to ``.services/auth/ca.pem`` and names in the same variables of that file.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from services.layout import Services
from services.processes import write_private
from services.tls import ca_file
from tracking.access import (
    CA_VARIABLES,
    MLFLOW_PASSWORD,
    MLFLOW_USERNAME,
    PREFECT_AUTH,
    authorization,
    ca_env,
    call_json,
)

log = logging.getLogger("nextloc.cli")

PIPELINE, READER = "pipeline", "reader"
IDENTITIES = (PIPELINE, READER)
SERVER_SECRETS = "mlflow-server"
PREFECT_USER = "nextloc"
MLFLOW_ADMIN = "nextloc-admin"
MLFLOW_USERS = {PIPELINE: "nextloc-pipeline", READER: "nextloc-reader"}
ADMIN_PASSWORD = "MLFLOW_AUTH_ADMIN_PASSWORD"
FLASK_SECRET = "MLFLOW_FLASK_SERVER_SECRET_KEY"
#: What the pipeline's MLflow user may do: everything on every experiment and registered model.
PIPELINE_GRANTS = ("experiment", "registered_model")
#: Seconds the tracking server trusts a credential it verified. MLflow's basic-auth app otherwise runs its
#: password hash (a deliberately slow KDF) on every request: about 0.43 s of a core per request here
#: (BENCHMARKS.md), for credentials that are random tokens, not guessable passwords. A password changed
#: or a user deleted through MLflow's API drops the cached entry at once (the server runs one worker);
#: a refused credential is never cached.
AUTH_CACHE_S = 60
AUTH_CACHE_VARIABLE = "NEXTLOC_MLFLOW_AUTH_CACHE_S"
#: The services' CA certificate in a handed-over credentials file: its PEM, base64 on one line.
CA_PEM = "NEXTLOC_TLS_CA_PEM"
CA_FILE = "ca.pem"


def _secret() -> str:
    return secrets.token_urlsafe(24)


def format_env(values: dict[str, str]) -> str:
    """``KEY=VALUE`` lines (a shell can ``set -a; . file``; :func:`read_env_file` reads them back)."""
    return "".join(f"{key}={value}\n" for key, value in values.items())


def read_env_file(path: Path) -> dict[str, str]:
    """The ``KEY=VALUE`` lines of ``path`` (comments and blank lines skipped); ``{}`` if it is missing."""
    try:
        return parse_env(path.read_text())
    except FileNotFoundError:
        return {}


def parse_env(text: str) -> dict[str, str]:
    """The ``KEY=VALUE`` lines of ``text`` (comments and blank lines skipped)."""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def credentials(services: Services, identity: str) -> dict[str, str]:
    """The variables of ``identity``'s file (``pipeline``, ``reader``, ``mlflow-server``); ``{}`` without one."""
    return read_env_file(services.credentials_file(identity))


def ensure_credentials(services: Services) -> None:
    """Generate the credential files that are missing (existing ones are kept, as the users in the
    databases are)."""
    services.auth_folder.mkdir(parents=True, exist_ok=True)
    services.auth_folder.chmod(0o700)
    wanted = {
        PIPELINE: {
            PREFECT_AUTH: f"{PREFECT_USER}:{_secret()}",
            MLFLOW_USERNAME: MLFLOW_USERS[PIPELINE],
            MLFLOW_PASSWORD: _secret(),
        },
        READER: {MLFLOW_USERNAME: MLFLOW_USERS[READER], MLFLOW_PASSWORD: _secret()},
        SERVER_SECRETS: {ADMIN_PASSWORD: _secret(), FLASK_SECRET: _secret()},
    }
    for name, values in wanted.items():
        path = services.credentials_file(name)
        if not path.is_file():
            write_private(path, format_env(values))
            log.info("generated credentials %s", path)
    ca = ca_file(services)
    for identity in IDENTITIES:  # the CA the clients verify against: this machine's path, or none
        _name_ca(services.credentials_file(identity), ca.resolve() if ca else None)


def _name_ca(path: Path, ca: Path | None) -> None:
    """Put ``ca`` in the CA variables of the env file ``path`` (``None``: drop them), if they differ."""
    values = {k: v for k, v in read_env_file(path).items() if k not in CA_VARIABLES}
    if ca is not None:
        values.update(ca_env(ca))
    if values != read_env_file(path):
        write_private(path, format_env(values))


def prefect_server_env(services: Services) -> dict[str, str]:
    """The Prefect server's side: the pipeline's auth string, required on every API request but health."""
    return {"PREFECT_SERVER_API_AUTH_STRING": credentials(services, PIPELINE)[PREFECT_AUTH]}


def auth_cache_seconds() -> int:
    """How long the tracking server trusts a credential it has verified (``$NEXTLOC_MLFLOW_AUTH_CACHE_S``,
    default :data:`AUTH_CACHE_S`; 0 verifies every request).

    Raises:
        ValueError: the variable is not a whole number of seconds from 0 to 3600, naming it.
    """
    text = os.environ.get(AUTH_CACHE_VARIABLE, str(AUTH_CACHE_S))
    if not text.strip().isdigit() or not 0 <= int(text) <= 3600:
        raise ValueError(f"{AUTH_CACHE_VARIABLE}={text!r}: expected whole seconds from 0 to 3600")
    return int(text)


def mlflow_server_env(services: Services, auth_database_uri: str) -> dict[str, str]:
    """The tracking server's side: its ``basic_auth.ini`` (written here, 0600: the database URI holds the
    PostgreSQL password; MLflow's verified-credential cache on, :func:`auth_cache_seconds`), the admin's
    password and the Flask secret key."""
    config = services.auth_folder / "basic_auth.ini"
    write_private(
        config,
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = {auth_database_uri}\nadmin_username = {MLFLOW_ADMIN}\n"
        f"auth_cache_ttl_seconds = {auth_cache_seconds()}\n",
    )
    own = credentials(services, SERVER_SECRETS)
    return {"MLFLOW_AUTH_CONFIG_PATH": str(config.resolve()), **own}


def allowed_hosts(services: Services) -> str:
    """MLflow's ``--allowed-hosts`` (against DNS rebinding): the services' address, and loopback's names."""
    names = dict.fromkeys([services.host, "127.0.0.1", "localhost"])
    return ",".join(f"{name}{port}" for name in names for port in ("", f":{services.mlflow_port}"))


def provision_mlflow_users(services: Services) -> None:
    """As the MLflow admin: create the pipeline's and the reader's users (or reset their passwords to the
    files'), and grant the pipeline ``MANAGE`` on every experiment and registered model. What exists
    already (services started again on the same database) is kept.

    Raises:
        RuntimeError: the server refused the admin or a request, naming the server and what it answered.
    """
    admin = authorization(f"{MLFLOW_ADMIN}:{credentials(services, SERVER_SECRETS)[ADMIN_PASSWORD]}")
    api = f"{services.mlflow_url}/api/2.0/mlflow/users"
    grant = f"{services.mlflow_url}/api/3.0/mlflow/users/permissions/grant"
    context = client_context(services)
    try:
        for identity in IDENTITIES:
            own = credentials(services, identity)
            user = {"username": own[MLFLOW_USERNAME], "password": own[MLFLOW_PASSWORD]}
            if not _admin_call(f"{api}/create", "POST", user, admin, context):
                _admin_call(f"{api}/update-password", "PATCH", user, admin, context)
        for resource_type in PIPELINE_GRANTS:
            body = {"resource_type": resource_type, "resource_id": "*", "permission": "MANAGE"}
            _admin_call(grant, "POST", {"username": MLFLOW_USERS[PIPELINE], **body}, admin, context)
    except urllib.error.HTTPError as err:
        hint = (
            f": its users' database was made with another admin password than "
            f"{services.credentials_file(SERVER_SECRETS)} holds"
            if err.code == 401
            else ""
        )
        raise RuntimeError(
            f"the MLflow tracking server at {services.mlflow_url} refused its admin {MLFLOW_ADMIN} "
            f"({err.code} on {urllib.parse.urlsplit(err.url).path}){hint}"
        ) from None
    log.info("MLflow users %s ready", ", ".join(MLFLOW_USERS.values()))


def client_context(services: Services) -> ssl.SSLContext | None:
    """How this machine's own requests to the services verify them: against their CA; None over HTTP."""
    if not services.tls:
        return None
    ca = ca_file(services)
    return ssl.create_default_context(cafile=str(ca) if ca else None)


def _admin_call(
    url: str, method: str, body: dict, headers: dict[str, str], context: ssl.SSLContext | None
) -> bool:
    """One admin request; False if what it creates exists already (``RESOURCE_ALREADY_EXISTS``)."""
    try:
        call_json(url, method, body, headers, context=context)
    except urllib.error.HTTPError as err:
        if err.code == 400 and b"RESOURCE_ALREADY_EXISTS" in err.read():
            return False
        raise
    return True


def credentials_text(services: Services, identity: str) -> str:
    """What ``nextloc services credentials --identity <identity>`` prints: where the services are, then the
    identity's variables (save them as ``.services/auth/<identity>.env`` of a project folder, mode 0600,
    or export them).

    Raises:
        FileNotFoundError: the services were never started here (no credentials generated).
    """
    values = credentials(services, identity)
    if not values:
        raise FileNotFoundError(
            f"no credentials in {services.auth_folder}: `nextloc services start` (make services) generates them"
        )
    where = {PIPELINE: "a worker or a pipeline run", READER: "a person: the MLflow UI, predict, serve"}[
        identity
    ]
    head = (
        f"# {identity}: {where}. Save as .services/auth/{identity}.env in the project folder (chmod 600),\n"
        f"# or export these. Prefect API {services.api_url}, MLflow {services.mlflow_url}\n"
    )
    values = {k: v for k, v in values.items() if k not in CA_VARIABLES}  # this machine's paths
    ca = ca_file(services)
    if ca is not None:
        head += f"# {CA_PEM}: the services' CA certificate ({ca.name}), which every client verifies them against\n"
        values[CA_PEM] = base64.b64encode(ca.read_bytes()).decode()
    return head + format_env(values)


# --- the clients' side ----------------------------------------------------------------------------


def use_credentials(root: Path, identities: tuple[str, ...]) -> str | None:
    """Put the first of ``identities`` whose file is in ``root/.services/auth`` into this process's
    environment, where the variables are not set already (the environment wins); the identity, or None."""
    for identity in identities:
        services = Services(root, backend="postgres", db_url=None)
        values = credentials(services, identity)
        if CA_PEM in values:
            values = _install_ca(services, identity, values)
        if values:
            for key, value in values.items():
                os.environ.setdefault(key, value)
            log.debug("credentials of %s from %s/.services/auth", identity, root)
            return identity
    return None


def _install_ca(services: Services, identity: str, values: dict[str, str]) -> dict[str, str]:
    """A handed-over file's CA (:data:`CA_PEM`) written to ``.services/auth/ca.pem`` and named in the
    file's CA variables (then ``set -a; . <file>`` serves the ``prefect`` and ``mlflow`` CLIs too).

    Raises:
        ValueError: the value is not a base64 PEM certificate, naming the file.
    """
    path = services.credentials_file(identity)
    try:
        pem = base64.b64decode(values[CA_PEM], validate=True)
    except ValueError:
        pem = b""
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError(
            f"{path}: {CA_PEM} is not a CA certificate (copy it again from `nextloc services credentials`)"
        )
    ca = services.auth_folder / CA_FILE
    if not ca.is_file() or ca.read_bytes() != pem:
        from nextloc.atomic import write_text_atomic

        write_text_atomic(ca, pem.decode())
        ca.chmod(0o644)
    _name_ca(path, ca.resolve())
    return read_env_file(path)
