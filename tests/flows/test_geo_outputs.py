"""On the real GeoLife sample: the staypoint and location outputs are GeoParquet (read by geopandas and by
DuckDB's spatial extension), and the dataset goes to trackintel and back (``nextloc export --to trackintel``,
``--input-format trackintel``)."""

from __future__ import annotations

import json
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.usefixtures("prefect_api")

SAMPLES = ["samples/train.parquet", "samples/val.parquet", "samples/test.parquet"]


def _geo_outputs(data_dir: Path) -> list[Path]:
    return [
        data_dir / "staypoints.parquet",
        data_dir / "vocabulary" / "locations.parquet",
        data_dir / "03_locations" / "staypoints_located.parquet",
        *sorted((data_dir / "02_staypoints").glob("user_id=*/part-0.parquet")),
    ]


@pytest.fixture(scope="module")
def preprocessed(preprocessed_copy, tmp_path_factory) -> Path:
    return preprocessed_copy(tmp_path_factory.mktemp("geo") / "geolife")


@pytest.fixture(scope="module")
def duckdb_spatial():
    """A DuckDB connection with the spatial extension loaded from its PyPI package (never downloaded)."""
    import importlib.resources

    import duckdb

    # the package ships the extension file for its DuckDB version (and has no code to find it)
    package = importlib.resources.files("duckdb_extension_spatial")
    path = package / "extensions" / f"v{duckdb.__version__}" / "spatial.duckdb_extension"
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    con.execute(f"LOAD '{path}'")
    yield con
    con.close()


class TestGeoParquetOutputs:
    def test_geopandas_reads_points(self, preprocessed):
        paths = _geo_outputs(preprocessed)
        assert len(paths) == 3 + 11
        for path in paths:
            gdf = gpd.read_parquet(path)
            assert len(gdf) > 0 or "02_staypoints" in str(path), path  # a user may have no staypoint
            assert (gdf.geom_type == "Point").all(), path
            assert gdf.crs.to_epsg() == 4326, path
            np.testing.assert_array_equal(gdf.geometry.x.to_numpy(), gdf["longitude"].to_numpy(), str(path))
            np.testing.assert_array_equal(gdf.geometry.y.to_numpy(), gdf["latitude"].to_numpy(), str(path))

    def test_duckdb_spatial_reads_points(self, preprocessed, duckdb_spatial):
        for path in _geo_outputs(preprocessed):
            rows = duckdb_spatial.execute(
                "SELECT count(*), count(*) FILTER (WHERE ST_X(geometry) = longitude AND ST_Y(geometry) = latitude), "
                "any_value(ST_GeometryType(geometry)::VARCHAR) FROM read_parquet(?)",
                [str(path)],
            ).fetchone()
            assert rows[1] == rows[0], path
            if rows[0]:
                assert rows[2].upper() == "POINT", path

    def test_final_staypoints_keep_the_first_merged_coordinates(self, preprocessed):
        """A merged staypoint sits where its first located staypoint is (trackintel's agg geom "first")."""
        final = pq.read_table(preprocessed / "staypoints.parquet").to_pandas()
        located = pq.read_table(preprocessed / "03_locations" / "staypoints_located.parquet").to_pandas()
        joined = final.merge(located, on=["user_id", "started_at"], suffixes=("", "_located"))
        assert len(joined) == len(final)
        np.testing.assert_array_equal(joined["latitude"], joined["latitude_located"])
        np.testing.assert_array_equal(joined["longitude"], joined["longitude_located"])


def _export(data_dir: Path, out: Path, fmt: str) -> dict:
    from commands import main as cli

    rc = cli.main(["export", "--to", "trackintel", str(out), "--data-dir", str(data_dir), "--format", fmt])
    assert rc == 0
    return {p.name: p for p in out.iterdir()}


@pytest.fixture(scope="module")
def exported(preprocessed, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ti") / "csv"
    files = _export(preprocessed, out, "csv")
    assert set(files) == {"positionfixes.csv", "staypoints.csv", "locations.csv"}
    return out


class TestTrackintelExport:
    def test_trackintel_reads_the_models(self, preprocessed, exported):
        import trackintel as ti

        sp = ti.read_staypoints_csv(exported / "staypoints.csv", index_col="id")
        locs = ti.read_locations_csv(exported / "locations.csv", index_col="id")
        assert isinstance(sp, ti.Staypoints)
        assert isinstance(locs, ti.Locations)
        assert str(sp["started_at"].dt.tz) == "UTC"
        raw = pd.concat(
            [
                pq.read_table(p).to_pandas()
                for p in sorted((preprocessed / "02_staypoints").glob("*/*.parquet"))
            ]
        )
        assert len(sp) == len(raw)
        np.testing.assert_allclose(sp.geometry.x.to_numpy(), raw["longitude"].to_numpy(), rtol=0, atol=1e-12)
        # every located staypoint names a location of its own user
        pairs = set(zip(locs["user_id"], locs.index, strict=True))
        linked = sp[sp["location_id"].notna()]
        assert len(linked) > 0
        assert set(zip(linked["user_id"], linked["location_id"].astype(int), strict=True)) <= pairs
        quality = ti.analysis.temporal_tracking_quality(sp, granularity="all")
        assert set(quality["user_id"]) == set(sp["user_id"])
        assert quality["quality"].between(0, 1).all()

    def test_positionfixes_feed_trackintel(self, exported):
        """trackintel's own pipeline runs on the exported positionfixes: staypoints, triplegs, trips."""
        import trackintel as ti

        pfs = ti.read_positionfixes_csv(exported / "positionfixes.csv", index_col="id")
        assert isinstance(pfs, ti.Positionfixes)
        assert str(pfs["tracked_at"].dt.tz) == "UTC"
        one = pfs[pfs["user_id"] == pfs["user_id"].iloc[0]].head(20_000)
        one, sp = one.generate_staypoints(gap_threshold=24 * 60, include_last=True)
        one, tpls = one.generate_triplegs(sp)
        sp = sp.create_activity_flag(time_threshold=15)
        sp, tpls, trips = sp.generate_trips(tpls)
        assert len(sp) > 0
        assert len(tpls) > 0
        assert len(trips) > 0

    def test_geoparquet_export(self, preprocessed, tmp_path):
        import trackintel as ti

        files = _export(preprocessed, tmp_path / "gp", "geoparquet")
        assert set(files) == {"positionfixes.parquet", "staypoints.parquet", "locations.parquet"}
        sp = ti.Staypoints(gpd.read_parquet(files["staypoints.parquet"]))
        locs = ti.Locations(gpd.read_parquet(files["locations.parquet"]))
        assert sp.geometry.name == "geom"
        assert locs.geometry.name == "center"
        pfs = gpd.read_parquet(files["positionfixes.parquet"])
        pfs = ti.io.read_positionfixes_gpd(pfs.set_index("id"), geom_col="geom")
        assert pfs.crs.to_epsg() == 4326
        assert pfs.index.is_unique


class TestTrackintelInput:
    @pytest.mark.parametrize("name", ["staypoints.csv", "staypoints.parquet"])
    def test_exported_staypoints_give_the_same_samples(self, preprocessed, exported, tmp_path, name):
        from flows.preprocess import preprocess

        raw = exported / name
        if name.endswith(".parquet"):
            raw = _export(preprocessed, tmp_path / "gp", "geoparquet")[name]
        result = preprocess(raw_dir=str(raw), data_dir=str(tmp_path / "out"), input_format="trackintel")
        assert result["ingest"]["rows_skipped"] == 0
        for sample in SAMPLES:
            expected = pq.read_table(preprocessed / sample)
            assert expected.equals(pq.read_table(tmp_path / "out" / sample)), sample
        meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
        assert meta["n_samples"] == json.loads((preprocessed / "metadata.json").read_text())["n_samples"]
