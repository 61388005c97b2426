"""The full GeoLife 1.3 data gives exactly the reference dataset (reference-protocol.md, section 1).

Runs in CI (``../shared`` is there); elsewhere it is skipped when the archive is missing.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from nextloc.raw.rawdata import extract_archive

pytestmark = [pytest.mark.slow, pytest.mark.fulldata, pytest.mark.usefixtures("prefect_api")]

REFERENCE = {
    "n_users": {"train": 45, "val": 45, "test": 45},
    "total_loc_num": 1187,
    "total_user_num": 46,
    "n_train_locations": 1185,
    "n_staypoints": {"train": 8380, "val": 4018, "test": 4202},
    "n_samples": {"train": 7424, "val": 3334, "test": 3502},
    "max_hist_len": 54,
}


@pytest.fixture(scope="module")
def full_run(full_archive, tmp_path_factory):
    from flows.preprocess import preprocess

    raw = extract_archive(full_archive, tmp_path_factory.mktemp("geolife") / "raw")
    data_dir = tmp_path_factory.mktemp("geolife-out")
    result = preprocess(raw_dir=str(raw), data_dir=str(data_dir))
    return raw, data_dir, result


def test_reproduces_reference_dataset(full_run):
    """45 users, 1,185 train locations, staypoints 8,380/4,018/4,202, samples 7,424/3,334/3,502."""
    _, data_dir, result = full_run
    meta = json.loads((data_dir / "metadata.json").read_text())
    for key, expected in REFERENCE.items():
        assert meta[key] == expected, key
        assert result["stats"][key] == expected, key
    pre = meta["preprocessing"]
    assert pre["users_quality"] == 92
    assert pre["staypoints_located"] == 19581
    assert pre["locations"] == 2049
    assert meta["n_staypoints_merged"] == 19188
    assert meta["n_users_merged"] == 91
    # 24,722,141 points in this copy of the data; one has latitude 400 and is skipped, with file and line
    assert pre["positionfixes"] + pre["rows_skipped"] == 24_722_141
    report = json.loads((data_dir / "ingest_report.json").read_text())
    assert report["counts"] == {"out_of_range": 1}
    assert "020/Trajectory/20110911000506.plt:6782" in report["issues"][0]

    sp = pq.read_table(data_dir / "staypoints.parquet").to_pandas()
    assert len(sp) == 16_600
    assert sp["user_id"].nunique() == 45
    assert sp.loc[sp["split"] == "train", "location_id"].max() == 1186
    for split in ("train", "val", "test"):
        assert (
            pq.read_metadata(data_dir / "samples" / f"{split}.parquet").num_rows
            == REFERENCE["n_samples"][split]
        )


def test_rerun_is_cached(full_run):
    """Unchanged input: every task is a cache hit and the outputs are untouched."""
    from flows.preprocess import preprocess

    raw, data_dir, result = full_run
    before = {p: p.stat().st_mtime_ns for p in data_dir.rglob("*.parquet")}
    again = preprocess(raw_dir=str(raw), data_dir=str(data_dir))
    assert again["stats"] == result["stats"]
    assert {p: p.stat().st_mtime_ns for p in data_dir.rglob("*.parquet")} == before


def test_peak_memory_under_4_gb(full_run, tmp_path, peak_rss_mb):
    """A cold preprocessing of the full data, in its own process: peak RSS stays under 4 GB (measured 1.2 GB)."""
    raw, _, _ = full_run
    peak = peak_rss_mb(["preprocess", "--raw-dir", str(raw), "--data-dir", str(tmp_path / "data")], tmp_path)
    assert peak < 4096, f"peak RSS {peak:.0f} MB"


def test_dbscan_by_tiles_gives_the_located_parquet_byte_for_byte(full_run, tmp_path):
    """DBSCAN by spatial tiles on the full data's DBSCAN input (activity staypoints of the quality users,
    rebuilt from the per-user staypoints) writes the very bytes of the single-machine run."""
    import pandas as pd

    from nextloc.config import PreprocessConfig
    from nextloc.preprocessing.locations import generate_locations
    from nextloc.preprocessing.staypoints import STAYPOINT_COLUMNS, create_activity_flag
    from nextloc.storage import write_geoparquet
    from runtime.catalog import Catalog

    _, data_dir, _ = full_run
    catalog = Catalog(str(data_dir))
    located = pq.read_table(catalog.located).to_pandas()
    # the located users (91 of the 92 quality users: one has only noise, which with min_samples 2 means
    # points with no neighbour, so leaving them out changes no other label); tiles=0 proves it exact
    users = sorted(located["user_id"].unique())
    sp = pd.concat(
        [pq.read_table(catalog.user_staypoints(u), columns=STAYPOINT_COLUMNS).to_pandas() for u in users],
        ignore_index=True,
    )
    cfg = PreprocessConfig()
    sp = create_activity_flag(sp, cfg.staypoints.activity_time_threshold_min)
    sp = sp[sp["is_activity"]].reset_index(drop=True)
    expected = catalog.located.read_bytes()
    for tiles in (0, 8):  # 0: the reconstruction itself is exact
        out = generate_locations(sp, cfg.locations, tiles=tiles)
        out = out[out["location_id"].notna()].reset_index(drop=True)
        write_geoparquet(out, tmp_path / f"located-{tiles}.parquet")
        assert (tmp_path / f"located-{tiles}.parquet").read_bytes() == expected, tiles


def test_the_routine_reads_nothing_after_a_questions_now(full_run):
    """``RoutineData.build`` on every staypoint against a build on the staypoints that started before
    each of 24 sampled train, validation and test questions' now (the target poisoned): every candidate feature,
    explore feature, share, unseen place and window identical (``tests/causal_build.py``)."""
    import numpy as np
    import pandas as pd
    from causal_build import causal_mismatches

    from nextloc.config import PreprocessConfig
    from nextloc.routine.data import read_located

    _, data_dir, _ = full_run
    meta = json.loads((data_dir / "metadata.json").read_text())
    samples = {s: pq.read_table(data_dir / "samples" / f"{s}.parquet") for s in ("train", "val", "test")}
    picks = [
        (s, int(i)) for s in ("train", "val", "test") for i in np.linspace(0, samples[s].num_rows - 1, 8)
    ]
    wrong = causal_mismatches(
        pd.read_parquet(data_dir / "staypoints.parquet"),
        pd.read_parquet(data_dir / "vocabulary" / "locations.parquet"),
        samples,
        meta["total_loc_num"],
        PreprocessConfig.model_validate(meta["config"]).timezone,
        picks,
        read_located(data_dir / "03_locations" / "staypoints_located.parquet"),
    )
    assert wrong == []
