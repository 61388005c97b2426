"""`make bench`: every speed target of the project in one JSON document, each against the reference.

Runs, one after the other (each measured in fresh subprocesses, see the scripts it calls):

* ``benchmarks/preprocess.py``: cold and cached preprocessing of the full GeoLife data, as the flow and as
  the ``nextloc preprocess`` command, against the reference pipeline in the same run;
* the whole job, ``nextloc run`` (preprocess, train the default models, evaluate, promote), cold and then
  cached, in a scratch project folder (its own ``mlruns/`` and ``.prefect/``);
* ``benchmarks/train.py``: train samples/s of every default recipe against the reference-style loop;

then prints ``{"preprocess": ..., "run": ..., "train": ..., "targets": ...}``, where ``targets`` holds
issue 13's targets beside the measured values (met or not: this prints numbers, it does not judge them in
a test). About 20 minutes on a 2-core machine::

    python benchmarks/all.py [--raw-dir /tmp/geolife] [--skip-reference] > bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from preprocess import _measure, _unpack  # noqa: E402  (same folder; measuring helpers in one home)

TARGETS = {
    "command_cold_wall_s": 20.0,
    "command_cold_speedup": 20.0,
    "command_cold_peak_rss_mb": 1536.0,
    "run_cached_wall_s": 8.0,
    "train_speedup_per_process": 2.0,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw-dir", type=Path, default=None, help="GeoLife root (default: unpack ../shared)")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "nextloc-bench")
    parser.add_argument("--skip-reference", action="store_true", help="no reference preprocessing run")
    args = parser.parse_args()
    raw = args.raw_dir or _unpack(args.work_dir)
    python = sys.executable
    out: dict = {}

    cmd = [python, str(REPO / "benchmarks" / "preprocess.py"), "--raw-dir", str(raw)]
    cmd += ["--work-dir", str(args.work_dir)] + (["--skip-reference"] if args.skip_reference else [])
    out["preprocess"] = _json_of(cmd)

    project = args.work_dir / "project"
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir(parents=True)
    env = {**os.environ, "PREFECT_HOME": str(project / ".prefect"), "PREFECT_LOGGING_LEVEL": "WARNING"}
    env.pop("PREFECT_API_URL", None)  # the embedded defaults, as on a user's machine
    env.pop("MLFLOW_TRACKING_URI", None)
    run = [str(Path(python).with_name("nextloc")), "run", "--raw-dir", str(raw), "--data-dir", "data/geolife"]
    out["run"] = {"cold": _measure(run, env, cwd=project), "cached": _measure(run, env, cwd=project)}

    train = [python, str(REPO / "benchmarks" / "train.py"), "--data-dir", str(project / "data" / "geolife")]
    out["train"] = _json_of(train)
    out["targets"] = _targets(out)
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _json_of(cmd: list[str]) -> dict:
    """Run a benchmark script; its stdout is one JSON document."""
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"benchmark failed: {' '.join(cmd)}")
    return json.loads(proc.stdout)


def _targets(out: dict) -> dict:
    """Each target beside its measured value."""
    pre = out["preprocess"]
    cold = pre["command_cold"]
    measured = {
        "command_cold_wall_s": cold["wall_s"],
        "command_cold_speedup": pre.get("ratio", {}).get("command_cold_speedup_wall"),
        "command_cold_peak_rss_mb": cold["peak_rss_mb"],
        "run_cached_wall_s": out["run"]["cached"]["wall_s"],
        "train_speedup_per_process": min(
            (
                m["ratio_train_samples_per_s"]
                for m in out["train"].values()
                if isinstance(m, dict) and "ratio_train_samples_per_s" in m
            ),
            default=None,
        ),
    }
    lower_is_better = {"command_cold_wall_s", "command_cold_peak_rss_mb", "run_cached_wall_s"}
    result = {}
    for key, target in TARGETS.items():
        value = measured[key]
        met = None if value is None else (value <= target if key in lower_is_better else value >= target)
        result[key] = {"target": target, "measured": value, "met": met}
    return result


if __name__ == "__main__":
    sys.exit(main())
