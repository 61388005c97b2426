"""The team services speak HTTPS on the network (issue 57): real PostgreSQL, Prefect server and MLflow
server in a network namespace of their own on 198.18.x.1 (:func:`tls_network.tls_services`), reached from
the test's side of a veth pair.

From that side: a worker joins over HTTPS with the CA that ``nextloc services credentials`` handed over
and runs a deployment on the sample to Completed; ``curl --cacert`` reads both servers, ``curl`` without
it fails verification; plain HTTP on the servers' ports gets no answer (no login asked, no data); a
capture on the veth holds no credential in clear; a client without the CA stops with one line naming the
service and the variable; headless Chromium that trusts the CA loads both UIs over HTTPS, where they ask
for the login as over HTTP (screenshots in ``test-artifacts/browser/``), and one without it refuses them.
Without the privilege to make a namespace the services run on 127.0.0.1 with a certificate the test
gives them (a team's own) and the network's own checks skip, saying why. The certificates themselves
(generated, private, renewed, handed over) are checked without servers. All in one module, so that
``--dist loadfile`` starts the services once.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from services import auth, tls
from services.layout import Services
from tracking import access

NEXTLOC = str(Path(sys.executable).parent / "nextloc")


# --- the certificates, without servers ------------------------------------------------------------


def test_the_first_start_makes_a_private_ca_and_a_certificate_for_the_address(tmp_path, monkeypatch):
    from cryptography import x509

    for name in (tls.CERT_VARIABLE, tls.KEY_VARIABLE, tls.CA_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    services = Services(tmp_path, host="198.18.0.1", tls_cert=None)
    assert services.tls
    assert services.api_url.startswith("https://198.18.0.1:")
    assert not Services(tmp_path, host="127.0.0.1", tls_cert=None).tls  # loopback stays plain HTTP
    cert, key = tls.server_files(services)
    folder = services.tls_folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for private in (key, folder / "ca.key"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    held = x509.load_pem_x509_certificate(cert.read_bytes())
    names = held.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "198.18.0.1" in {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    first = cert.read_bytes()
    assert tls.server_files(services) == (cert, key)
    assert cert.read_bytes() == first
    ca_before = (folder / "ca.pem").read_bytes()
    tls.server_files(Services(tmp_path, host="198.18.0.5", tls_cert=None))
    assert (folder / "ca.pem").read_bytes() == ca_before  # clients keep trusting the same CA
    assert cert.read_bytes() != first  # a new address: a new certificate
    monkeypatch.setenv(tls.CERT_VARIABLE, str(cert))
    with pytest.raises(ValueError, match="NEXTLOC_TLS_CERT and NEXTLOC_TLS_KEY go together"):
        tls.server_files(services)
    monkeypatch.setenv(tls.KEY_VARIABLE, str(tmp_path / "missing.key"))
    with pytest.raises(ValueError, match="NEXTLOC_TLS_KEY=.*no such file"):
        tls.server_files(services)
    monkeypatch.setenv(tls.KEY_VARIABLE, str(key))
    assert tls.server_files(services) == (cert, key)
    assert tls.ca_file(services) is None  # a team's certificate: its CA only if it names one


def test_the_handed_over_ca_is_installed_and_named_for_every_client(tmp_path, monkeypatch):
    for name in (tls.CERT_VARIABLE, tls.KEY_VARIABLE, tls.CA_VARIABLE, *access.CA_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    services = Services(tmp_path / "services", host="198.18.0.1", tls_cert=None)
    tls.server_files(services)
    auth.ensure_credentials(services)
    here = auth.read_env_file(services.credentials_file(auth.PIPELINE))
    assert here[access.PREFECT_CA] == str((services.tls_folder / "ca.pem").resolve())  # for the CLIs here
    text = auth.credentials_text(services, auth.PIPELINE)
    handed = auth.parse_env(text)
    assert not set(access.CA_VARIABLES) & set(handed)  # no path of the services' machine
    pem = base64.b64decode(handed[auth.CA_PEM])
    assert pem == (services.tls_folder / "ca.pem").read_bytes()
    other = tmp_path / "worker"
    (other / ".services" / "auth").mkdir(parents=True)
    (other / ".services" / "auth" / "pipeline.env").write_text(text)
    with _environment_restored():  # use_credentials sets this process's variables, as a command's start does
        assert auth.use_credentials(other, (auth.PIPELINE,)) == auth.PIPELINE
        ca = other / ".services" / "auth" / auth.CA_FILE
        assert ca.read_bytes() == pem
        for name in access.CA_VARIABLES:
            assert os.environ[name] == str(ca.resolve())
        assert auth.read_env_file(other / ".services" / "auth" / "pipeline.env")[access.MLFLOW_CA] == str(
            ca.resolve()
        )
        (other / ".services" / "auth" / "pipeline.env").write_text(f"{auth.CA_PEM}=bm90IGEgY2VydA==\n")
        with pytest.raises(ValueError, match="is not a CA certificate"):
            auth.use_credentials(other, (auth.PIPELINE,))


@contextlib.contextmanager
def _environment_restored() -> Iterator[None]:
    """This process's environment as it was, afterwards: a test that leaves credentials in it hands them to
    every later test's subprocesses (whose own files then lose: the environment wins)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# --- the services on the network ------------------------------------------------------------------


def _curl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "20", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_a_worker_joins_over_https_and_runs_a_deployment_to_completed(tls_services):
    """The fixture's run: the worker on the other side, with nothing but the handed-over file, ran it;
    its MLflow run is read back over HTTPS, verified against the handed-over CA."""
    s = tls_services
    assert s.api.startswith("https://")
    assert s.mlflow.startswith("https://")
    assert (s.client / "data" / "tls").is_dir()  # the worker's folder did the work
    context = ssl.create_default_context(cafile=str(s.ca))
    url = f"{s.mlflow}/api/2.0/mlflow/experiments/get-by-name?experiment_name=nextloc-geolife"
    answer = access.call_json(url, "GET", None, access.mlflow_login(s.reader), 30, context)
    assert answer["experiment"]["name"] == "nextloc-geolife"
    headers = access.authorization(s.pipeline[access.PREFECT_AUTH])
    body = {"flow_runs": {"id": {"any_": [s.flow_run_id]}}}
    [run] = access.call_json(f"{s.api}/flow_runs/filter", "POST", body, headers, 30, context)
    assert run["state_type"] == "COMPLETED"


@pytest.mark.slow
def test_the_prefect_and_mlflow_clis_verify_with_the_handed_over_file(tls_services):
    """``set -a; . .services/auth/pipeline.env`` in the worker's folder (where the first ``nextloc``
    command named the CA it installed): Prefect's and MLflow's own CLIs read both servers over HTTPS."""
    s = tls_services
    script = (
        "set -a; . .services/auth/pipeline.env; set +a; "
        f"prefect flow-run inspect {s.flow_run_id} && mlflow experiments get --experiment-name nextloc-geolife"
    )
    env = {**s.env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.update({"PREFECT_API_URL": s.api, "MLFLOW_TRACKING_URI": s.mlflow})
    done = subprocess.run(
        ["bash", "-c", script], cwd=s.client, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert s.flow_run_id in done.stdout
    assert "nextloc-geolife" in done.stdout


@pytest.mark.slow
def test_curl_reads_both_servers_with_the_ca_and_fails_verification_without(tls_services):
    s = tls_services
    reader = f"{s.reader[access.MLFLOW_USERNAME]}:{s.reader[access.MLFLOW_PASSWORD]}"
    search = f"{s.mlflow}/api/2.0/mlflow/experiments/search?max_results=5"
    for url, user in ((f"{s.api}/health", None), (f"{s.mlflow}/health", None), (search, reader)):
        login = ["-u", user] if user else []
        read = _curl("--fail", "--cacert", str(s.ca), *login, url, env=s.env)
        assert read.returncode == 0, (url, read.stderr)
        unverified = _curl(*login, url, env=s.env)
        assert unverified.returncode == 60, (
            url,
            unverified.returncode,
            unverified.stderr,
        )  # peer not verified
        assert not unverified.stdout
    ui = _curl("--fail", "--cacert", str(s.ca), s.api.removesuffix("/api") + "/", env=s.env)
    assert ui.returncode == 0
    assert "<html" in ui.stdout.lower()
    flows = _curl(
        "--fail",
        "--cacert",
        str(s.ca),
        "-u",
        s.pipeline[access.PREFECT_AUTH],
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "-d",
        "{}",
        f"{s.api}/flow_runs/filter",
        env=s.env,
    )
    assert flows.returncode == 0, flows.stderr
    assert s.flow_run_id in flows.stdout


@pytest.mark.slow
def test_plain_http_on_the_network_ports_gets_no_login_and_no_data(tls_services):
    s = tls_services
    for base in (s.api.removesuffix("/api"), s.mlflow):
        parts = urllib.parse.urlsplit(base)
        with socket.create_connection((parts.hostname, parts.port), timeout=20) as sock:
            sock.sendall(
                f"GET /api/2.0/mlflow/experiments/search HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode()
            )
            answer = b""
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except (ConnectionResetError, TimeoutError):
                pass
        assert b"HTTP/" not in answer, answer[:300]  # no status line, so no login asked and no data
        assert b"WWW-Authenticate" not in answer
        plain = _curl("-i", f"http://{parts.netloc}/", env=s.env)
        assert plain.returncode != 0
        assert "WWW-Authenticate" not in plain.stdout
        assert "HTTP/" not in plain.stdout


@pytest.mark.slow
def test_no_credential_crosses_the_network_in_clear(tls_services):
    s = tls_services
    if s.capture is None:
        pytest.skip(f"the loopback variant ran: {s.why_no_namespace}")
    data = bytes(s.capture.data)
    assert s.capture.frames > 100
    assert len(data) > 100_000
    secrets = [
        s.pipeline[access.PREFECT_AUTH],
        s.pipeline[access.MLFLOW_PASSWORD],
        s.reader[access.MLFLOW_PASSWORD],
    ]
    logins = [
        s.pipeline[access.PREFECT_AUTH],
        f"{s.pipeline[access.MLFLOW_USERNAME]}:{s.pipeline[access.MLFLOW_PASSWORD]}",
    ]
    encoded = [base64.b64encode(x.encode()) for x in logins]
    assert b"authorization" not in data.lower()
    for needle in [x.encode() for x in secrets] + encoded:
        assert needle not in data
    assert b"\x16\x03" in data  # TLS handshakes were seen


@pytest.mark.slow
def test_a_client_without_the_ca_stops_naming_the_service_and_the_variable(
    tls_services, sample_dir, tmp_path
):
    s = tls_services
    env = {**s.env, access.PREFECT_AUTH: s.pipeline[access.PREFECT_AUTH]}
    worker = subprocess.run(
        [NEXTLOC, "worker", "--api", s.api],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode == 2, worker.stderr[-2000:]
    assert "Traceback" not in worker.stderr, worker.stderr
    line = " ".join(worker.stderr.split())  # one log record (the console wraps it to its width)
    assert line.count("ERROR") == 1, worker.stderr
    assert f"the Prefect API at {s.api} presented a TLS certificate" in line
    assert access.PREFECT_CA in line
    history = str(sample_dir / "Data" / "073" / "Trajectory")
    predict = [NEXTLOC, "predict", "--model", "markov", "--history", history, "--tracking-uri", s.mlflow]
    env = {
        **s.env,
        access.MLFLOW_USERNAME: s.reader[access.MLFLOW_USERNAME],
        access.MLFLOW_PASSWORD: s.reader[access.MLFLOW_PASSWORD],
    }
    refused = subprocess.run(predict, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr[-2000:]
    line = " ".join(refused.stderr.split())
    assert line.count("ERROR") == 1, refused.stderr
    assert f"the MLflow tracking server at {s.mlflow} presented a TLS certificate" in line
    assert access.MLFLOW_CA in line
    assert "Traceback" not in refused.stderr
    # with the handed-over reader file, the same command verifies and answers
    (tmp_path / ".services" / "auth").mkdir(parents=True)
    (tmp_path / ".services" / "auth" / "reader.env").write_text(
        (s.client / ".services" / "auth" / "reader.env").read_text()
    )
    answer = subprocess.run(predict, cwd=tmp_path, env=s.env, capture_output=True, text=True, timeout=300)
    assert answer.returncode == 0, answer.stderr[-3000:]
    assert json.loads(answer.stdout)[0]["places"]


# --- the UIs in headless Chromium -----------------------------------------------------------------


@pytest.fixture
def ca_browser(tls_services):
    """Chromium whose NSS database trusts the services' CA (:func:`chromium.trusting_home`), its DevTools
    events kept; nothing turns certificate checks off."""
    import shutil

    from chromium import chromium, trusting_home

    home = trusting_home(tls_services.ca)
    try:
        yield from chromium(network=True, home=home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def bare_browser():
    """Chromium with a fresh profile and the machine's own trust store only."""
    from chromium import chromium

    yield from chromium()


def _shot(driver, name: str) -> None:
    from chromium import SCREENSHOTS

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def _wait(driver):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 90)


def _body(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def _responses(driver) -> list[dict]:
    events = (json.loads(entry["message"])["message"] for entry in driver.get_log("performance"))
    return [e["params"]["response"] for e in events if e["method"] == "Network.responseReceived"]


@pytest.mark.slow
def test_prefect_ui_loads_over_https_and_asks_for_the_auth_string(ca_browser, tls_services):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    s, browser = tls_services, ca_browser
    ui = s.api.removesuffix("/api")
    password = (By.CSS_SELECTOR, "input[type='password']")
    browser.get(f"{ui}/")
    _wait(browser).until(lambda d: "/login" in d.current_url)
    _wait(browser).until(ec.element_to_be_clickable(password))
    assert browser.current_url.startswith("https://")
    assert browser.execute_script("return window.isSecureContext") is True
    _shot(browser, "services-tls-prefect-login")
    browser.find_element(*password).send_keys(s.pipeline[access.PREFECT_AUTH])
    browser.find_element(By.CSS_SELECTOR, "button[type='submit']").click()
    _wait(browser).until(lambda d: "/login" not in d.current_url)
    browser.get(f"{ui}/runs/flow-run/{s.flow_run_id}")
    _wait(browser).until(lambda d: "geolife data/tls" in _body(d))
    _shot(browser, "services-tls-prefect-run")


@pytest.mark.slow
def test_mlflow_ui_loads_over_https_and_asks_for_a_login(ca_browser, tls_services):
    s, browser = tls_services, ca_browser
    browser.get_log("performance")
    browser.get(f"{s.mlflow}/")
    [answer] = [r for r in _responses(browser) if r["url"] == f"{s.mlflow}/"]
    assert answer["status"] == 401  # the login, asked as over HTTP: a basic-auth challenge
    assert {k.lower(): v for k, v in answer["headers"].items()}["www-authenticate"].startswith("Basic")
    assert answer["securityState"] == "secure", answer.get("securityDetails")
    _shot(browser, "services-tls-mlflow-login")
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": access.mlflow_login(s.reader)})
    browser.get(f"{s.mlflow}/#/experiments")
    _wait(browser).until(lambda d: "nextloc-geolife" in _body(d))
    statuses = {r["status"] for r in _responses(browser) if r["url"].startswith(s.mlflow)}
    assert 401 not in statuses, statuses
    _shot(browser, "services-tls-mlflow-as-reader")


@pytest.mark.slow
def test_a_browser_without_the_ca_refuses_the_services(bare_browser, tls_services):
    bare_browser.get(f"{tls_services.mlflow}/")
    text = _body(bare_browser)
    assert "ERR_CERT_AUTHORITY_INVALID" in text, text[:500]
    _shot(bare_browser, "services-tls-untrusted")
