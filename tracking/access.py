"""Whether a service lets this process in: the credentials a client sends (from its environment) and a
refusal said as one line naming the service, before any work.

The variables are the tools' own: ``PREFECT_API_AUTH_STRING`` (Prefect's client and workers send it as
HTTP basic auth) and ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` (MLflow's client). Where
they come from (the environment, else ``.services/auth/<identity>.env``) and the servers' side are
:mod:`services.auth`.

Over HTTPS (the services on a network address: :mod:`services.tls`) each tool verifies the server against
the CA its own variable names: Prefect's ``PREFECT_API_SSL_CERT_FILE`` (else ``SSL_CERT_FILE``), MLflow's
``MLFLOW_TRACKING_SERVER_CERT_PATH``, Python's ``SSL_CERT_FILE``; the checks here verify the same way, and
a certificate that does not verify stops the client with one line naming the service and the variable.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.request
from typing import Any

from tracking.settings import tracking_server

PREFECT_AUTH = "PREFECT_API_AUTH_STRING"
MLFLOW_USERNAME = "MLFLOW_TRACKING_USERNAME"
MLFLOW_PASSWORD = "MLFLOW_TRACKING_PASSWORD"
PREFECT_CA = "PREFECT_API_SSL_CERT_FILE"
MLFLOW_CA = "MLFLOW_TRACKING_SERVER_CERT_PATH"
SSL_CA = "SSL_CERT_FILE"
#: Where each client looks for the services' CA: Prefect's, MLflow's, Python's and OpenSSL's (curl, urllib).
CA_VARIABLES = (PREFECT_CA, MLFLOW_CA, SSL_CA)


class ServiceRefused(PermissionError):
    """A service refused this client's credentials (or their absence); the message names the service."""


class ServiceUntrusted(ServiceRefused):
    """A service's TLS certificate does not verify against the CA this client was given."""


def ca_env(ca_path: str | os.PathLike) -> dict[str, str]:
    """The variables that make every client verify the services against ``ca_path``."""
    return dict.fromkeys(CA_VARIABLES, str(ca_path))


def tls_context(variable: str) -> ssl.SSLContext:
    """A verifying context: the CA file in ``$variable`` (else ``$SSL_CERT_FILE``), else the system's."""
    return ssl.create_default_context(cafile=os.environ.get(variable) or os.environ.get(SSL_CA) or None)


def _untrusted(service: str, err: urllib.error.URLError, variable: str) -> ServiceUntrusted | None:
    """The one-line refusal for a certificate that did not verify; None for any other failure."""
    if not isinstance(err.reason, ssl.SSLCertVerificationError):
        return None
    return ServiceUntrusted(
        f"{service} presented a TLS certificate this client cannot verify "
        f"({err.reason.verify_message}). Set {variable} to the services' CA certificate "
        "(`nextloc services credentials` on the services' machine hands it over; saved as "
        ".services/auth/<identity>.env of this project folder, it is used at once)"
    )


def authorization(user_pass: str) -> dict[str, str]:
    """The HTTP basic ``Authorization`` header of ``user:password``."""
    return {"Authorization": "Basic " + base64.b64encode(user_pass.encode()).decode()}


def mlflow_login(values: dict[str, str]) -> dict[str, str]:
    """The ``Authorization`` header of an identity's MLflow user (``values``: its file's variables)."""
    return authorization(f"{values[MLFLOW_USERNAME]}:{values[MLFLOW_PASSWORD]}")


def call_json(
    url: str,
    method: str,
    body: dict | None,
    headers: dict[str, str],
    timeout_s: float = 30,
    context: ssl.SSLContext | None = None,
) -> Any:
    """One JSON request (``context``: how an ``https`` server is verified; default the system's); the
    decoded answer (``{}`` for an empty one). HTTP errors are raised."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
        return json.loads(response.read() or b"{}")


def _refused(service: str, err: urllib.error.HTTPError, variables: str, given: bool) -> ServiceRefused:
    what = (
        f"the credentials in {variables}" if given else f"a request without credentials ({variables} unset)"
    )
    return ServiceRefused(
        f"{service} refused {what}: HTTP {err.code}. Set {variables} to the services' credentials "
        "(`nextloc services credentials [--identity reader]` on the services' machine prints them), "
        "or put that output in .services/auth/<identity>.env of this project folder"
    )


def check_prefect(api_url: str) -> None:
    """Raise :class:`ServiceRefused` if the Prefect API refuses this process's ``PREFECT_API_AUTH_STRING``
    (or its absence); an unreachable API is left to the caller's own request."""
    auth = os.environ.get(PREFECT_AUTH)
    headers = authorization(auth) if auth else {}
    try:
        call_json(f"{api_url.rstrip('/')}/admin/version", "GET", None, headers, 10, tls_context(PREFECT_CA))
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise _refused(f"the Prefect API at {api_url}", err, PREFECT_AUTH, bool(auth)) from None
    except urllib.error.URLError as err:
        untrusted = _untrusted(f"the Prefect API at {api_url}", err, PREFECT_CA)
        if untrusted is not None:
            raise untrusted from None
    except OSError:
        return


_accepted: set[tuple[str, str | None, str | None]] = set()  # (tracking URI, user, password) a server accepted


def check_mlflow(tracking_uri: str) -> None:
    """Raise :class:`ServiceRefused` if an ``http(s)`` tracking server refuses this process's
    ``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` (or their absence); other stores are not asked."""
    if tracking_server(tracking_uri) is None:
        return
    user, password = os.environ.get(MLFLOW_USERNAME), os.environ.get(MLFLOW_PASSWORD)
    if (tracking_uri, user, password) in _accepted:
        return
    headers = authorization(f"{user}:{password}") if user and password else {}
    url = f"{tracking_uri.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1"
    service = f"the MLflow tracking server at {tracking_uri}"
    try:
        call_json(url, "GET", None, headers, 10, tls_context(MLFLOW_CA))
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise _refused(service, err, f"{MLFLOW_USERNAME}/{MLFLOW_PASSWORD}", bool(headers)) from None
    except urllib.error.URLError as err:
        untrusted = _untrusted(service, err, MLFLOW_CA)
        if untrusted is not None:
            raise untrusted from None
        return
    except OSError:
        return
    _accepted.add((tracking_uri, user, password))
