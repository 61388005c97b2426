"""Benchmark: full GeoLife raw -> samples, cold and cached, against the reference pipeline in the same run.

Each measured run is a fresh subprocess, so its wall time, CPU time (user+sys of the process tree) and
peak RSS are its own. Prints one JSON object on stdout:

    python benchmarks/preprocess.py                    # nextloc cold + cached + the reference (about 8 min)
    python benchmarks/preprocess.py --skip-reference   # nextloc only (about 1 min)

``cold`` = empty data directory and task cache (the Prefect API database is warm); ``cached`` = the same
command again. ``command_cold``/``command_cached`` time the user's command itself, ``nextloc preprocess``
(interpreter start, imports, Prefect's temporary API and the flow), on a fresh data directory. ``flow_wall_s`` is the flow alone, ``prefect_api_start_s`` the start of Prefect's temporary
local API before it, and ``wall_s`` the whole process (interpreter start and imports included). The reference is ``benchmarks/reference_preprocess.py``: the published
protocol written the reference's way (trackintel end to end, pandas row loops).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from flows import OFFLINE_DEFAULTS

REPO = Path(__file__).resolve().parents[1]
ARCHIVE = REPO.parent / "shared" / "data" / "geolife-1.3-raw.tar.xz"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--raw-dir", type=Path, default=None, help="GeoLife root (default: unpack ../shared archive)"
    )
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "nextloc-bench")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--worker", choices=["nextloc"], help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker(args.raw_dir, args.data_dir)

    raw = args.raw_dir or _unpack(args.work_dir)
    data_dir = args.work_dir / "out"
    shutil.rmtree(data_dir, ignore_errors=True)
    (args.work_dir / "prefect").mkdir(parents=True, exist_ok=True)
    env = {
        **_without_bytecode_switch(os.environ),
        "PREFECT_HOME": str(args.work_dir / "prefect"),
        **OFFLINE_DEFAULTS,
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    worker = [
        sys.executable,
        __file__,
        "--worker",
        "nextloc",
        "--raw-dir",
        str(raw),
        "--data-dir",
        str(data_dir),
    ]
    _measure(worker, env)  # warm the Prefect DB, numba's on-disk cache and the bytecode; not reported
    shutil.rmtree(data_dir, ignore_errors=True)
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "raw_dir": str(raw),
    }
    results["nextloc_cold"] = _measure(worker, env)
    results["nextloc_cached"] = _measure(worker, env)
    command_out = args.work_dir / "out-command"
    shutil.rmtree(command_out, ignore_errors=True)
    command = [str(Path(sys.executable).with_name("nextloc")), "preprocess", "--raw-dir", str(raw)]
    command += ["--data-dir", str(command_out)]
    results["command_cold"] = _measure(command, env)
    results["command_cached"] = _measure(command, env)
    meta = json.loads((data_dir / "metadata.json").read_text())
    results["dataset"] = {k: meta[k] for k in ("n_users", "total_loc_num", "n_staypoints", "n_samples")}
    if not args.skip_reference:
        ref_out = args.work_dir / "reference"
        shutil.rmtree(ref_out, ignore_errors=True)
        ref = [sys.executable, str(REPO / "benchmarks" / "reference_preprocess.py"), str(raw), str(ref_out)]
        results["reference"] = _measure(ref, env)
        ref_wall = results["reference"]["wall_s"]
        results["ratio"] = {
            "cold_speedup_wall": round(ref_wall / results["nextloc_cold"]["wall_s"], 2),
            "cached_speedup_wall": round(ref_wall / results["nextloc_cached"]["wall_s"], 2),
            "command_cold_speedup_wall": round(ref_wall / results["command_cold"]["wall_s"], 2),
            "peak_rss_ratio": round(
                results["reference"]["peak_rss_mb"] / results["nextloc_cold"]["peak_rss_mb"], 2
            ),
        }
    json.dump(results, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _without_bytecode_switch(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment less ``PYTHONDONTWRITEBYTECODE``, as ``make bench`` runs (the Makefile unexports it).

    With it set (many containers, this machine's shells) and an install that compiled nothing (uv), every
    measured process compiled each module it imported from source: 4-5 s of CPU in ``nextloc preprocess``
    and as much in Prefect's API process, on every run. Without it the unreported warm-up run caches the
    bytecode, as a user's first command does, and the runs measured are the steady state.
    """
    return {k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _worker(raw: Path, data_dir: Path) -> int:
    """Runs inside the measured subprocess: the preprocess flow, timed on its own."""
    from flows import configure_environment

    configure_environment(REPO)
    from prefect import flow

    from flows.preprocess import preprocess

    # Prefect's temporary local API (none is configured here) starts with the first flow of a process: a
    # fixed cost of the process, not of the pipeline (a deployment talks to a server that is already up).
    start = time.perf_counter()
    flow(name="warm-up-api")(lambda: None)()
    api_start = time.perf_counter() - start
    start = time.perf_counter()
    result = preprocess(raw_dir=str(raw), data_dir=str(data_dir))
    out = {"flow_wall_s": round(time.perf_counter() - start, 2), "prefect_api_start_s": round(api_start, 2)}
    print(json.dumps({**out, "n_samples": result["stats"]["n_samples"]}))
    return 0


_WRAPPER = """
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[2:])
use = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as fh:
    json.dump({"rc": proc.returncode, "cpu_s": use.ru_utime + use.ru_stime, "maxrss_kb": use.ru_maxrss}, fh)
sys.exit(proc.returncode)
"""


def _measure(cmd: list[str], env: dict[str, str], cwd: Path = REPO) -> dict:
    """Wall time, CPU time and peak RSS of one command, measured by a wrapper process of its own."""
    with tempfile.NamedTemporaryFile(suffix=".json") as usage_file:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", _WRAPPER, usage_file.name, *cmd],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        usage = json.loads(Path(usage_file.name).read_text() or "{}")
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"benchmark command failed: {' '.join(cmd)}")
    out = {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage["cpu_s"], 2),
        "peak_rss_mb": round(usage["maxrss_kb"] / 1024, 1),
    }
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    with contextlib.suppress(json.JSONDecodeError):
        out.update(json.loads(last))
    return out


def _unpack(work_dir: Path) -> Path:
    sys.path.insert(0, str(REPO))
    from nextloc.raw.rawdata import extract_archive

    raw = work_dir / "raw"
    if not (raw / "Data").is_dir():
        extract_archive(ARCHIVE, raw)
    return raw


if __name__ == "__main__":
    sys.exit(main())
