"""Load on the services: a burst of deployment runs against `nextloc services start`, PostgreSQL or SQLite.

Starts the services (``--backend postgres|sqlite``) in a fresh project folder on free 127.0.0.1 ports,
with ``NEXTLOC_SERVE_LIMIT`` raised so every run of the burst executes at once, then triggers through the
Prefect REST API, all within a second:

* ``--runs`` (default 6) runs of ``preprocess-train/geolife`` on the GeoLife sample, seed ``i``, each in its
  own data folder (runs on one data folder take turns by design), short training (``markov``; ``--neural``
  adds ``mhsa`` capped at one epoch);
* one ``retrain/geolife-dumps`` run that merges a dump (one sample user) into a raw store holding the others.

While the burst runs it polls ``GET /api/health`` and ``POST /api/flow_runs/filter`` (limit 10) every
0.25 s (bounded by ``--timeout``) and records their latencies. Then it checks: every flow run's final
state; ``503`` / ``database is locked`` lines in every service log; every MLflow run's status; the
``champion`` alias of every registered model; the ``ERROR`` lines of PostgreSQL's log (the race Prefect's
task-run recorder retries itself counted apart, with any event it gave up on). Prints one JSON
object; stops the services. ``--bursts 10`` runs ten bursts in a row, each on fresh services, and prints
each burst's outcome and API latencies.

    python benchmarks/services_load.py --backend postgres
    python benchmarks/services_load.py --backend postgres --bursts 10
    python benchmarks/services_load.py --backend sqlite

Everything stays on 127.0.0.1; request count and time are bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from services import auth
from services.layout import Services
from services.processes import free_port_env
from tracking import access

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SAMPLE = REPO.parent / "shared" / "data" / "geolife-sample"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
#: What counts as a database error in a service log: an HTTP 503 (Prefect's answer to a locked SQLite,
#: logged by the server as "Encountered retryable exception" with PREFECT_API_LOG_RETRYABLE_ERRORS, which
#: the load turns on: by default the server answers 503 silently) or SQLite's own message.
DB_ERROR = re.compile(
    r'" 503\b|status code 503|\b503 Service Unavailable|database is locked|Encountered retryable exception',
    re.IGNORECASE,
)


#: An error PostgreSQL logged: a statement it refused (a duplicate key: two clients inserting one row).
PG_ERROR = re.compile(r"\b(ERROR|FATAL|PANIC):  ")
#: The one PostgreSQL error Prefect's server makes and recovers from itself: its task-run recorder checks which
#: task runs exist, then upserts, and a concurrent insert of the same task run between the two is refused;
#: the recorder retries the batch once in a fresh session (``record_bulk_task_run_events``; upstream
#: PrefectHQ/prefect#21807 and #21726). Counted apart, and recovered only if no event was given up on.
RECORDER_RACE = re.compile(
    r'ERROR:  duplicate key value violates unique constraint "(pk_task_run|uq_task_run__\w+)"'
)
#: What the recorder logs when the retry failed too: the task run's event is lost.
RECORDER_LOST = re.compile(
    r"Duplicate task_run, discarding event|Error flushing \d+ events \(\d+ to retry, [1-9]\d* dropped"
)


#: HTTP errors this script met, by status code (its own requests, retried as Prefect's client does).
CLIENT_HTTP_ERRORS: dict[int, int] = {}
#: The pipeline's credentials for the Prefect API (``make services`` turns authentication on), set by
#: :func:`run_load` once the services have started.
PREFECT_HEADERS: dict[str, str] = {}


def _request(url: str, body: dict | None = None, timeout: float = 30.0, attempts: int = 1) -> Any:
    """GET (or POST ``body``) JSON; a 503/429 is counted and, with ``attempts`` > 1, retried after 1, 2, 4 s."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        headers={"Content-Type": "application/json", **PREFECT_HEADERS},
        method="GET" if body is None else "POST",
    )
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            CLIENT_HTTP_ERRORS[err.code] = CLIENT_HTTP_ERRORS.get(err.code, 0) + 1
            if err.code not in (429, 503) or attempt == attempts - 1:
                raise
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _latency_summary(values: list[float], errors: int) -> dict[str, Any]:
    return {
        "n": len(values),
        "errors": errors,
        "p50_ms": None if not values else round(1000 * _percentile(values, 0.50), 1),
        "p95_ms": None if not values else round(1000 * _percentile(values, 0.95), 1),
        "max_ms": None if not values else round(1000 * max(values), 1),
        "mean_ms": None if not values else round(1000 * statistics.fmean(values), 1),
    }


def prepare(root: Path, sample: Path, dump_user: str = "099") -> None:
    """A raw store with every sample user but ``dump_user``, and that user as a dump in ``data/incoming``."""
    store = root / "raw" / "store" / "Data"
    store.mkdir(parents=True)
    for user in sorted((sample / "Data").iterdir()):
        if user.name != dump_user:
            shutil.copytree(user, store / user.name)
    incoming = root / "data" / "incoming" / f"dump-{dump_user}" / "Data"
    incoming.mkdir(parents=True)
    shutil.copytree(sample / "Data" / dump_user, incoming / dump_user)


def run_load(
    backend: str,
    root: Path,
    sample: Path = SAMPLE,
    runs: int = 6,
    neural: bool = False,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """Start the services in ``root``, run the burst, check it, stop the services; the numbers as a dict."""
    prepare(root, sample)
    env = {
        **os.environ,
        "NEXTLOC_SERVICES_BACKEND": backend,
        **free_port_env(),
        "NEXTLOC_SERVE_LIMIT": str(runs + 2),
        "PREFECT_HOME": str(root / ".prefect"),
        "PYTHONPATH": str(REPO),
        "NEXTLOC_TORCH_THREADS": "1",
        "PREFECT_API_LOG_RETRYABLE_ERRORS": "true",  # the server logs every 503 it answers
    }
    for key in ("PREFECT_API_URL", "NEXTLOC_DB_URL", "NEXTLOC_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    api = f"http://127.0.0.1:{env['NEXTLOC_PREFECT_PORT']}/api"
    nextloc = str(BIN / "nextloc")
    t0 = time.monotonic()
    started = subprocess.run(
        [nextloc, "services", "start"], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    startup_s = time.monotonic() - t0
    result: dict[str, Any] = {
        "backend": backend,
        "runs_triggered": runs + 1,
        "services_start_s": round(startup_s, 1),
    }
    try:
        if started.returncode != 0:
            raise RuntimeError(f"services did not start: {started.stderr[-3000:]}")
        pipeline = auth.credentials(Services(root, db_url=None), auth.PIPELINE)
        PREFECT_HEADERS.update(access.authorization(pipeline[access.PREFECT_AUTH]))
        result.update(_burst(api, root, sample, runs, neural, timeout_s))
        result.update(_check_mlflow(root, pipeline))
    finally:
        stopped = subprocess.run(
            [nextloc, "services", "stop"], cwd=root, env=env, capture_output=True, text=True, timeout=300
        )
        result["services_stopped"] = stopped.returncode == 0
        PREFECT_HEADERS.clear()
        result.update(_scan_logs(root))
    return result


def _burst(api: str, root: Path, sample: Path, runs: int, neural: bool, timeout_s: float) -> dict[str, Any]:
    flows = {f["id"]: f["name"] for f in _request(f"{api}/flows/filter", {})}
    deployments = {
        f"{flows.get(d['flow_id'], '?')}/{d['name']}": d["id"]
        for d in _request(f"{api}/deployments/filter", {})
    }
    models = ["markov", "mhsa"] if neural else ["markov"]
    train = {"mhsa": {"max_epochs": 1, "min_epochs": 0}} if neural else None
    requests = [
        (
            "preprocess-train/geolife",
            {
                "raw_dir": str(sample),
                "data_dir": f"data/load-{i}",
                "training": {"models": models, "seeds": [i], "workers": 1, "train_overrides": train},
            },
        )
        for i in range(runs)
    ]
    requests.append(
        (
            "retrain/geolife-dumps",
            {
                "incoming_dir": "data/incoming",
                "raw_dir": "raw/store",
                "data_dir": "data/load-retrain",
                "training": {"models": models, "seeds": [0], "workers": 1, "train_overrides": train},
                "intake": {"min_age_s": 0.0},
            },
        )
    )
    t_start = time.monotonic()
    ids = []
    for name, parameters in requests:
        body = {"parameters": {k: v for k, v in parameters.items() if v is not None}}
        ids.append(_request(f"{api}/deployments/{deployments[name]}/create_flow_run", body, attempts=6)["id"])
    trigger_s = time.monotonic() - t_start

    health: list[float] = []
    reads: list[float] = []
    health_errors = read_errors = 0
    error_kinds: dict[str, int] = {}  # failed polls by exception (HTTP errors are also in CLIENT_HTTP_ERRORS)
    states: dict[str, str] = {}
    finished_at: dict[str, float] = {}
    deadline = t_start + timeout_s
    last_state_poll = 0.0
    while time.monotonic() < deadline:
        t = time.monotonic()
        try:
            _request(f"{api}/health", timeout=10)
            health.append(time.monotonic() - t)
        except OSError as err:
            health_errors += 1
            error_kinds[type(err).__name__] = error_kinds.get(type(err).__name__, 0) + 1
        t = time.monotonic()
        try:
            _request(f"{api}/flow_runs/filter", {"limit": 10, "sort": "EXPECTED_START_TIME_DESC"}, timeout=10)
            reads.append(time.monotonic() - t)
        except OSError as err:
            read_errors += 1
            error_kinds[type(err).__name__] = error_kinds.get(type(err).__name__, 0) + 1
        if time.monotonic() - last_state_poll > 2.0:
            last_state_poll = time.monotonic()
            try:
                listed = _request(f"{api}/flow_runs/filter", {"flow_runs": {"id": {"any_": ids}}})
            except OSError:
                listed = []
            for run in listed:
                states[run["id"]] = run["state_type"]
                if run["state_type"] in TERMINAL and run["id"] not in finished_at:
                    finished_at[run["id"]] = time.monotonic() - t_start
            if len(finished_at) == len(ids):
                break
        time.sleep(0.25)
    wall_s = time.monotonic() - t_start
    final = [states.get(i, "UNKNOWN") for i in ids]
    failed = [i for i, state in zip(ids, final, strict=True) if state != "COMPLETED"]
    return {
        "failed_runs": [_failure(api, run_id) for run_id in failed],
        "trigger_s": round(trigger_s, 2),
        "burst_wall_s": round(wall_s, 1),
        "timed_out": len(finished_at) < len(ids),
        "flow_run_states": {s: final.count(s) for s in sorted(set(final))},
        "flow_run_end_s": sorted(round(v, 1) for v in finished_at.values()),
        "flow_run_ids": ids,
        "api_health_latency": _latency_summary(health, health_errors),
        "api_flow_run_read_latency": _latency_summary(reads, read_errors),
        "api_poll_errors": error_kinds,
        "client_http_errors": {str(k): v for k, v in sorted(CLIENT_HTTP_ERRORS.items())},
    }


def _failure(api: str, run_id: str) -> dict[str, Any]:
    """What a run that did not complete says: its name, state message and last log lines (from the API)."""
    try:
        run = _request(f"{api}/flow_runs/{run_id}", None, timeout=10)
        body = {"logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_DESC", "limit": 40}
        logs = _request(f"{api}/logs/filter", body, timeout=10)
    except OSError as err:
        return {"id": run_id, "unreadable": f"{type(err).__name__}: {err}"}
    return {
        "id": run_id,
        "name": run.get("name"),
        "state": (run.get("state") or {}).get("type"),
        "message": ((run.get("state") or {}).get("message") or "")[:2000],
        "log_tail": [entry.get("message", "")[:1500] for entry in reversed(logs)],
    }


def _check_mlflow(root: Path, login: dict[str, str]) -> dict[str, Any]:
    """Every run's status and every registered model's champion, read from the services' store as the
    pipeline's user (``login``: its variables, which MLflow's client reads from the environment)."""
    saved = {key: os.environ.get(key) for key in login}
    os.environ.update(login)
    try:
        return _read_mlflow(root)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _read_mlflow(root: Path) -> dict[str, Any]:
    from mlflow import MlflowClient

    uri = json.loads((root / ".services" / "client.json").read_text())["tracking_uri"]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, max_results=5000)
    statuses = [r.info.status for r in runs]
    champions: dict[str, int] = {}
    for model in client.search_registered_models():
        versions = client.search_model_versions(f"name = '{model.name}'")
        # search results carry no aliases: read each version
        champions[model.name] = sum(
            "champion" in (client.get_model_version(model.name, v.version).aliases or []) for v in versions
        )
    return {
        "mlflow_runs": len(runs),
        "mlflow_parent_runs": sum(r.data.tags.get("kind") == "pipeline" for r in runs),
        "mlflow_run_statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
        "champions_per_model": champions,
    }


def _scan_logs(root: Path) -> dict[str, Any]:
    """Lines of every service log that show a 503 or a locked database, and the errors PostgreSQL logged:
    the first few, and counts."""
    hits: dict[str, list[str]] = {}
    total = answered_503 = 0
    lost: list[str] = []
    for log_file in sorted((root / ".services").glob("*.log")):
        lines = [line.strip()[:300] for line in log_file.read_text(errors="replace").splitlines()]
        lost += [f"{log_file.name}: {line}" for line in lines if RECORDER_LOST.search(line)]
        matched = [line for line in lines if DB_ERROR.search(line)]
        total += len(matched)
        answered_503 += sum("Encountered retryable exception" in line for line in matched)
        if matched:
            hits[log_file.name] = matched[:5] + (
                [f"... {len(matched)} lines in all"] if len(matched) > 5 else []
            )
    pg_log = root / ".services" / "postgres.log"
    pg_lines = pg_log.read_text(errors="replace").splitlines() if pg_log.is_file() else []
    pg_errors = [line.strip()[:300] for line in pg_lines if PG_ERROR.search(line)]
    races = [line for line in pg_errors if RECORDER_RACE.search(line)]
    pg_errors = [line for line in pg_errors if not RECORDER_RACE.search(line)]
    return {
        "db_error_lines": hits,
        "db_error_count": total,
        "server_503_count": answered_503,
        "postgres_error_count": len(pg_errors),
        "postgres_error_lines": pg_errors[:10],
        "task_run_recorder_races": len(races),
        "task_run_recorder_lost_events": lost[:10],
    }


def _bursts(args: argparse.Namespace) -> dict[str, Any]:
    """``--bursts N``: N bursts in a row, each on freshly started services in a fresh folder."""
    results = []
    for i in range(args.bursts):
        root = Path(tempfile.mkdtemp(prefix=f"nextloc-load-{args.backend}-", dir="/tmp"))
        root.chmod(0o755)
        try:
            results.append(run_load(args.backend, root, args.sample, args.runs, args.neural, args.timeout))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        CLIENT_HTTP_ERRORS.clear()
        done = results[-1]["flow_run_states"].get("COMPLETED", 0)
        print(f"burst {i + 1}/{args.bursts}: {done}/{args.runs + 1} completed", file=sys.stderr)
    keep = (
        "flow_run_states",
        "burst_wall_s",
        "postgres_error_count",
        "task_run_recorder_races",
        "task_run_recorder_lost_events",
        "db_error_count",
        "failed_runs",
    )
    return {
        "backend": args.backend,
        "bursts": len(results),
        "all_completed": all(r["flow_run_states"] == {"COMPLETED": args.runs + 1} for r in results),
        "postgres_error_count": sum(r.get("postgres_error_count", 0) for r in results),
        "db_error_count": sum(r["db_error_count"] for r in results),
        "per_burst": [
            {
                **{k: r.get(k) for k in keep},
                "health_p50_ms": r["api_health_latency"]["p50_ms"],
                "health_p95_ms": r["api_health_latency"]["p95_ms"],
                "read_p50_ms": r["api_flow_run_read_latency"]["p50_ms"],
                "read_p95_ms": r["api_flow_run_read_latency"]["p95_ms"],
            }
            for r in results
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["postgres", "sqlite"], required=True)
    parser.add_argument("--runs", type=int, default=6, help="preprocess-train runs (plus one retrain run)")
    parser.add_argument("--neural", action="store_true", help="also train mhsa, capped at one epoch")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the burst may take")
    parser.add_argument("--sample", type=Path, default=SAMPLE)
    parser.add_argument("--keep", action="store_true", help="keep the project folder (logs) afterwards")
    parser.add_argument("--bursts", type=int, default=1, help="bursts in a row, each on fresh services")
    args = parser.parse_args()
    if args.bursts > 1:
        print(json.dumps(_bursts(args), indent=1))
        return 0
    root = Path(tempfile.mkdtemp(prefix=f"nextloc-load-{args.backend}-", dir="/tmp"))
    root.chmod(0o755)  # as root, PostgreSQL runs as the postgres user, which must reach .services/pg
    try:
        result = run_load(args.backend, root, args.sample, args.runs, args.neural, args.timeout)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    result["root"] = str(root) if args.keep else None
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
