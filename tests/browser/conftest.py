"""Browser tests: the MLflow and Prefect UIs as a user sees them, in headless Chromium driven by Selenium.

Once per session: a real Prefect server and the MLflow UI on free 127.0.0.1 ports, then ``nextloc run`` on the
real GeoLife sample against them (markov and a short pointer_plus, two seeds each), exactly as a user runs
it. Chromium and ChromeDriver are Debian's (``make install`` installs them); Selenium Manager is never
asked for a driver, so nothing is downloaded. Screenshots go to ``test-artifacts/browser/``.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from chromium import SCREENSHOTS, chromium

from flows import OFFLINE_DEFAULTS
from services.processes import free_ports, post_json
from services.supervisor import MLFLOW_SERVER_ENV

_post = functools.partial(post_json, timeout_s=30)  # a slow server under load still answers

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{url}: the server exited ({proc.returncode}); log:\n{log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer in {timeout_s:.0f} s; log:\n{log.read_text()[-3000:]}")


def _launch(args: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(proc: subprocess.Popen) -> None:
    """Stop a server this fixture started (its own process group: uvicorn workers included)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@dataclass(frozen=True)
class Stack:
    """What the session fixture started and ran."""

    root: Path
    tracking_uri: str
    mlflow_url: str
    prefect_url: str  # the Prefect UI (its API is under /api)
    experiment_id: str
    parent_run_id: str
    flow_run_id: str  # the preprocess-train flow run
    run_output: str  # what `nextloc run` printed


@pytest.fixture(scope="session")
def stack(sample_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("browser")
    (root / "mlruns" / "artifacts").mkdir(parents=True)
    tracking_uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    prefect_port, mlflow_port = free_ports(2)
    prefect_url, mlflow_url = f"http://127.0.0.1:{prefect_port}", f"http://127.0.0.1:{mlflow_port}"
    env = {
        **os.environ,
        **OFFLINE_DEFAULTS,
        "PREFECT_HOME": str(root / "prefect-home"),
    }
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    # the Prefect UI asks this API (its default is port 4200, maybe someone else's server)
    prefect_env = {**env, "PREFECT_UI_API_URL": f"{prefect_url}/api"}
    servers = [
        _launch(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
            prefect_env,
            root / "prefect-server.log",
            root,
        ),
        _launch(
            [str(BIN / "mlflow"), "server", "--backend-store-uri", tracking_uri, "--default-artifact-root"]
            + [str(root / "mlruns" / "artifacts"), "--host", "127.0.0.1", "--port", str(mlflow_port)]
            + ["--workers", "1"],
            {**env, **MLFLOW_SERVER_ENV},  # as the team services run it
            root / "mlflow.log",
            root,
        ),
    ]
    try:
        _wait_http(f"{prefect_url}/api/health", servers[0], root / "prefect-server.log")
        run_env = {**env, "PREFECT_API_URL": f"{prefect_url}/api", "NEXTLOC_MLFLOW_UI_URL": mlflow_url}
        done = subprocess.run(
            [str(BIN / "nextloc"), "run", "--raw-dir", str(sample_dir), "--data-dir", str(root / "data")]
            + ["--model", "markov,pointer_plus", "--seeds", "0,1", "--device", "cpu", "--workers", "2"]
            + ["--train-set", "max_epochs=2", "--train-set", "min_epochs=0", "--tracking-uri", tracking_uri],
            cwd=root,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        _wait_http(f"{mlflow_url}/health", servers[1], root / "mlflow.log")
        parent = _post(
            f"{mlflow_url}/api/2.0/mlflow/runs/search",
            {"experiment_ids": [_experiment_id(mlflow_url)], "filter": "tags.kind = 'pipeline'"},
        )["runs"][0]
        flow_runs = _post(
            f"{prefect_url}/api/flow_runs/filter",
            {"flows": {"name": {"any_": ["preprocess-train"]}}, "limit": 5},
        )
        yield Stack(
            root,
            tracking_uri,
            mlflow_url,
            prefect_url,
            parent["info"]["experiment_id"],
            parent["info"]["run_id"],
            flow_runs[0]["id"],
            done.stdout,
        )
    finally:
        for server in reversed(servers):
            _stop(server)


def _experiment_id(mlflow_url: str) -> str:
    with urllib.request.urlopen(
        f"{mlflow_url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=nextloc-geolife", timeout=30
    ) as response:
        return json.loads(response.read())["experiment"]["experiment_id"]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Debian Chromium through Debian's ChromeDriver, with a fresh profile, its console log kept
    (``driver.get_log("browser")``); never Selenium Manager. One per test file: a browser left open on a
    live UI page keeps drawing it (its GPU process took half a core for the rest of a session)."""
    yield from chromium(console=True)


@pytest.fixture(scope="module")
def network_browser() -> Iterator[object]:
    """:func:`browser` that also keeps every response it got (``driver.get_log("performance")``)."""
    yield from chromium(network=True)


@pytest.fixture
def free_port() -> int:
    """A port nothing listens on now, on 127.0.0.1."""
    return free_ports(1)[0]


@pytest.fixture
def fresh_browser() -> Iterator[object]:
    """:func:`browser`'s Chromium for one test alone: a profile no other test has used."""
    yield from chromium()


#: no network at all: every host name fails to resolve, every request goes to a proxy that is not there
OFFLINE_FLAGS = (
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
)


@pytest.fixture(scope="module")
def offline_browser() -> Iterator[object]:
    """:func:`browser` cut off from every network (:data:`OFFLINE_FLAGS`), its console log kept."""
    yield from chromium(OFFLINE_FLAGS, console=True)


@pytest.fixture(scope="session")
def screenshot():
    """``screenshot(driver, name)``: a PNG of the page under ``test-artifacts/browser/``; returns its path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(driver, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        driver.save_screenshot(str(path))
        return path

    return take


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed browser test leaves a screenshot of the page it was on (``<test name>-failed.png``)."""
    outcome = yield
    report = outcome.get_result()
    funcargs = item.funcargs if hasattr(item, "funcargs") else {}
    driver = funcargs.get("browser") or funcargs.get("offline_browser")
    if report.when == "call" and report.failed and driver is not None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SCREENSHOTS / f"{item.name}-failed.png"))


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A bare Prefect server on a free 127.0.0.1 port with the deployments ``flows/deployments.py`` builds
    applied (no work pool, no run): its UI URL and ``{deployment full name: id}``."""
    root = tmp_path_factory.mktemp("deployed")
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    env = {**os.environ, **OFFLINE_DEFAULTS, "PREFECT_HOME": str(root / "prefect-home")}
    env.pop("PREFECT_API_URL", None)
    port = url.rsplit(":", 1)[1]
    server = _launch(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", port],
        {**env, "PREFECT_UI_API_URL": f"{url}/api"},
        root / "prefect-server.log",
        root,
    )
    try:
        _wait_http(f"{url}/api/health", server, root / "prefect-server.log")
        apply = "from flows.deployments import deployments\nfor d in deployments():\n    print(d.full_name, d.apply())"
        done = subprocess.run(
            [sys.executable, "-c", apply],
            cwd=REPO,
            env={**env, "PREFECT_API_URL": f"{url}/api"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        yield url, dict(line.rsplit(" ", 1) for line in done.stdout.splitlines() if line.strip())
    finally:
        _stop(server)
