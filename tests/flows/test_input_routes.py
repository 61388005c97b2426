"""The GeoLife sample given as CSV, parquet, GPX and visits reproduces the GeoLife route's dataset exactly."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.slow]  # whole preprocess runs

OUTPUTS = ["staypoints.parquet", "samples/train.parquet", "samples/val.parquet", "samples/test.parquet"]
CSV_COLUMNS = {
    "user_id": "uid",
    "tracked_at": "time",
    "latitude": "lat",
    "longitude": "lon",
    "elevation": "alt",
}


def _preprocess(raw: Path, data_dir: Path, **kwargs):
    from flows.preprocess import preprocess

    return preprocess(raw_dir=str(raw), data_dir=str(data_dir), **kwargs)


@pytest.fixture(scope="module")
def geolife_route(sample_dir, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("routes") / "geolife"
    result = _preprocess(sample_dir, data_dir)
    return data_dir, result


@pytest.fixture(scope="module")
def sample_tables(sample_dir):
    """Each sample user's positionfixes as the GeoLife reader gives them, one table per .plt file."""
    from nextloc.io.geolife import list_plt_files, list_user_dirs, read_user

    users, _ = list_user_dirs(sample_dir)
    return {
        user_id: [(f.stem, read_user(user_id, [f])[0]) for f in list_plt_files(folder)]
        for user_id, folder in users
    }


def _assert_same_dataset(a: Path, b: Path) -> None:
    for name in OUTPUTS:
        left, right = pq.read_table(a / name), pq.read_table(b / name)
        assert left.equals(right), name
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _write(sample_tables, fmt: str, out: Path, **kwargs) -> None:
    from nextloc.synth import open_sink

    with open_sink(fmt, out, **kwargs) as sink:
        for parts in sample_tables.values():
            for stem, table in parts:
                sink.write(table, name=stem)


class TestRoutesReproduceGeoLife:
    def test_csv_route(self, geolife_route, sample_tables, tmp_path):
        """One CSV file, renamed columns, naive Beijing wall-clock times + the timezone option."""
        raw = tmp_path / "fixes.csv"
        _write(sample_tables, "csv", raw, columns=CSV_COLUMNS, timezone="Asia/Shanghai")
        result = _preprocess(
            raw, tmp_path / "out", input_format="csv", columns=CSV_COLUMNS, input_timezone="Asia/Shanghai"
        )
        assert result["ingest"]["rows_skipped"] == 0
        _assert_same_dataset(geolife_route[0], tmp_path / "out")
        assert result["stats"] == geolife_route[1]["stats"]

    def test_parquet_route(self, geolife_route, sample_tables, tmp_path):
        """A folder of parquet files (one per user), tz-aware timestamp column."""
        from nextloc.synth import ParquetSink

        for user_id, parts in sample_tables.items():
            with ParquetSink(tmp_path / "raw" / f"user{user_id}.parquet") as sink:
                for _, table in parts:
                    sink.write(table)
        result = _preprocess(tmp_path / "raw", tmp_path / "out", input_format="parquet")
        _assert_same_dataset(geolife_route[0], tmp_path / "out")
        assert result["stats"] == geolife_route[1]["stats"]

    def test_gpx_route(self, geolife_route, sample_tables, tmp_path):
        """One GPX file per .plt file, a folder per user."""
        _write(sample_tables, "gpx", tmp_path / "raw")
        result = _preprocess(tmp_path / "raw", tmp_path / "out", input_format="gpx")
        assert result["ingest"]["rows_skipped"] == 0
        _assert_same_dataset(geolife_route[0], tmp_path / "out")
        assert result["stats"] == geolife_route[1]["stats"]

    def test_visits_route(self, geolife_route, tmp_path):
        """The GeoLife route's staypoints, exported as visits, give the same samples."""
        sps = sorted((geolife_route[0] / "02_staypoints").glob("user_id=*/part-0.parquet"))
        visits = pd.concat([pq.read_table(p).to_pandas() for p in sps], ignore_index=True)
        raw = tmp_path / "visits.parquet"
        pq.write_table(
            pa.Table.from_pandas(visits[["user_id", "started_at", "finished_at", "latitude", "longitude"]]),
            raw,
        )
        _preprocess(raw, tmp_path / "out", input_format="visits")
        for name in OUTPUTS[1:]:
            assert pq.read_table(geolife_route[0] / name).equals(pq.read_table(tmp_path / "out" / name)), name


def test_diy_profile_end_to_end(tmp_path, monkeypatch):
    """``nextloc run --dataset diy`` on a few dozen synthetic visit users, markov only: every user passes the
    DIY quality filter, the profile's protocol reaches the dataset, and markov is trained and registered."""
    import json

    from commands import main as cli
    from nextloc.synth import SynthConfig, generate

    raw = tmp_path / "visits.parquet"
    generate(SynthConfig(n_users=24, n_days=80, seed=5), "visits", raw)
    out = tmp_path / "diy"
    monkeypatch.setattr(cli, "configure_environment", lambda: None)  # the session's Prefect API and env
    rc = cli.main(
        ["run", "--dataset", "diy", "--raw-dir", str(raw), "--data-dir", str(out), "--model", "markov"]
        + ["--workers", "1", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--experiment", "diy"]
    )
    assert rc == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["preprocessing"]["users_quality"] == meta["preprocessing"]["users_read"] == 24
    # the protocol then keeps users with targets in every split (18 of 24 here: 8-day val/test splits)
    assert meta["n_users"]["train"] == meta["n_users"]["test"] >= 12
    assert meta["config"]["quality"]["min_thres"] == 0.6
    assert meta["config"]["locations"]["epsilon_m"] == 50.0
    assert meta["config"]["split"]["train"] == 0.8
    results = json.loads((out / "results" / "markov" / "seed0" / "results.json").read_text())
    assert results["n_test"] == meta["n_samples"]["test"] > 0
    assert results["place_acc@1"] > 0
