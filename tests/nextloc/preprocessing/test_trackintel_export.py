"""trackintel in and out: the export models (nextloc.preprocessing.trackintel_export) and the ``trackintel`` input format's
bad-input rules (nextloc.io.tabular)."""

from __future__ import annotations

from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from nextloc.io.inputs import InputSpec
from nextloc.io.tabular import read_visit_files

HEADER = "id,user_id,started_at,finished_at,elevation,geom\n"


def _staypoints() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": [1, 1, 2],
            "started_at": pd.to_datetime(["2008-10-23T01:00Z", "2008-10-23T05:00Z", "2008-10-24T00:00Z"]),
            "finished_at": pd.to_datetime(["2008-10-23T02:00Z", "2008-10-23T06:00Z", "2008-10-24T03:00Z"]),
            "latitude": [39.9847021, 39.91, 40.0],
            "longitude": [116.3184172, 116.4, 116.5],
            "elevation": [50.0, np.nan, 12.0],
            "n_pfs": [10, 20, 30],
        }
    )


class TestExportModels:
    def test_staypoints_and_locations_round_trip_through_trackintel_csv(self, tmp_path):
        import trackintel as ti

        from nextloc.preprocessing.trackintel_export import locations_model, staypoints_model, write_model

        sp = _staypoints()
        located = sp.iloc[[0, 2]].assign(location_id=[4, 4])
        model = staypoints_model(sp, located)
        assert isinstance(model, ti.Staypoints)
        assert model["location_id"].tolist()[0] == 4
        assert np.isnan(model["location_id"].iloc[1])
        write_model(model, tmp_path / "sp.csv", "csv")
        back = ti.read_staypoints_csv(tmp_path / "sp.csv", index_col="id")
        np.testing.assert_array_equal(back.geometry.x, sp["longitude"])
        np.testing.assert_array_equal(back.geometry.y, sp["latitude"])
        pd.testing.assert_series_equal(
            back["started_at"], sp["started_at"], check_names=False, check_index=False
        )

        locs = locations_model(located)
        assert isinstance(locs, ti.Locations)
        assert locs.index.tolist() == [4, 4]
        assert locs["user_id"].tolist() == [1, 2]
        assert locs.geometry.y.iloc[0] == pytest.approx((39.9847021 + 40.0) / 2)

    def test_positionfixes_in_chunks(self, tmp_path):
        import trackintel as ti

        from nextloc.preprocessing.trackintel_export import write_positionfixes

        def user(uid: int, n: int) -> pa.Table:
            return pa.table(
                {
                    "user_id": pa.array([uid] * n, pa.int32()),
                    "tracked_at": pa.array(
                        pd.date_range("2008-10-23", periods=n, freq="5s", tz="UTC"), pa.timestamp("ns", "UTC")
                    ),
                    "latitude": np.linspace(39.9, 40.0, n),
                    "longitude": np.linspace(116.3, 116.4, n),
                    "elevation": np.zeros(n),
                }
            )

        for fmt, name in (("csv", "pfs.csv"), ("geoparquet", "pfs.parquet")):
            assert write_positionfixes(iter([user(1, 5), user(2, 3)]), tmp_path / name, fmt) == 8
        pfs = ti.read_positionfixes_csv(tmp_path / "pfs.csv", index_col="id")
        assert pfs.index.tolist() == list(range(8))
        assert pfs["user_id"].tolist() == [1] * 5 + [2] * 3
        gp = gpd.read_parquet(tmp_path / "pfs.parquet")
        assert gp.crs.to_epsg() == 4326
        assert gp["id"].tolist() == list(range(8))
        np.testing.assert_array_equal(gp.geometry.x, pfs.geometry.x)

    def test_unknown_format_and_missing_data(self, tmp_path):
        from nextloc.preprocessing.trackintel_export import export_trackintel

        with pytest.raises(ValueError, match="unknown trackintel export format 'shp'"):
            export_trackintel([], [Path("x")], None, tmp_path, "shp")  # type: ignore[arg-type]
        with pytest.raises(FileNotFoundError, match="nextloc preprocess"):
            export_trackintel([], [], None, tmp_path)


class TestTrackintelInputHostile:
    def _spec(self) -> InputSpec:
        return InputSpec(format="trackintel")

    def test_wkt_rows_bad_geometry_and_time_are_reported_with_their_line(self, tmp_path):
        path = tmp_path / "sp.csv"
        path.write_text(
            HEADER + "0,1,2008-10-23 02:00:00+00:00,2008-10-23 03:00:00+00:00,1.0,POINT (116.3 39.9)\n"
            '1,1,2008-10-23 04:00:00+00:00,2008-10-23 05:00:00+00:00,1.0,"LINESTRING (0 0, 1 1)"\n'
            "2,1,2008-10-23 06:00:00+00:00,2008-10-23 07:00:00+00:00,1.0,not a point\n"
            "3,1,later,2008-10-23 09:00:00+00:00,1.0,POINT (116.3 39.9)\n"
            "4,1,2008-10-23 10:00:00+00:00,2008-10-23 11:00:00+00:00,1.0,POINT (116.3 99)\n"
            "5,2,2008-10-23 12:00:00+08:00,2008-10-23 13:00:00+08:00,1.0,POINT (116.31841 39.98472)\n"
        )
        table, report = read_visit_files([path], self._spec())
        assert table.num_rows == 2
        assert table.column("latitude").to_pylist() == [39.9, 39.98472]
        assert table.column("longitude").to_pylist() == [116.3, 116.31841]
        assert str(table.column("started_at")[1].as_py()) == "2008-10-23 04:00:00+00:00"
        assert report.counts == {"bad_geometry": 2, "bad_timestamp": 1, "out_of_range": 1}
        issues = [str(i) for i in report.issues]
        assert any(i.startswith(f"{path}:3: bad_geometry") for i in issues), issues
        assert any(i.startswith(f"{path}:5: bad_timestamp") for i in issues), issues
        assert any(i.startswith(f"{path}:6: out_of_range") for i in issues), issues

    def test_missing_geom_column_names_the_file(self, tmp_path):
        path = tmp_path / "sp.csv"
        path.write_text("user_id,started_at,finished_at,latitude,longitude\n1,2008-10-23Z,2008-10-23Z,1,2\n")
        table, report = read_visit_files([path], self._spec())
        assert table.num_rows == 0
        assert report.files_skipped == 1
        assert report.counts == {"missing_column": 1}
        assert "geom (column 'geom')" in str(report.issues[0])
        assert str(path) in str(report.issues[0])

    def test_geoparquet_wkb(self, tmp_path):
        from nextloc.preprocessing.trackintel_export import staypoints_model

        model = staypoints_model(_staypoints(), None)
        model.to_parquet(tmp_path / "sp.parquet")
        table, report = read_visit_files([tmp_path / "sp.parquet"], self._spec())
        assert report.rows_skipped == 0
        assert table.num_rows == 3
        assert table.column("latitude").to_pylist() == _staypoints()["latitude"].tolist()
        assert table.column("user_id").to_pylist() == [1, 1, 2]
