"""GeoParquet writing (nextloc.io.geoparquet via nextloc.storage): what geopandas writes, deterministic, strict."""

from __future__ import annotations

import json

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from pyproj import CRS

from nextloc.io.geoparquet import geometry_columns
from nextloc.storage import read_parquet, write_geoparquet


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": [3, 3, 7],
            "started_at": pd.to_datetime(["2008-10-23T01:00Z", "2008-10-23T05:00Z", "2009-01-01T00:00Z"]),
            "latitude": [39.984702, 39.9, -33.86],
            "longitude": [116.318417, 116.4, 151.21],
        }
    )


def test_geopandas_reads_points_in_epsg_4326(tmp_path):
    path = tmp_path / "sp.parquet"
    write_geoparquet(_frame(), path)
    gdf = gpd.read_parquet(path)
    assert gdf.geometry.name == "geometry"
    assert gdf.crs.to_epsg() == 4326
    assert (gdf.geom_type == "Point").all()
    np.testing.assert_array_equal(gdf.geometry.x, gdf["longitude"])
    np.testing.assert_array_equal(gdf.geometry.y, gdf["latitude"])


def test_metadata_is_what_geopandas_writes(tmp_path):
    """The ``geo`` metadata equals geopandas' own for the same frame (less its ``creator`` entry)."""
    ours, theirs = tmp_path / "ours.parquet", tmp_path / "theirs.parquet"
    frame = _frame()
    write_geoparquet(frame, ours)
    gdf = gpd.GeoDataFrame(
        frame, geometry=gpd.points_from_xy(frame["longitude"], frame["latitude"]), crs="EPSG:4326"
    )
    gdf.to_parquet(theirs, index=False)
    meta = json.loads(pq.read_schema(ours).metadata[b"geo"])
    expected = json.loads(pq.read_schema(theirs).metadata[b"geo"])
    expected.pop("creator", None)
    # the same CRS; its PROJJSON text depends on which PROJ database the process loaded (a datum or the
    # WGS 84 datum ensemble), so it is compared as a CRS
    ours_crs = meta["columns"]["geometry"].pop("crs")
    their_crs = expected["columns"]["geometry"].pop("crs")
    assert CRS.from_json_dict(ours_crs) == CRS.from_json_dict(their_crs)
    assert CRS.from_json_dict(ours_crs).to_epsg() == 4326
    assert meta == expected
    # the geometry bytes too
    assert pq.read_table(ours)["geometry"].equals(pq.read_table(theirs)["geometry"])


def test_deterministic_and_no_pandas_metadata(tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    assert write_geoparquet(_frame(), a) == write_geoparquet(_frame(), b)
    assert a.read_bytes() == b.read_bytes()
    assert set(pq.read_schema(a).metadata) == {b"geo"}


def test_read_parquet_leaves_the_geometry_out(tmp_path):
    path = tmp_path / "sp.parquet"
    write_geoparquet(_frame(), path)
    assert geometry_columns(pq.read_schema(path)) == ["geometry"]
    assert list(read_parquet(path).columns) == list(_frame().columns)
    assert "geometry" in read_parquet(path, columns=["user_id", "geometry"]).columns


def test_empty_table(tmp_path):
    path = tmp_path / "empty.parquet"
    write_geoparquet(_frame().iloc[:0], path)
    gdf = gpd.read_parquet(path)
    assert len(gdf) == 0
    assert gdf.crs.to_epsg() == 4326


@pytest.mark.parametrize(("column", "value"), [("latitude", np.nan), ("longitude", np.inf)])
def test_a_coordinate_that_is_not_a_number_is_an_error(tmp_path, column, value):
    frame = _frame()
    frame.loc[1, column] = value
    with pytest.raises(ValueError, match=f"{column} of row 1"):
        write_geoparquet(frame, tmp_path / "bad.parquet")
    assert not (tmp_path / "bad.parquet").exists()


def test_missing_coordinates_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="needs a 'latitude' column"):
        write_geoparquet(_frame().drop(columns="latitude"), tmp_path / "bad.parquet")
