"""GeoParquet: the point geometry and the ``geo`` metadata of the outputs that have coordinates.

Staypoints (``02_staypoints/``, ``03_locations/``, ``staypoints.parquet``) and the location vocabulary
keep their ``latitude`` / ``longitude`` columns (everything downstream reads those) and gain a
``geometry`` column: each row's point as WKB (ISO, little-endian, built by shapely), with the file-level
``geo`` metadata of GeoParquet 1.1.0 that geopandas writes for the same frame: encoding ``WKB``,
``geometry_types`` ``["Point"]``, the CRS as PROJJSON of EPSG:4326 (coordinates are longitude, latitude,
as GeoParquet orders them whatever the CRS's axes) and the bounding box. geopandas, QGIS/GDAL and DuckDB's
spatial extension read them as point layers (tested with geopandas and DuckDB).

Decision: the table is written by pyarrow through :mod:`nextloc.storage`, not by
``GeoDataFrame.to_parquet``: no GeoDataFrame (and pandas round trip) per file, the storage layer's
compression and dictionary choices, and no pandas or library-version metadata, so the bytes depend on the
data alone (the determinism rule). The metadata equals geopandas' less its ``creator`` entry (tested).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import pyarrow as pa

GEOMETRY_COLUMN = "geometry"
GEOPARQUET_VERSION = "1.1.0"
CRS_EPSG = 4326


@functools.cache
def crs_projjson() -> dict[str, Any]:
    """EPSG:4326 as PROJJSON, as geopandas writes it (datum ensemble members without their ids)."""
    from pyproj import CRS  # pyproj comes with geopandas; imported once, when a file is first written

    crs = CRS.from_epsg(CRS_EPSG).to_json_dict()
    _drop_member_ids(crs)
    return crs


def _drop_member_ids(node: dict[str, Any]) -> None:
    """geopandas drops the ids of datum ensemble members (older PROJ versions do not know them)."""
    for key, value in node.items():
        if isinstance(value, dict):
            _drop_member_ids(value)
        elif key == "members" and isinstance(value, list):
            for member in value:
                member.pop("id", None)


def with_point_geometry(table: pa.Table, column: str = GEOMETRY_COLUMN) -> pa.Table:
    """``table`` with a WKB point column built from its ``latitude`` / ``longitude`` columns and the
    GeoParquet ``geo`` schema metadata (any other schema metadata is dropped).

    Raises:
        ValueError: if a coordinate column is missing, or a coordinate is not a finite number (naming the
            column and the first such row, from 0).
    """
    import shapely  # here, not at import: nextloc.storage (every command) imports this module

    coords = {}
    for name in ("longitude", "latitude"):
        if name not in table.column_names:
            raise ValueError(f"GeoParquet output needs a {name!r} column; the table has {table.column_names}")
        values = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        bad = np.flatnonzero(~np.isfinite(values))
        if len(bad):
            raise ValueError(f"GeoParquet output: {name} of row {bad[0]} is {values[bad[0]]}, not a number")
        coords[name] = values
    lon, lat = coords["longitude"], coords["latitude"]
    wkb = shapely.to_wkb(shapely.points(lon, lat), flavor="iso", byte_order=1)
    geometry = pa.array(wkb, pa.binary())
    if column in table.column_names:
        table = table.drop_columns([column])
    table = table.append_column(pa.field(column, pa.binary()), geometry)
    return table.replace_schema_metadata({b"geo": geo_metadata(lon, lat, column)})


def geo_metadata(
    longitude: np.ndarray, latitude: np.ndarray, column: str = GEOMETRY_COLUMN, *, bbox: bool = True
) -> bytes:
    """The GeoParquet ``geo`` metadata (UTF-8 JSON) of one point column with these coordinates; ``bbox``
    False leaves the (optional) bounding box out, for a file written in parts."""
    entry: dict[str, Any] = {
        "encoding": "WKB",
        "crs": crs_projjson(),
        "geometry_types": ["Point"] if len(longitude) else [],
    }
    if bbox and len(longitude):
        entry["bbox"] = [
            float(longitude.min()),
            float(latitude.min()),
            float(longitude.max()),
            float(latitude.max()),
        ]
    meta = {"primary_column": column, "columns": {column: entry}, "version": GEOPARQUET_VERSION}
    return json.dumps(meta).encode("utf-8")


def geometry_columns(schema: pa.Schema) -> list[str]:
    """The geometry columns a GeoParquet file's schema declares (none for plain parquet)."""
    raw = (schema.metadata or {}).get(b"geo")
    return list(json.loads(raw)["columns"]) if raw else []
