"""Reading the history a person sends to ask where they go next: visits, raw GPS fixes or dataset samples.

Every row is checked before anything is encoded (:mod:`nextloc.io.visits`): a bad row is an error naming the
file (or ``JSON text``, or ``request``), the row and the field, never a row dropped. Raw positionfixes become
visits right away, with the dataset's own staypoint parameters, so that a history is the same visits
whether the app sends fixes or visits. A ``.plt`` file's user is its GeoLife folder's number unless given.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from nextloc.config import PreprocessConfig
from nextloc.io.geolife import list_plt_files, read_user
from nextloc.io.visits import POSITIONFIX_COLUMNS, VISIT_COLUMNS, validate_positionfixes, validate_visits
from nextloc.models.packed import pack_histories
from nextloc.preprocessing.staypoints import generate_staypoints

logger = logging.getLogger(__name__)

SAMPLE_COLUMNS = ("loc_hist", "start_min_hist", "weekday_hist", "duration_hist", "diff_hist", "user")


@dataclass
class RawHistory:
    """A history as read from a file, before encoding.

    ``kind`` is ``"visits"`` (``data`` a validated DataFrame), ``"samples"`` (``data`` a samples table in the
    model's ids) or ``"packed"`` (``data`` a packed ``(B, T, 6)`` array, the older JSON form).
    """

    kind: str
    data: Any
    source: str


def read_history(source: str | Path, config: PreprocessConfig, user_id: int | None = None) -> RawHistory:
    """Read a history file (or JSON text) and check it; positionfixes become visits right away.

    Args:
        source: a ``.csv``, ``.parquet``, ``.json`` or ``.plt`` file, a folder of ``.plt`` files (a GeoLife
            ``Trajectory`` folder or the user folder holding it), or JSON text.
        config: the dataset's preprocessing config (staypoint parameters for positionfixes).
        user_id: the raw user id for an input without a ``user_id`` column (a ``.plt`` under
            ``Data/NNN/Trajectory/`` is user ``NNN`` without it).

    Returns:
        The history: visits, samples or packed histories (see :class:`RawHistory`).

    Raises:
        ValueError: naming the file, row and field of bad input.
        FileNotFoundError: a path that does not exist.
    """
    text = str(source)
    path = Path(text)
    looks_like_json = text.lstrip().startswith(("{", "["))
    if looks_like_json:
        return _read_json(text, "JSON text", config, user_id)
    if not path.exists():
        raise FileNotFoundError(f"--history {text}: no such file or folder")
    if path.is_dir() or path.suffix.lower() == ".plt":
        return RawHistory("visits", _visits_from_plt(path, config, user_id), text)
    if path.suffix.lower() == ".json":
        return _read_json(path.read_text(), text, config, user_id)
    if path.suffix.lower() == ".parquet":
        table = pq.read_table(path)
        if "loc_hist" in table.column_names:
            missing = [c for c in SAMPLE_COLUMNS if c not in table.column_names]
            if missing:
                raise ValueError(f"{text}: samples parquet lacks column(s) {missing}")
            if table.num_rows == 0:
                raise ValueError(f"{text}: empty history (no sample)")
            return RawHistory("samples", table, text)
        return _table_history(table.to_pandas(), text, config, user_id)
    if path.suffix.lower() == ".csv":
        try:
            frame = pd.read_csv(path, dtype={"started_at": str, "finished_at": str, "tracked_at": str})
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            raise ValueError(f"{text}: not a readable CSV file: {err}") from err
        return _table_history(frame, text, config, user_id)
    raise ValueError(f"{text}: unknown history format (expected .csv, .parquet, .json, .plt or a folder)")


def visits_from_positionfixes(positionfixes: pd.DataFrame, config: PreprocessConfig) -> pd.DataFrame:
    """Staypoints of every user's fixes with the dataset's parameters, as visits (one row per staypoint).

    Args:
        positionfixes: validated fixes (:func:`validate_positionfixes`), any number of users.
        config: the dataset's preprocessing config (``staypoints`` and the tripleg gap of ``quality``).
    """
    frames = []
    for _, fixes in positionfixes.groupby("user_id", sort=False):
        result = generate_staypoints(
            fixes[list(POSITIONFIX_COLUMNS)],
            config.staypoints,
            tripleg_gap_threshold_min=config.quality.tripleg_gap_threshold_min,
        )
        frames.append(result.staypoints[list(VISIT_COLUMNS)])
    visits = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(VISIT_COLUMNS))
    visits["user_id"] = visits["user_id"].astype(np.int64)
    logger.info("%d positionfixes -> %d staypoints", len(positionfixes), len(visits))
    return visits


def _read_json(text: str, source: str, config: PreprocessConfig, user_id: int | None) -> RawHistory:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{source}: not valid JSON: {err}") from err
    if isinstance(data, dict) and "dataframe_records" in data:  # the MLflow serving request, as is
        data = data["dataframe_records"]
    elif isinstance(data, dict) and "dataframe_split" in data:
        split = data["dataframe_split"]
        data = [dict(zip(split["columns"], row, strict=True)) for row in split["data"]]
    rows = data if isinstance(data, list) else [data]
    if not rows:
        raise ValueError(f"{source}: empty history (no visit)")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{source} row {i + 1}: expected an object with fields {list(VISIT_COLUMNS)}")
    if "location" in rows[0]:  # the older packed form, in the model's ids
        return RawHistory("packed", pack_histories(rows), source)
    return _table_history(pd.DataFrame.from_records(rows), source, config, user_id)


def _table_history(
    frame: pd.DataFrame, source: str, config: PreprocessConfig, user_id: int | None
) -> RawHistory:
    if "user_id" not in frame.columns and user_id is not None:
        frame = frame.assign(user_id=user_id)
    if "tracked_at" in frame.columns and "started_at" not in frame.columns:
        fixes = validate_positionfixes(frame, source)
        return RawHistory("visits", _staypoints_as_visits(fixes, config, source), source)
    return RawHistory("visits", validate_visits(frame, source), source)


def _visits_from_plt(path: Path, config: PreprocessConfig, user_id: int | None) -> pd.DataFrame:
    if path.is_dir() and (path / "Trajectory").is_dir():  # a GeoLife user folder
        files, user_dir = list_plt_files(path), path
    elif path.is_dir():  # a Trajectory folder (or any folder of .plt files)
        files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".plt" and p.is_file())
        user_dir = path.parent if path.name == "Trajectory" else path
    else:
        files, user_dir = [path], path.parent.parent
    if user_id is None:
        if not (user_dir.name.isascii() and user_dir.name.isdigit()):
            raise ValueError(
                f"{path}: not under Data/NNN/Trajectory/, so the user is unknown: give the user id"
            )
        user_id = int(user_dir.name)
    if not files:
        raise ValueError(f"{path}: empty history (no .plt file)")
    table, report = read_user(user_id, files)
    for issue in report.issues:
        logger.warning("skipped %s", issue)
    if table.num_rows == 0:
        raise ValueError(f"{path}: empty history (no readable GPS fix; {report.to_dict()['counts']})")
    return _staypoints_as_visits(table.to_pandas(), config, str(path))


def _staypoints_as_visits(fixes: pd.DataFrame, config: PreprocessConfig, source: str) -> pd.DataFrame:
    visits = visits_from_positionfixes(fixes, config)
    if not len(visits):
        sp = config.staypoints
        raise ValueError(
            f"{source}: empty history: no staypoint (a stay of {sp.time_threshold_min:g} min or more within "
            f"{sp.dist_threshold_m:g} m) in {len(fixes)} GPS fixes"
        )
    return validate_visits(visits, source)
