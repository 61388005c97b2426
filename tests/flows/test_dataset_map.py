"""`nextloc map` (issue 36): a preprocessed dataset on a web map, from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]
REPO = Path(__file__).resolve().parents[2]


def nextloc_map(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "commands.main", "map", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=check, timeout=300)


def test_nextloc_map_draws_the_sample_and_a_user(preprocessed_copy, tmp_path):
    from nextloc.maps.web import external_references

    data_dir = preprocessed_copy(tmp_path / "data")
    sp = pd.read_parquet(data_dir / "staypoints.parquet", columns=["user_id", "raw_location_id"])
    user = int(sp["user_id"].value_counts().idxmax())
    out = tmp_path / "map.html"
    done = nextloc_map("--data-dir", str(data_dir), "--user", str(user), "--out", str(out))
    assert json.loads(done.stdout) == {"map": str(out)}
    html = out.read_text()
    assert external_references(html) == []
    assert f"Locations ({sp.loc[sp['raw_location_id'] >= 0, 'raw_location_id'].nunique()}," in html
    assert f"User {user}\\u0027s staypoints ({int((sp['user_id'] == user).sum())})" in html


def test_nextloc_map_names_what_is_wrong(preprocessed_copy, tmp_path):
    data_dir = tmp_path / "nothing"
    done = nextloc_map("--data-dir", str(data_dir), "--out", str(tmp_path / "m.html"), check=False)
    assert done.returncode == 2
    assert "staypoints.parquet is missing" in " ".join(done.stderr.split())  # rich wraps the log
    done = nextloc_map("--data-dir", str(data_dir), "--out", str(tmp_path / "m.png"), check=False)
    assert done.returncode == 2
    assert "name an .html file" in " ".join(done.stderr.split())
    assert not (tmp_path / "m.html").exists()
