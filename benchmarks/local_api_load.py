"""The local Prefect API under writers at once: Prefect's own pool of SQLite connections against one.

    python benchmarks/local_api_load.py                       # 3 clients, 90 s each, both servers
    python benchmarks/local_api_load.py --clients 4 --seconds 240

For each server, in the same run: a fresh Prefect home, the local API's server (``python -m
services.local_api``) on a free 127.0.0.1 port, then ``--clients`` processes that each run flows of 60
tasks (8 threads) one after the other for ``--seconds``, against that server (``PREFECT_API_URL``,
Prefect's client retries as shipped). ``reference`` is the server with Prefect's own engine (SQLAlchemy's
pool: up to 15 connections, each a SQLite writer); ``nextloc`` is the server as shipped, with one
connection (:func:`runtime.compat.one_sqlite_connection`). Prints one JSON object: per server, the flows
each client finished, the clients that failed (and why), the median and slowest flow, flows over 10 s,
and the server log's ``database is locked`` and slow-request lines; then the ratio of flows finished.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from services import local_api  # noqa: E402

CLIENT = """
import json, sys, time
from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner

@task
def double(i):
    return 2 * i

@flow(task_runner=ThreadPoolTaskRunner(max_workers=8))
def burst(n):
    return sum(f.result() for f in double.map(range(n)))

deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    start = time.perf_counter()
    burst(60)
    print(json.dumps({"flow_s": round(time.perf_counter() - start, 3)}), flush=True)
"""

#: The server with Prefect's own engine: the shim is replaced before the server's app is built.
REFERENCE_SERVER = (
    "import runpy, runtime.compat; runtime.compat.one_sqlite_connection = lambda: None; "
    "runpy.run_module('services.local_api', run_name='__main__')"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_server(label: str, clients: int, seconds: float) -> dict[str, Any]:
    """One server in a fresh home, ``clients`` client processes against it; what they and its log show."""
    home = Path(tempfile.mkdtemp(prefix=f"nextloc-api-load-{label}-"))
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "NEXTLOC_API_SLOW_S": "5", "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    server_cmd = [sys.executable, "-m", "services.local_api"]
    if label == "reference":
        server_cmd = [sys.executable, "-c", REFERENCE_SERVER]
    log = home / "nextloc-api.log"
    with log.open("ab") as out:
        server = subprocess.Popen(
            [*server_cmd, "--port", str(port)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        api = local_api.LocalAPI(home, server.pid, port, started_here=True)
        api.wait(120)  # as a command waits: fails with the server's log if it exits or does not answer
        url = api.url
        client_env = {**env, "PREFECT_API_URL": url, "PREFECT_LOGGING_LEVEL": "WARNING"}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CLIENT, str(seconds)],
                cwd=REPO,
                env=client_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(clients)
        ]
        outputs = [proc.communicate(timeout=seconds + 600) for proc in procs]
    finally:
        server.terminate()
        server.wait(timeout=60)
    flows = [
        [json.loads(line)["flow_s"] for line in out.splitlines() if line.startswith("{")]
        for out, _ in outputs
    ]
    every = [s for client in flows for s in client]
    text = log.read_text(errors="replace")
    return {
        "flows_per_client": [len(f) for f in flows],
        "flows": len(every),
        "failed_clients": [
            err.strip().splitlines()[-1][:300]
            for proc, (_, err) in zip(procs, outputs, strict=True)
            if proc.returncode
        ],
        "flow_median_s": round(statistics.median(every), 2) if every else None,
        "flow_max_s": max(every, default=None),
        "flows_over_10_s": sum(s > 10 for s in every),
        "database_is_locked_lines": text.count("database is locked"),
        "slow_request_lines": text.count("slow request"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=90.0, help="how long each client starts flows")
    args = parser.parse_args()
    out: dict[str, Any] = {"clients": args.clients, "seconds": args.seconds, "cpus": os.cpu_count()}
    for label in ("reference", "nextloc"):
        out[label] = run_server(label, args.clients, args.seconds)
    out["ratio_flows"] = round(out["nextloc"]["flows"] / max(1, out["reference"]["flows"]), 2)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
