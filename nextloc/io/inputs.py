"""Inputs beside GeoLife: what to read (:class:`InputSpec`, the input files) and the readers of each format.

The readers live with their format (:mod:`nextloc.io.tabular` for CSV and parquet, :mod:`nextloc.io.gpx`) and
take an :class:`InputSpec` from here: this module imports none of them.

Every reader follows the GeoLife reader's rules (:mod:`nextloc.io.geolife`): a bad row is reported with its
file and row and skipped, the good rows around it are kept with their exact values, a bad file costs that
file, and every issue lands in an :class:`~nextloc.io.geolife.IngestReport`.

* **CSV / parquet positionfixes** (:func:`nextloc.io.tabular.read_positionfix_files`): columns ``user_id``, ``tracked_at``,
  ``latitude``, ``longitude`` and optional ``elevation`` (metres), renamed through
  :attr:`InputSpec.columns`. Times are ISO 8601 with or without a zone (``Z``, ``+08:00``; read by
  :func:`nextloc.io.visits.parse_times`); a time without a zone is wall-clock time in :attr:`InputSpec.timezone`. A parquet timestamp column works as well. CSV
  issues name the file's line (the header is line 1); parquet issues name the data row (1-based).
* **GPX** (:func:`nextloc.io.gpx.read_gpx_user`, through ``gpxpy``): every track point of every track segment; one
  folder per user, named by the user number. Issues name the track, segment and point.
* **Visits** (:func:`nextloc.io.tabular.read_visit_files`): ``user_id``, ``started_at``, ``finished_at``, ``latitude``,
  ``longitude``; they enter the pipeline as staypoints (after staypoint generation).
* **trackintel staypoints** (the same reader, ``format="trackintel"``): trackintel's CSV writer's output
  (or GeoParquet): ``user_id``, ``started_at``, ``finished_at`` and the point ``geom`` (WKT or WKB); other
  columns are ignored. A ``geom`` that is not a point is a ``bad_geometry`` row.

Rows keep their read order: the staypoint step sorts by time (stable), as for GeoLife.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nextloc.config import known_timezone
from nextloc.io.visits import POSITIONFIX_COLUMNS, VISIT_COLUMNS

InputFormat = Literal["geolife", "csv", "parquet", "gpx", "visits", "trackintel"]
INPUT_FORMATS: tuple[str, ...] = ("geolife", "csv", "parquet", "gpx", "visits", "trackintel")
# inputs that are already staypoints: they skip staypoint generation
VISIT_FORMATS: tuple[str, ...] = ("visits", "trackintel")
_SUFFIXES = {
    "csv": (".csv",),
    "parquet": (".parquet", ".pq"),
    "gpx": (".gpx",),
    "visits": (".csv", ".parquet", ".pq"),
    "trackintel": (".csv", ".parquet", ".pq"),
}


class InputSpec(BaseModel):
    """How to read an input: its kind, the column mapping, and the zone of times written without one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: InputFormat = Field("geolife", description="geolife, csv, parquet, gpx, visits or trackintel.")
    columns: dict[str, str] = Field(
        default_factory=dict, description="nextloc column -> column in the files, e.g. tracked_at=time."
    )
    timezone: str = Field("UTC", description="Zone of timestamps written without one.")

    @field_validator("columns")
    @classmethod
    def _known_columns(cls, value: dict[str, str]) -> dict[str, str]:
        known = set(POSITIONFIX_COLUMNS) | set(VISIT_COLUMNS)
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown column(s) {unknown} in the mapping; expected some of {sorted(known)}")
        sources = list(value.values())
        if len(set(sources)) != len(sources):
            raise ValueError(f"two nextloc columns map to the same file column: {value}")
        return dict(sorted(value.items()))

    _known_timezone = field_validator("timezone")(classmethod(lambda cls, value: known_timezone(value)))

    def source(self, column: str) -> str:
        """The file column holding nextloc's ``column``."""
        return self.columns.get(column, column)


def parse_columns(text: str | None) -> dict[str, str]:
    """``"user_id=uid,tracked_at=time"`` -> ``{"user_id": "uid", "tracked_at": "time"}``.

    Raises:
        ValueError: on an item that is not ``name=column``.
    """
    mapping: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, column = item.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise ValueError(f"--columns expects name=column items separated by commas, got {item!r}")
        mapping[name.strip()] = column.strip()
    return mapping


def list_input_files(raw_dir: Path, fmt: str) -> list[Path]:
    """The input files of a tabular or visits input: ``raw_dir`` itself, or its files (recursively, sorted).

    Raises:
        FileNotFoundError: if the path does not exist or holds no file of that kind.
    """
    root = Path(raw_dir)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"input not found: {root}")
    suffixes = _SUFFIXES[fmt]
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
    if not files:
        raise FileNotFoundError(f"no {'/'.join(suffixes)} files found under {root}")
    return files
