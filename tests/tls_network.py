"""The team services over HTTPS on an address that is not loopback, for the tests that check issue 57.

:func:`tls_services` (one start for the session): a network namespace of its own with one end of a veth
pair, the other end in the test's namespace, addresses from 198.18.0.0/15 (the range reserved for network
tests) and no route anywhere else; ``nextloc services start --no-worker`` inside it on that address (so
the services generate their CA and certificate and speak HTTPS); a packet capture on the test's end of
the veth; from the test's side a second project folder that gets ``nextloc services credentials`` as its
``.services/auth/pipeline.env`` and runs ``nextloc worker`` against the HTTPS API; one deployment run on
the sample to Completed. The namespace and the veth are removed at the end.

Where no namespace can be made (no privilege), the loopback variant: the same services on 127.0.0.1 with
HTTPS from a certificate the test gives them (``NEXTLOC_TLS_CERT``/``KEY``/``CA``, a team's own), and no
capture (the tests that need the network say why they skip).
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CAPTURE_LIMIT = 256 * 2**20


@dataclass
class Capture:
    """Every frame seen on one interface while it runs (:data:`CAPTURE_LIMIT` bytes at most)."""

    interface: str
    frames: int = 0
    data: bytearray = field(default_factory=bytearray)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003)) as sock:
            sock.bind((self.interface, 0))
            sock.settimeout(0.2)
            while not self.stop.is_set():
                try:
                    frame = sock.recv(65535)
                except TimeoutError:
                    continue
                self.frames += 1
                if len(self.data) < CAPTURE_LIMIT:
                    self.data += frame


@dataclass(frozen=True)
class TLSServices:
    """What :func:`tls_services` started and ran."""

    root: Path  # the services' folder
    client: Path  # the worker's folder, on the other side
    env: dict[str, str]  # for commands on the test's side: no credentials, no CA
    api: str
    mlflow: str
    ca: Path  # the CA the clients were handed (the client folder's copy)
    pipeline: dict[str, str]
    reader: dict[str, str]
    flow_run_id: str
    capture: Capture | None  # None: the loopback variant
    namespace: str | None
    why_no_namespace: str | None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def make_namespace(name: str, outer: str, inner: str, subnet: int) -> tuple[str, str]:
    """The namespace ``name`` joined to this one by the veth ``outer``/``inner``; (services' address, ours).

    Raises:
        OSError or subprocess.CalledProcessError: no privilege (or no ``ip``) to make them.
    """
    here, there = f"198.18.{subnet}.2", f"198.18.{subnet}.1"
    _ip("netns", "add", name)
    try:
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", name)
        _ip("addr", "add", f"{here}/30", "dev", outer)
        _ip("link", "set", outer, "up")
        _ip("-n", name, "addr", "add", f"{there}/30", "dev", inner)
        _ip("-n", name, "link", "set", inner, "up")
        _ip("-n", name, "link", "set", "lo", "up")
    except BaseException:
        remove_namespace(name, outer)
        raise
    return there, here


def remove_namespace(name: str, outer: str) -> None:
    for args in (("link", "del", outer), ("netns", "del", name)):
        subprocess.run(["ip", *args], capture_output=True, timeout=30)


def _team_certificate(folder: Path) -> dict[str, str]:
    """The loopback variant's certificate, as a team would give its own (made by the services' own code)."""
    from services import tls
    from services.layout import Services

    cert, key = tls.server_files(Services(folder, host="127.0.0.1", tls_cert=None))
    return {
        tls.CERT_VARIABLE: str(cert),
        tls.KEY_VARIABLE: str(key),
        tls.CA_VARIABLE: str(folder / ".services/tls/ca.pem"),
    }


def _run_deployment(api: str, headers: dict[str, str], context: ssl.SSLContext, sample_dir: Path) -> str:
    from services.processes import post_json

    [deployment] = post_json(
        f"{api}/deployments/filter", {"deployments": {"name": {"any_": ["geolife"]}}}, 30, headers, context
    )
    params = {
        "raw_dir": str(sample_dir),
        "data_dir": "data/tls",
        "training": {"models": ["markov"], "seeds": [0]},
    }
    url = f"{api}/deployments/{deployment['id']}/create_flow_run"
    run = post_json(url, {"parameters": params}, 30, headers, context)
    deadline, state = time.monotonic() + 900, None
    while time.monotonic() < deadline and state not in ("COMPLETED", "FAILED", "CRASHED"):
        time.sleep(2)
        body = {"flow_runs": {"id": {"any_": [run["id"]]}}}
        state = post_json(f"{api}/flow_runs/filter", body, 30, headers, context)[0]["state_type"]
    assert state == "COMPLETED", state
    return run["id"]


def _clean_env(root: Path) -> dict[str, str]:
    from services.processes import free_port_env
    from tracking import access

    env = {**os.environ, "PREFECT_HOME": str(root / ".prefect"), "PYTHONPATH": str(REPO)}
    env.update(free_port_env())
    for key in ("PREFECT_API_URL", "NEXTLOC_DB_URL", "NEXTLOC_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    for key in (access.PREFECT_AUTH, access.MLFLOW_USERNAME, access.MLFLOW_PASSWORD, *access.CA_VARIABLES):
        env.pop(key, None)
    for key in (
        "NEXTLOC_TLS_CERT",
        "NEXTLOC_TLS_KEY",
        "NEXTLOC_TLS_CA",
        "CURL_CA_BUNDLE",
        "REQUESTS_CA_BUNDLE",
    ):
        env.pop(key, None)
    return env


@pytest.fixture(scope="session")
def tls_services(sample_dir) -> Iterator[TLSServices]:
    import services as svc_module
    from services import auth

    root = Path(tempfile.mkdtemp(prefix="nextloc-tls-", dir="/tmp"))
    root.chmod(0o755)  # as root, PostgreSQL runs as the postgres user, which must reach .services/pg
    client = root / "client"
    (client / ".services" / "auth").mkdir(parents=True)
    env = _clean_env(root)
    try:
        svc_module.postgres_bin_dir()
    except RuntimeError:
        env["NEXTLOC_SERVICES_BACKEND"] = "sqlite"
    tag = os.getpid() % 10000
    name, outer, inner = f"nextloc-tls-{tag}", f"nlt{tag}a", f"nlt{tag}b"
    why = None
    try:
        host, _ = make_namespace(name, outer, inner, subnet=tag % 250)
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", None) or str(err)
        why = f"no network namespace could be made here ({' '.join(str(detail).split())[:200]})"
        name, host = None, "127.0.0.1"
        env.update(_team_certificate(root / "team-cert"))
    if os.environ.get("NEXTLOC_TEST_NO_NETNS") and name:  # to try the loopback variant where netns works
        remove_namespace(name, outer)
        why, name, host = "NEXTLOC_TEST_NO_NETNS is set", None, "127.0.0.1"
        env.update(_team_certificate(root / "team-cert"))
    env["NEXTLOC_SERVICES_HOST"] = host
    inside = ["ip", "netns", "exec", name] if name else []
    nextloc = [str(BIN / "nextloc"), "services"]
    capture = Capture(outer) if name else None
    watcher = threading.Thread(target=capture.run, daemon=True) if capture else None
    worker = None
    try:
        if watcher:
            watcher.start()
        started = subprocess.run(
            [*inside, *nextloc, "start", "--no-worker"], cwd=root, env=env, capture_output=True, text=True
        )
        assert started.returncode == 0, started.stderr[-3000:]
        services = svc_module.Services(
            root,
            *(int(env[f"NEXTLOC_{n}_PORT"]) for n in ("PREFECT", "MLFLOW", "PG")),
            db_url=None,
            host=host,
            tls_cert=env.get("NEXTLOC_TLS_CERT"),
        )
        for identity in (auth.PIPELINE, auth.READER):
            handed = subprocess.run(
                [*nextloc, "credentials", "--identity", identity],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
            )
            assert handed.returncode == 0, handed.stderr
            (client / ".services" / "auth" / f"{identity}.env").write_text(handed.stdout)
            (client / ".services" / "auth" / f"{identity}.env").chmod(0o600)
        client_env = {k: v for k, v in env.items() if not k.startswith("NEXTLOC_TLS_")}
        client_env["PREFECT_HOME"] = str(client / ".prefect")
        with open(client / "worker.log", "ab") as log:
            worker = subprocess.Popen(
                [str(BIN / "nextloc"), "worker", "--api", services.api_url],
                cwd=client,
                env=client_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        pipeline = auth.read_env_file(client / ".services" / "auth" / "pipeline.env")
        ca = client / ".services" / "auth" / auth.CA_FILE
        for _ in range(600):  # the worker writes the handed-over CA at its start
            if ca.is_file() or worker.poll() is not None:
                break
            time.sleep(0.1)
        assert ca.is_file(), (client / "worker.log").read_text()[-3000:]
        context = ssl.create_default_context(cafile=str(ca))
        headers = auth.authorization(pipeline[auth.PREFECT_AUTH])
        run_id = _run_deployment(services.api_url, headers, context, sample_dir)
        yield TLSServices(
            root,
            client,
            client_env,
            services.api_url,
            services.mlflow_url,
            ca,
            auth.read_env_file(client / ".services" / "auth" / "pipeline.env"),
            auth.read_env_file(client / ".services" / "auth" / "reader.env"),
            run_id,
            capture,
            name,
            why,
        )
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, 2)
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, 9)
        subprocess.run([*nextloc, "stop"], cwd=root, env=env, capture_output=True, timeout=300)
        if capture:
            capture.stop.set()
            watcher.join(timeout=5)
        if name:
            remove_namespace(name, outer)
        shutil.rmtree(root, ignore_errors=True)
