"""``nextloc map``: a preprocessed data directory's staypoints, locations and shared recordings as a web
map (:mod:`nextloc.maps.dataset`), read through the catalog."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow.parquet as pq

from nextloc.storage import read_parquet
from runtime.catalog import Catalog

logger = logging.getLogger(__name__)

LOCATION_COLUMNS = ["loc_index", "raw_location_id", "latitude", "longitude"]


def draw_dataset_map(data_dir: str | Path, out: Path, user: int | None = None) -> Path:
    """Write the map of ``data_dir`` (its final staypoints, location vocabulary and ingest report's
    duplicates) to ``out``, an ``.html`` file; with ``user``, that user's staypoints and moves too.

    Raises:
        ValueError: ``out`` is not ``.html``, or what :func:`nextloc.maps.dataset.dataset_page` rejects.
        FileNotFoundError: the staypoints are missing (the message says how to make them), or Leaflet's
            files (the message names the Debian package).
    """
    from nextloc.maps.dataset import STAYPOINT_COLUMNS, dataset_page

    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"--out {out}: the map is a web page; name an .html file")
    catalog = Catalog(str(data_dir))
    if not catalog.staypoints.is_file():
        raise FileNotFoundError(
            f"{catalog.staypoints} is missing: {data_dir} is not a preprocessed data directory "
            "(run `nextloc preprocess --raw-dir ... --data-dir ...` first)"
        )
    names = set(pq.read_schema(catalog.staypoints).names)
    missing = [c for c in STAYPOINT_COLUMNS if c not in names]
    if missing:
        raise ValueError(f"{catalog.staypoints}: no column(s) {missing}; preprocess the data again")
    staypoints = read_parquet(catalog.staypoints, columns=list(STAYPOINT_COLUMNS))
    vocabulary = catalog.vocabulary("locations")
    locations = read_parquet(vocabulary, columns=LOCATION_COLUMNS) if vocabulary.is_file() else None
    duplicates = None
    if catalog.ingest_report.is_file():
        duplicates = json.loads(catalog.ingest_report.read_text()).get("duplicates")
    drawn = dataset_page(staypoints, locations, duplicates, out, user, source=str(data_dir))
    logger.info(
        "map of %s: %s", data_dir, ", ".join(f"{layer.name}: {layer.markers}" for layer in drawn.layers)
    )
    return drawn.path
