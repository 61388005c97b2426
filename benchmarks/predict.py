"""Batch scoring benchmark: N histories of visits -> answers, with the registered champion.

Builds ``--n`` histories (``history_id`` 0..N-1) from a preprocessed dataset's test samples, cycling over
them: each history is the sample's visits (real times, each place at its location's centre, a new place
far away), written as ``many_users.parquet``; then times each step of ``nextloc predict`` in-process and
prints JSON. Time the command itself with::

    python benchmarks/predict.py --data-dir data/geolife --out /tmp/many_users.parquet --write-only
    time nextloc predict --model pointer_plus --history /tmp/many_users.parquet > /tmp/answers.json

``--cold`` times one answer from a cold process instead: ``nextloc predict`` for one week of one user's
visits (``--user``, default 153), ``--repeats`` fresh processes (median; one unmeasured run first writes the
bytecode caches, and the environment's ``PYTHONDONTWRITEBYTECODE`` is dropped: an installed package has its
``.pyc``). ``--serve`` times ``nextloc serve``: ``--requests`` POSTs of the same week, one after another
(p50, p95). ``--source DIR`` runs the commands from another checkout of the code (the numbers before a
change) against this store and data. Both print JSON::

    python benchmarks/predict.py --model ranker --cold --serve --source /tmp/nextloc-before
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
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]


def many_histories(data_dir: Path, n: int) -> pd.DataFrame:
    sp = pd.read_parquet(data_dir / "staypoints.parquet").set_index("id")
    centres = pd.read_parquet(data_dir / "vocabulary" / "locations.parquet").set_index("loc_index")
    table = pq.read_table(data_dir / "samples" / "test.parquet")
    targets = table.column("staypoint_id").to_numpy()
    lengths = table.column("hist_len").to_numpy()
    frames = []
    for h in range(n):
        i = h % len(targets)
        pos = sp.index.get_loc(targets[i])
        rows = sp.iloc[pos - lengths[i] : pos]
        known = rows["location_id"].to_numpy() >= 2
        frames.append(
            pd.DataFrame(
                {
                    "history_id": h,
                    "user_id": rows["user_id"].to_numpy(np.int64),
                    "started_at": rows["started_at"].to_numpy(),
                    "finished_at": rows["finished_at"].to_numpy(),
                    "latitude": np.where(
                        known, centres["latitude"].reindex(rows["location_id"]).to_numpy(), -45.0
                    ),
                    "longitude": np.where(
                        known, centres["longitude"].reindex(rows["location_id"]).to_numpy(), 170.0
                    ),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


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
    return [sys.executable, "-m", "commands.main", *command, *store]


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
    from tracking.mlflow_runs import default_tracking_uri

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data/geolife"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/many_users.parquet"))
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--model", default="pointer_plus")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--experiment", default="nextloc-geolife")
    parser.add_argument("--write-only", action="store_true")
    parser.add_argument("--cold", action="store_true", help="time `nextloc predict` from a cold process")
    parser.add_argument("--serve", action="store_true", help="time requests to `nextloc serve`")
    parser.add_argument("--user", type=int, default=153)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--source", type=Path, default=REPO)
    args = parser.parse_args()
    if args.cold or args.serve:
        print(json.dumps(latency_report(args)))
        return

    visits = many_histories(args.data_dir, args.n)
    visits.to_parquet(args.out, index=False)
    report = {"histories": args.n, "visits": len(visits), "file": str(args.out)}
    if not args.write_only:
        from nextloc.predict.answer import predict
        from nextloc.predict.histories import encode_visits
        from nextloc.predict.history_reader import read_history
        from tracking.registered import load_registered

        t0 = time.perf_counter()
        bundle = load_registered(args.model, "champion", args.tracking_uri, args.experiment)
        t1 = time.perf_counter()
        raw = read_history(args.out, bundle.preprocess)
        t2 = time.perf_counter()
        histories = encode_visits(raw.data, bundle)
        t3 = time.perf_counter()
        answers = predict(bundle, histories, k=5)
        t4 = time.perf_counter()
        report.update(
            answers=len(answers),
            locations=len(bundle.locations),
            load_model_s=round(t1 - t0, 2),
            read_and_check_s=round(t2 - t1, 2),
            encode_s=round(t3 - t2, 2),
            score_s=round(t4 - t3, 2),
            total_s=round(t4 - t1, 2),
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
