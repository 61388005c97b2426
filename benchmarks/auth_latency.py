"""What a credential costs: an authenticated read on the team services against the same read without auth.

Starts ``nextloc services start --no-worker`` (PostgreSQL) in a fresh project folder on free 127.0.0.1 ports,
once per ``--cache-s`` setting (``$NEXTLOC_MLFLOW_AUTH_CACHE_S``: how long the tracking server trusts a
credential it verified; 0 verifies every request, as MLflow's basic-auth app does by default), and times,
over one kept-alive connection each, ``--calls`` requests of:

* the MLflow tracking server: ``GET /health`` (never asks for a credential) and an authenticated
  ``POST /api/2.0/mlflow/experiments/search`` as the pipeline and as the reader;
* a plain ``mlflow server`` (no auth app) over the same PostgreSQL store, the same read: the reference;
* the Prefect server: ``GET /api/health`` and an authenticated ``POST /api/flows/filter``.

Prints one JSON object: per setting and endpoint the first call and the median, p95 and max of the rest
(ms), and each authenticated read's median as a ratio to the plain server's.

    python benchmarks/auth_latency.py --cache-s 0,60 --out benchmarks/results/auth-latency-<date>.json

Everything stays on 127.0.0.1; request count and time are bounded; the services are stopped.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services import auth  # noqa: E402
from services.layout import MLFLOW_DB, Services  # noqa: E402
from services.processes import free_port_env, free_ports  # noqa: E402

BIN = Path(sys.executable).parent
SEARCH = ("POST", "/api/2.0/mlflow/experiments/search", {"max_results": 10})


def _basic(user_password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(user_password.encode()).decode()}


def time_calls(url: str, method: str, path: str, body: Any, headers: dict[str, str], calls: int) -> dict:
    """``calls`` requests over one kept-alive connection: the first's time and the rest's median, p95, max."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    data = None if body is None else json.dumps(body).encode()
    heads = {"Content-Type": "application/json", **headers}
    times, statuses = [], set()
    try:
        for _ in range(calls):
            t0 = time.perf_counter()
            connection.request(method, path, body=data, headers=heads)
            response = connection.getresponse()
            response.read()
            times.append(1000 * (time.perf_counter() - t0))
            statuses.add(response.status)
    finally:
        connection.close()
    rest = sorted(times[1:])
    return {
        "calls": calls,
        "status": sorted(statuses),
        "first_ms": round(times[0], 1),
        "median_ms": round(statistics.median(rest), 2),
        "p95_ms": round(rest[min(len(rest) - 1, round(0.95 * (len(rest) - 1)))], 2),
        "max_ms": round(rest[-1], 2),
    }


def _plain_mlflow(store_uri: str, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": store_uri, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    command = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    return subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            if answer.status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer in {timeout_s:.0f} s")


def measure(cache_s: int, calls: int, plain: bool) -> dict[str, Any]:
    """Start the services with ``cache_s``, time every endpoint, stop them."""
    root = Path(tempfile.mkdtemp(prefix="nextloc-auth-latency-"))
    root.chmod(0o755)  # as root, PostgreSQL runs as the postgres user, which must reach .services/pg
    env = {**os.environ, **free_port_env(), "PYTHONPATH": str(REPO)}
    env.update(NEXTLOC_MLFLOW_AUTH_CACHE_S=str(cache_s), NEXTLOC_SERVICES_BACKEND="postgres")
    for key in ("PREFECT_API_URL", "NEXTLOC_DB_URL", "NEXTLOC_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    nextloc = [str(BIN / "nextloc"), "services"]
    started = subprocess.run(
        [*nextloc, "start", "--no-worker"], cwd=root, env=env, capture_output=True, text=True
    )
    if started.returncode != 0:
        raise RuntimeError(f"services did not start: {started.stderr[-2000:]}")
    ports = [int(env[f"NEXTLOC_{name}_PORT"]) for name in ("PREFECT", "MLFLOW", "PG")]
    services = Services(root, *ports, backend="postgres", db_url=None)
    result: dict[str, Any] = {"cache_s": cache_s}
    try:
        result.update(_time_services(services, calls))
        if plain:
            result["plain_mlflow_search"] = _time_plain(services, calls, root)
    finally:
        subprocess.run([*nextloc, "stop"], cwd=root, env=env, capture_output=True, timeout=300)
    return result


def _time_services(services: Services, calls: int) -> dict[str, Any]:
    pipeline = auth.credentials(services, auth.PIPELINE)
    reader = auth.credentials(services, auth.READER)
    as_user = {
        name: _basic(f"{values[auth.MLFLOW_USERNAME]}:{values[auth.MLFLOW_PASSWORD]}")
        for name, values in (("pipeline", pipeline), ("reader", reader))
    }
    method, path, body = SEARCH
    mlflow, api = services.mlflow_url, services.api_url
    prefect_headers = auth.authorization(pipeline[auth.PREFECT_AUTH])
    return {
        "mlflow_health": time_calls(mlflow, "GET", "/health", None, {}, calls),
        "mlflow_search_pipeline": time_calls(mlflow, method, path, body, as_user["pipeline"], calls),
        "mlflow_search_reader": time_calls(mlflow, method, path, body, as_user["reader"], calls),
        "mlflow_search_refused": time_calls(mlflow, method, path, body, _basic("nobody:wrong"), 5),
        "prefect_health": time_calls(api, "GET", "/api/health", None, {}, calls),
        "prefect_flows_filter": time_calls(api, "POST", "/api/flows/filter", {}, prefect_headers, calls),
    }


def _time_plain(services: Services, calls: int, root: Path) -> dict[str, Any]:
    port = free_ports(1)[0]
    server = _plain_mlflow(services.database_url(MLFLOW_DB, "psycopg"), port, root / "plain-mlflow.log")
    try:
        _wait(f"http://127.0.0.1:{port}")
        method, path, body = SEARCH
        return time_calls(f"http://127.0.0.1:{port}", method, path, body, {}, calls)
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--cache-s", default=f"0,{auth.AUTH_CACHE_S}", help="settings to measure, comma-separated"
    )
    parser.add_argument("--calls", type=int, default=30, help="requests per endpoint (default 30)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    settings = [int(value) for value in args.cache_s.split(",")]
    runs = [measure(cache_s, args.calls, plain=i == 0) for i, cache_s in enumerate(settings)]
    plain = runs[0]["plain_mlflow_search"]["median_ms"]
    for run in runs:
        for who in ("pipeline", "reader"):
            run[f"ratio_{who}_to_plain"] = round(run[f"mlflow_search_{who}"]["median_ms"] / plain, 2)
    result = {"benchmark": "auth_latency", "cpu": _cpu(), "cores": os.cpu_count(), "runs": runs}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
