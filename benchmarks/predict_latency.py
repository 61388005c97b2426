"""Latency of one answer: ``nextloc predict`` from a cold process, and ``nextloc serve`` request by request.

Used by ``benchmarks/predict.py --cold`` / ``--serve``. The request is one week of one user's visits from a
preprocessed dataset (each place at its location's centre, a place outside the vocabulary far away), as the
MLflow serving body (``dataframe_records``) that ``nextloc predict`` also reads. Commands run from
``--source`` (a checkout of the code; default this one) against this store, with bytecode caches on (the
environment's ``PYTHONDONTWRITEBYTECODE`` is dropped: an installed package has its ``.pyc``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def week_request(data_dir: Path, user: int, k: int = 5) -> dict[str, Any]:
    """The user's visits in the 7 days before the end of their last one, as a serving request."""
    sp = pd.read_parquet(data_dir / "staypoints.parquet")
    centres = pd.read_parquet(data_dir / "vocabulary" / "locations.parquet").set_index("loc_index")
    mine = sp[sp["user_id"] == user].sort_values("started_at")
    if mine.empty:
        raise SystemExit(f"user {user} has no staypoints in {data_dir}")
    week = mine[mine["started_at"] >= mine["finished_at"].iloc[-1] - pd.Timedelta(days=7)]
    known = week["location_id"].to_numpy() >= 2
    lat = centres["latitude"].reindex(week["location_id"]).to_numpy()
    lon = centres["longitude"].reindex(week["location_id"]).to_numpy()
    frame = pd.DataFrame(
        {
            "user_id": user,
            "started_at": week["started_at"].dt.strftime("%Y-%m-%dT%H:%M:%SZ").to_numpy(),
            "finished_at": week["finished_at"].dt.strftime("%Y-%m-%dT%H:%M:%SZ").to_numpy(),
            "latitude": np.where(known, lat, -33.86),
            "longitude": np.where(known, lon, 151.21),
        }
    )
    return {"dataframe_records": frame.to_dict(orient="records"), "params": {"k": k}}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = ""
    return env


def _cli(args: argparse.Namespace, *command: str) -> list[str]:
    store = ["--tracking-uri", args.tracking_uri, "--experiment", args.experiment]
    return [sys.executable, "-m", "flows.cli", *command, *store]


def cold_predict(args: argparse.Namespace, history: Path) -> dict[str, Any]:
    """Median wall time of ``nextloc predict`` over ``args.repeats`` fresh processes (after one unmeasured)."""
    cmd = _cli(args, "predict", "--model", args.model, "--history", str(history), "-k", "5")
    times, answer = [], None
    for i in range(args.repeats + 1):
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=args.source, env=_env(), capture_output=True, text=True, check=True)
        if i:
            times.append(time.perf_counter() - start)
        answer = json.loads(out.stdout)
    return {
        "median_s": round(statistics.median(times), 3),
        "runs_s": [round(t, 3) for t in times],
        "answer": answer,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def served_latency(args: argparse.Namespace, body: bytes) -> dict[str, Any]:
    """p50 and p95 of ``args.requests`` POSTs, one after another, to ``nextloc serve`` (after 3 unmeasured)."""
    port = _free_port()
    cmd = _cli(args, "serve", "--model", args.model, "--port", str(port))
    server = subprocess.Popen(
        cmd,
        cwd=args.source,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise SystemExit(f"nextloc serve exited with code {server.returncode}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/ping", timeout=2):
                break
            time.sleep(0.5)
        times, answer = [], None
        for i in range(args.requests + 3):
            request = urllib.request.Request(
                f"{url}/invocations", body, {"Content-Type": "application/json"}, method="POST"
            )
            start = time.perf_counter()
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.loads(response.read())["predictions"]
            if i >= 3:
                times.append(time.perf_counter() - start)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    ms = np.array(times) * 1000
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p95_ms": round(float(np.percentile(ms, 95)), 1),
        "requests": len(times),
        "answer": answer,
    }


def latency_report(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON report of ``--cold`` and/or ``--serve``."""
    from tasks.tracking import default_tracking_uri

    args.tracking_uri = args.tracking_uri or default_tracking_uri(REPO)
    request = week_request(args.data_dir, args.user)
    report: dict[str, Any] = {
        "model": args.model,
        "user": args.user,
        "visits": len(request["dataframe_records"]),
        "source": str(Path(args.source).resolve()),
    }
    with tempfile.TemporaryDirectory() as tmp:
        history = Path(tmp) / "visits.json"
        history.write_text(json.dumps(request))
        if args.cold:
            report["cold_predict"] = cold_predict(args, history)
        if args.serve:
            report["serve"] = served_latency(args, history.read_bytes())
    return report
