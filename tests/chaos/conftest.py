"""Fixtures of the chaos tests: the GeoLife sample preprocessed once per session by a lone command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NEXTLOC = str(Path(sys.executable).parent / "nextloc")


@pytest.fixture(scope="session")
def lone_preprocess(sample_dir, tmp_path_factory) -> Path:
    """The data directory of one uninterrupted ``nextloc preprocess`` of the sample, alone in its project
    (its own Prefect home, no other command at the same time): what a disturbed run must reproduce.
    Read-only: copy it before writing."""
    project = tmp_path_factory.mktemp("lone-preprocess")
    env = {**os.environ, "PREFECT_HOME": str(project / ".prefect")}
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)  # mlflow.set_tracking_uri in an earlier test exports it
    done = subprocess.run(
        [NEXTLOC, "preprocess", "--raw-dir", str(sample_dir), "--data-dir", "data"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return project / "data"
