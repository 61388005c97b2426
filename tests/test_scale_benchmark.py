"""Smoke test of the scale benchmark (benchmarks/scale.py) at its tiny ``--quick`` size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_quick_size_reports_every_stage_as_json(tmp_path):
    """Generate, preprocess (local runner) and report: wall, CPU, peak RSS and cost per million fixes of
    each stage, the data deleted afterwards."""
    work = tmp_path / "scale"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "scale.py"),
            "--quick",
            "--runners",
            "local",
            "--no-train",
            "--work-dir",
            str(work),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    (run,) = out["runs"]
    assert run["size"] == "quick"
    assert run["users"] == 4
    assert run["fixes"] > 10_000
    pre = run["preprocess_local"]
    assert pre["n_samples"]["train"] > 0
    assert set(pre["stages"]) == {"ingest", "staypoints", "locations", "dataset", "flow"}
    assert pre["stages"]["staypoints"]["task_runs"] == 4  # one per user
    for stage in pre["stages"].values():
        assert stage["wall_s"] >= 0
        assert stage["wall_s_per_mfix"] >= 0
        assert stage["peak_rss_mb"] > 0
    assert 0 < pre["peak_rss_largest_process_mb"] <= pre["peak_rss_mb"]
    assert pre["cpu_s"] > 0
    assert run["generate"]["wall_s"] > 0
    assert out["scaling"]["preprocess_local.staypoints"]["quick"]["wall_ratio"] == 1.0
    assert not (work / "size-0").exists()  # the size's data is deleted after measuring


def test_a_size_above_visits_above_is_generated_as_visits(tmp_path):
    """Above ``--visits-above`` a size's generator writes visits, not fixes (what the disk holds at 64x): a
    visits file the preprocessing reads as ``input_format="visits"`` (tests/flows/test_input_routes.py)."""
    out = tmp_path / "visits.parquet"
    command = [sys.executable, str(REPO / "benchmarks" / "scale.py"), "--quick", "--worker", "generate"]
    options = ["--size", "0", "--out", str(out), "--visits"]
    proc = subprocess.run([*command, *options], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["positionfixes"] == 0
    assert counts["users"] == 4
    visits = pq.read_table(out)
    assert visits.num_rows == counts["visits"] > 500
    assert {"user_id", "started_at", "finished_at", "latitude", "longitude"} <= set(visits.column_names)
