"""Cached `nextloc run` commands in a row: wall times, the slowest Prefect API request and flow of each.

    python benchmarks/cached_runs.py --runs 30
    python benchmarks/cached_runs.py --runs 60 --evidence test-artifacts/stall

Stops the project's local Prefect API (:mod:`services.local_api`), then runs ``.venv/bin/nextloc run``
(what ``make run`` runs; the data already cached) ``--runs`` times in the project folder with
``NEXTLOC_API_SLOW_S=0``: the first run starts the local API, which then logs every request with its
duration in ``.prefect/nextloc-api.log``; the later runs use it. A watchdog polls every 0.5 s: when a run
passes ``--factor`` x the median of the runs so far (after 3), it takes ``py-spy dump --native`` of the
server, the command and any process holding the Prefect database's write lock (``pip install py-spy``; root
or ptrace permission) and keeps them with the server's log and the command's output under
``--evidence``/run-NNN/. Prints one JSON object: each run's wall time, its slowest request (method, path,
seconds) and flow (name, seconds from its "Beginning" to its "Finished" log line), the median, the max and
max/median. The local API is stopped at the end (the next command starts it anew, with the usual log).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from services import local_api  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PREFECT_DB = REPO / ".prefect" / "prefect.db"  # PREFECT_HOME=./.prefect (flows.configure_environment)
API_LOG = REPO / ".prefect" / local_api.LOG
#: What the Makefile exports for `make run`.
MAKE_ENV = {
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}
REQUEST = re.compile(r"slow request: (\S+) (\S+) took ([\d.]+) s")
FLOW = re.compile(
    r"^(\d\d:\d\d:\d\d\.\d{3}) \| \w+ +\| Flow run (['\"])(.+?)\2 - (Beginning (?:sub)?flow run|Finished in)"
)


def requests(log: Path, start: int) -> list[dict[str, Any]]:
    """The requests the server logged (method, path, seconds) after byte ``start`` of its log."""
    if not log.is_file():
        return []
    with log.open(errors="replace") as text:
        text.seek(start)
        found = (REQUEST.search(line) for line in text.read().splitlines())
        return [{"method": m.group(1), "path": m.group(2), "s": float(m.group(3))} for m in found if m]


def flows(output: str) -> list[dict[str, Any]]:
    """Each flow run's seconds from its "Beginning ... flow run" to its "Finished in state" log line."""
    began: dict[str, datetime] = {}
    times = []
    for line in output.splitlines():
        m = FLOW.match(line)
        if not m:
            continue
        at = datetime.strptime(m.group(1), "%H:%M:%S.%f")
        if m.group(4).startswith("Beginning"):
            began[m.group(3)] = at
        elif m.group(3) in began:
            times.append({"name": m.group(3), "s": round((at - began.pop(m.group(3))).total_seconds(), 3)})
    return times


def server_pid() -> int | None:
    """The local API's pid, from its record."""
    record = local_api.read_record(PREFECT_DB.parent)
    return record["pid"] if record else None


def wal_lock_holders(shm: Path) -> dict[int, list[str]]:
    """Processes holding SQLite's WAL write / checkpoint / recovery lock on the database (bytes 120-122 of
    its ``-shm`` file, POSIX locks in /proc/locks): who a waiting writer waits for."""
    names = {"120": "write", "121": "checkpoint", "122": "recover"}
    holders: dict[int, list[str]] = {}
    with contextlib.suppress(OSError):
        inode = shm.stat().st_ino
        for line in Path("/proc/locks").read_text().splitlines():
            f = line.split()  # 1: POSIX  ADVISORY  WRITE 1234 fe:00:5678 120 120
            if len(f) >= 8 and f[1] == "POSIX" and f[5].endswith(f":{inode}") and f[6] in names:
                holders.setdefault(int(f[4]), []).append(names[f[6]])
    return holders


def capture(folder: Path, command_pid: int, why: str) -> None:
    """py-spy dumps (every thread, native frames) of the server, the command and any other process holding
    the Prefect database's WAL write lock, into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy") or str(BIN / "py-spy")
    pids = {"command": command_pid}
    pids["server"] = server_pid() or 0
    holders = wal_lock_holders(PREFECT_DB.with_name(PREFECT_DB.name + "-shm"))
    pids.update({f"lock-holder-{pid}": pid for pid in holders if pid not in pids.values()})
    lines = [f"{time.strftime('%H:%M:%S')} {why}", f"WAL lock holders (pid: locks): {holders}"]
    for name, pid in pids.items():
        if not pid:
            continue
        dump = subprocess.run(
            [py_spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
        (folder / f"pyspy-{name}-{pid}.txt").write_text(dump.stdout + dump.stderr)
        lines.append(f"{name} pid {pid}: py-spy exit {dump.returncode}")
    with (folder / "watchdog.txt").open("a") as out:
        out.write("\n".join(lines) + "\n")


def one_run(i: int, args: argparse.Namespace, walls: list[float], tmp: Path) -> dict[str, Any]:
    """One `nextloc run`, watched; its wall time, slowest request and flow, and where its evidence is."""
    out_path = tmp / f"out-{i:03d}.txt"
    env = {**os.environ, **MAKE_ENV, "NEXTLOC_API_SLOW_S": "0", "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as make runs it: imports read cached bytecode
    evidence = Path(args.evidence) / f"run-{i:03d}"
    log_start = API_LOG.stat().st_size if API_LOG.exists() else 0
    captured = None
    start = time.perf_counter()
    with out_path.open("w") as out:
        process = subprocess.Popen(args.command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        while process.poll() is None:
            time.sleep(0.5)
            elapsed = time.perf_counter() - start
            limit = args.factor * statistics.median(walls) if len(walls) >= 3 else float("inf")
            if captured is None and elapsed > limit:
                captured = f"run at {elapsed:.1f} s (limit {limit:.1f} s)"
                capture(evidence, process.pid, captured)
    wall = time.perf_counter() - start
    done = requests(API_LOG, log_start)
    output = out_path.read_text(errors="replace")
    flow_times = flows(output)
    slowest = max(done, key=lambda r: r["s"], default=None)
    if captured or (slowest and slowest["s"] > args.slow_request) or process.returncode:
        evidence.mkdir(parents=True, exist_ok=True)
        shutil.copy(API_LOG, evidence / "api.log")
        shutil.copy(out_path, evidence / "command.txt")
    return {
        "run": i,
        "wall_s": round(wall, 2),
        "exit": process.returncode,
        "api": "started" if "local Prefect API started" in " ".join(output.split()) else "running",
        "requests": len(done),
        "slowest_request": slowest,
        "slowest_flow": max(flow_times, key=lambda f: f["s"], default=None),
        "evidence": str(evidence) if evidence.exists() else None,
        "watchdog": captured,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--evidence", default=str(REPO / "test-artifacts" / "stall"))
    parser.add_argument("--factor", type=float, default=2.0, help="x the running median: a slow run")
    parser.add_argument(
        "--slow-request", type=float, default=10.0, help="s: a request whose run keeps evidence"
    )
    parser.add_argument("--command", nargs="+", default=[str(REPO / ".venv" / "bin" / "nextloc"), "run"])
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    local_api.stop_server(PREFECT_DB.parent)  # the first run starts it with NEXTLOC_API_SLOW_S=0
    with tempfile.TemporaryDirectory(prefix="nextloc-cached-runs-") as tmp:
        for i in range(args.runs):
            run = one_run(i, args, [r["wall_s"] for r in runs], Path(tmp))
            runs.append(run)
            print(f"run {i + 1}/{args.runs}: {json.dumps(run)}", file=sys.stderr, flush=True)
    walls = [r["wall_s"] for r in runs]
    median = statistics.median(walls)
    summary = {"runs": len(walls), "median_s": median, "max_s": max(walls)}
    summary["max_over_median"] = round(max(walls) / median, 2)
    summary["slow_runs"] = [r["run"] for r in runs if r["wall_s"] > args.factor * median]
    local_api.stop_server(PREFECT_DB.parent)  # not left logging every request
    print(json.dumps({**summary, "per_run": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
