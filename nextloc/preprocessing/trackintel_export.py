"""Export a preprocessed dataset as trackintel's own models: positionfixes, staypoints and locations.

What is written (``DIR/positionfixes.csv``, ``staypoints.csv``, ``locations.csv``; or ``.parquet`` with
``fmt="geoparquet"``), each a valid ``ti.Positionfixes`` / ``ti.Staypoints`` / ``ti.Locations`` (trackintel
validates them on construction here, and its readers read them back):

* **positionfixes**: every user's fixes (``01_positionfixes/``): index ``id`` (running over users in
  user order), ``user_id``, ``tracked_at`` (UTC), ``elevation``, point ``geom``. Written one user at a
  time (24.7M fixes on the full GeoLife data never sit in memory together): CSV by trackintel's
  ``write_positionfixes_csv`` appending to one file; GeoParquet one row group per user.
* **staypoints**: every generated staypoint (``02_staypoints/``, as trackintel's ``generate_staypoints``
  gives them): ``id``, ``user_id``, ``started_at``, ``finished_at``, ``elevation``, ``n_pfs``,
  ``location_id`` (the dataset-level DBSCAN location of the activity staypoints of the kept users, NaN
  elsewhere, as trackintel leaves noise) and point ``geom``.
* **locations**: as trackintel's ``generate_locations(agg_level="dataset")``: one row per (user,
  location) pair, index ``id`` the location id (shared across users), ``user_id``, point ``center``
  (the mean of the location's staypoints, as ``vocabulary/locations.parquet``'s centres).

Decision: CSV (the default) goes through trackintel's own writers, so trackintel's CSV readers read it
(``ti.read_staypoints_csv(path, index_col="id")``); GeoParquet is geopandas' (``gpd.read_parquet`` then
``ti.Staypoints(...)``), exact coordinates and much smaller files. Every file is written atomically.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from nextloc.atomic import atomic_path
from nextloc.io.geoparquet import CRS_EPSG, geo_metadata

# trackintel, geopandas and the modules that bring numba and scikit-learn are imported where used: every
# CLI command imports this module for TRACKINTEL_FORMATS, and they take seconds to import
if TYPE_CHECKING:
    import geopandas as gpd
    import trackintel as ti

logger = logging.getLogger(__name__)

TrackintelFormat = Literal["csv", "geoparquet"]
TRACKINTEL_FORMATS: tuple[str, ...] = ("csv", "geoparquet")
_SUFFIX = {"csv": ".csv", "geoparquet": ".parquet"}
_CRS = f"EPSG:{CRS_EPSG}"


def _points(frame: pd.DataFrame) -> gpd.array.GeometryArray:
    import geopandas as gpd

    return gpd.points_from_xy(frame["longitude"], frame["latitude"], crs=_CRS)


def positionfixes_model(table: pa.Table, first_id: int = 0) -> ti.Positionfixes:
    """One user's positionfixes (nextloc's positionfix schema) as ``ti.Positionfixes``, ids from ``first_id``."""
    import geopandas as gpd
    import trackintel as ti

    frame = table.to_pandas()
    out = gpd.GeoDataFrame(
        {
            "user_id": frame["user_id"].to_numpy(np.int64),
            "tracked_at": frame["tracked_at"],
            "elevation": frame["elevation"],
        },
        geometry=_points(frame),
        index=pd.RangeIndex(first_id, first_id + len(frame), name="id"),
    ).rename_geometry("geom")
    return ti.Positionfixes(out)


def staypoints_model(staypoints: pd.DataFrame, located: pd.DataFrame | None) -> ti.Staypoints:
    """Every user's staypoints (:data:`~nextloc.preprocessing.staypoints.STAYPOINT_COLUMNS`, sorted by user and start)
    as ``ti.Staypoints``, with the DBSCAN ``location_id`` of those in ``located`` (``03_locations``)."""
    import geopandas as gpd
    import trackintel as ti

    from nextloc.preprocessing.staypoints import STAYPOINT_COLUMNS

    sp = staypoints[STAYPOINT_COLUMNS].reset_index(drop=True)
    keys = ["user_id", "started_at", "finished_at"]
    if located is not None and len(located):
        ids = located[[*keys, "location_id"]].astype({"location_id": np.float64})
        sp = sp.merge(ids, on=keys, how="left", validate="one_to_one")
    else:
        sp["location_id"] = np.nan
    out = gpd.GeoDataFrame(
        sp[["user_id", "started_at", "finished_at", "elevation", "n_pfs", "location_id"]].astype(
            {"user_id": np.int64}
        ),
        geometry=_points(sp),
    ).rename_geometry("geom")
    out.index = pd.RangeIndex(len(out), name="id")
    return ti.Staypoints(out)


def locations_model(located: pd.DataFrame) -> ti.Locations:
    """The DBSCAN locations of the located staypoints as ``ti.Locations``: one row per (user, location)."""
    import geopandas as gpd
    import trackintel as ti

    from nextloc.preprocessing.vocabulary import location_centres

    centres = location_centres(located)
    pairs = located[["user_id", "location_id"]].drop_duplicates().sort_values(["location_id", "user_id"])
    rows = pairs.join(centres[["latitude", "longitude"]], on="location_id")
    out = gpd.GeoDataFrame(
        {"user_id": rows["user_id"].to_numpy(np.int64)},
        geometry=_points(rows),
        index=pd.Index(rows["location_id"].to_numpy(np.int64), name="id"),
    ).rename_geometry("center")
    return ti.Locations(out)


def write_model(model: gpd.GeoDataFrame, path: Path, fmt: TrackintelFormat) -> None:
    """Write a staypoints or locations model atomically: trackintel's CSV writer, or geopandas' GeoParquet."""
    with atomic_path(path) as tmp:
        if fmt == "csv":
            model.to_csv(tmp)  # ti.Staypoints.to_csv / ti.Locations.to_csv: trackintel's writers
        else:
            model.to_parquet(tmp, index=True, compression="zstd")


def write_positionfixes(tables: Iterable[pa.Table], path: Path, fmt: TrackintelFormat) -> int:
    """Write positionfixes one table (one user) at a time into one file, atomically; returns the row count.

    CSV: trackintel's ``write_positionfixes_csv`` appends each user (``longitude`` / ``latitude`` columns,
    the header once). GeoParquet: one row group per user with the ``geo`` metadata (no bounding box: it
    is optional, and unknown until the last user).
    """
    with atomic_path(path) as tmp:
        write = _positionfixes_csv if fmt == "csv" else _positionfixes_geoparquet
        return write(tables, tmp)


def _positionfixes_csv(tables: Iterable[pa.Table], tmp: Path) -> int:
    import trackintel as ti

    n = 0
    with open(tmp, "w", newline="") as fh:
        for table in tables:
            pfs = positionfixes_model(table, first_id=n)
            ti.io.write_positionfixes_csv(pfs, fh, header=n == 0)
            n += len(pfs)
    return n


def _positionfixes_geoparquet(tables: Iterable[pa.Table], tmp: Path) -> int:
    n = 0
    writer: pq.ParquetWriter | None = None
    try:
        for table in tables:
            pfs = positionfixes_model(table, first_id=n)
            frame = pd.DataFrame(pfs.drop(columns="geom")).reset_index()
            part = pa.Table.from_pandas(frame, preserve_index=False)
            part = part.append_column("geom", pa.array(pfs.geometry.to_wkb(), pa.binary()))
            lon, lat = table.column("longitude").to_numpy(), table.column("latitude").to_numpy()
            part = part.replace_schema_metadata({b"geo": geo_metadata(lon, lat, "geom", bbox=False)})
            writer = writer or pq.ParquetWriter(tmp, part.schema, compression="zstd")
            writer.write_table(part)
            n += len(pfs)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise ValueError(f"no positionfixes to write to {tmp}")
    return n


def export_trackintel(
    positionfix_files: list[Path],
    staypoint_files: list[Path],
    located_file: Path | None,
    out_dir: Path,
    fmt: TrackintelFormat = "csv",
) -> dict[str, int]:
    """Write a dataset's layers as trackintel models under ``out_dir``; returns the rows of each.

    Args:
        positionfix_files: each user's positionfixes parquet (none for a visits input).
        staypoint_files: each user's staypoints parquet, in user order.
        located_file: the located staypoints (``03_locations``), or None before DBSCAN ran.
        out_dir: the folder to write ``positionfixes``, ``staypoints``, ``locations`` into.
        fmt: ``csv`` (trackintel's writers) or ``geoparquet``.

    Raises:
        FileNotFoundError: if there is no staypoint file (the dataset is not preprocessed).
    """
    from nextloc.preprocessing.staypoints import STAYPOINT_COLUMNS

    if fmt not in TRACKINTEL_FORMATS:
        raise ValueError(f"unknown trackintel export format {fmt!r}; expected one of {TRACKINTEL_FORMATS}")
    if not staypoint_files:
        raise FileNotFoundError("no staypoints to export: run `nextloc preprocess` on this data dir first")
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = _SUFFIX[fmt]
    counts: dict[str, int] = {}
    if positionfix_files:
        tables = (pq.read_table(p) for p in positionfix_files)
        counts["positionfixes"] = write_positionfixes(tables, out_dir / f"positionfixes{suffix}", fmt)
    staypoints = pd.concat(
        [pq.read_table(p, columns=STAYPOINT_COLUMNS).to_pandas() for p in staypoint_files], ignore_index=True
    )
    located = None
    if located_file is not None and located_file.is_file():
        located = pq.read_table(
            located_file,
            columns=["user_id", "started_at", "finished_at", "latitude", "longitude", "location_id"],
        ).to_pandas()
    sp = staypoints_model(staypoints, located)
    write_model(sp, out_dir / f"staypoints{suffix}", fmt)
    counts["staypoints"] = len(sp)
    if located is not None and len(located):
        locs = locations_model(located)
        write_model(locs, out_dir / f"locations{suffix}", fmt)
        counts["locations"] = int(locs.index.nunique())
    logger.info("trackintel export (%s) to %s: %s", fmt, out_dir, counts)
    return counts
