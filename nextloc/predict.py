"""From what a user has (visits or raw GPS fixes) to the next places, named, with coordinates.

A model knows encoded ids; a user's app has GPS fixes or visits. This module turns a recent history into
the model's input exactly as preprocessing does, and the model's output into answers people can use:

1. **Read** a history (:func:`read_history`): visits (``user_id``, ``started_at``, ``finished_at``,
   ``latitude``, ``longitude``; CSV, parquet or JSON), raw positionfixes (a ``.plt`` file, a folder of them,
   or CSV/parquet of ``tracked_at``, ``latitude``, ``longitude``), or a samples parquet of the dataset.
   Every row is checked (:func:`validate_visits`, :func:`validate_positionfixes`): a bad row is an error
   naming the file, the row and the field.
2. **Positionfixes -> visits** with the dataset's own staypoint parameters
   (:func:`nextloc.staypoints.generate_staypoints`).
3. **Visits -> a history in the model's ids** (:func:`encode_visits`): only activities count (the
   dataset's ``activity_time_threshold_min``, :func:`nextloc.staypoints.create_activity_flag`); each visit is
   the known location with the nearest centre within the model's match radius, else a new place (``1``,
   :func:`nextloc.vocabulary.nearest_locations`); consecutive visits of one location are merged as in
   preprocessing (:func:`nextloc.locations.merge_staypoints`); time features come from
   :func:`nextloc.sequences.add_time_features` in the dataset's timezone, durations are capped at its
   ``duration_cap_min``; the history is the visits that started in the ``previous_days`` days before the
   prediction time (default: the end of the last visit), ``diff`` counted in days as in preprocessing. The
   user is the raw (GeoLife) user id; a user the model never saw is said so (``known_user: false``) and
   scored as user ``0``.
4. **Score** many histories at once in batches (:func:`predict`): the top-k known places (ids ``>= 2``
   only, probabilities renormalised over places), each with its location id, centre and number of visits in
   the training data, and ``p_new_place`` from the model's new-place head.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from nextloc.config import PreprocessConfig
from nextloc.data import pad_lists
from nextloc.geolife import list_plt_files, read_user
from nextloc.locations import merge_staypoints
from nextloc.novelty import novelty_features
from nextloc.sequences import FIRST_PLACE, UNSEEN, add_time_features
from nextloc.serving import PACKED_FEATURES, ModelBundle, pack_histories, packed_batch, top_k
from nextloc.staypoints import create_activity_flag, generate_staypoints
from nextloc.visits import (
    HISTORY_ID,
    POSITIONFIX_COLUMNS,
    VISIT_COLUMNS,
    parse_time,
    validate_positionfixes,
    validate_visits,
)
from nextloc.vocabulary import nearest_locations

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


@dataclass
class Histories:
    """Histories in the model's ids, ready to score.

    Attributes:
        packed: ``(B, T, 6)`` int64, :data:`nextloc.serving.PACKED_FEATURES`, right-padded with 0.
        meta: one row per history (what the answer says about it: ``user_id``, ``known_user``, ``at``,
            ``visits_used``, ``new_place_visits``, ...), in the order of the input.
        visits: every visit of the request before each question (not only the window), for the routine
            kinds: ``history``, ``started_at``, ``finished_at``, ``place`` (encoded), ``raw_place``; None
            for histories that were never visits (a samples table).
        at: ``(B,)`` each question's time (UTC), with ``visits``.
    """

    packed: np.ndarray
    meta: pd.DataFrame
    visits: pd.DataFrame | None = None
    at: pd.Series | None = None


# --------------------------------------------------------------------------- #
# reading and checking
# --------------------------------------------------------------------------- #


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


# --------------------------------------------------------------------------- #
# encoding
# --------------------------------------------------------------------------- #


def encode_visits(visits: pd.DataFrame, bundle: ModelBundle, at: pd.Timestamp | None = None) -> Histories:
    """Visits of one or many users -> histories in the model's ids (see the module docstring, step 3).

    Args:
        visits: validated visits (:func:`validate_visits`); an optional ``history_id`` column splits one
            user's visits into several histories (else one history per ``user_id``).
        bundle: the model, its vocabulary and its dataset's config.
        at: the prediction time for every history (tz-aware, or naive UTC); default: the end of each
            history's last visit.

    Returns:
        The packed histories and one meta row per history, in order of first appearance in ``visits``.

    Raises:
        ValueError: the model has no location vocabulary, or a history has no visit left to score (none
            is an activity that started within the window).
    """
    if bundle.locations is None:
        raise ValueError(
            f"the {bundle.kind} model was stored without a location vocabulary: it cannot read visits"
        )
    cfg = bundle.preprocess
    if not len(visits):
        raise ValueError("empty history: no visit given")
    v = visits.reset_index(drop=True)
    keys = v[HISTORY_ID] if HISTORY_ID in v.columns else v["user_id"]
    hist, uniques = pd.factorize(keys, sort=False)
    n_hist = len(uniques)
    first_row = np.full(n_hist, len(v), dtype=np.int64)
    np.minimum.at(first_row, hist, np.arange(len(v)))
    user_ids = v["user_id"].to_numpy(np.int64)[first_row]
    if HISTORY_ID in v.columns:
        per_history_users = v.groupby(hist)["user_id"].nunique()
        if (per_history_users > 1).any():
            bad = uniques[int(per_history_users.idxmax())]
            raise ValueError(f"history_id {bad!r} holds visits of several users")

    # the prediction time of each history and the visits before it
    if at is None:
        at_ns = np.full(n_hist, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(at_ns, hist, _ns(v["finished_at"]))
    else:
        stamp = pd.Timestamp(at)
        stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
        at_ns = np.full(n_hist, stamp.value, dtype=np.int64)
    at_utc = pd.to_datetime(at_ns, utc=True)
    activity = create_activity_flag(v, cfg.staypoints.activity_time_threshold_min)["is_activity"].to_numpy()
    before = _ns(v["started_at"]) < at_ns[hist]
    keep = activity & before

    # which known place each visit is; new places get their own id so that they never merge
    loc = nearest_locations(
        v["latitude"].to_numpy(), v["longitude"].to_numpy(), bundle.locations, bundle.match_radius_m
    )
    merge_id = np.where(loc >= FIRST_PLACE, loc, -1 - np.arange(len(v)))
    frame = v.loc[keep, ["started_at", "finished_at"]].reset_index(drop=True)
    frame.insert(0, "user_id", hist[keep])
    frame["location_id"] = merge_id[keep]
    merged = merge_staypoints(frame, cfg.locations.merge_max_gap_min)
    sp = add_time_features(merged, cfg.timezone)  # sorted by (history, start_day, start_min)
    merge_ids = sp["location_id"].to_numpy(np.int64)
    request = pd.DataFrame(
        {
            "history": sp["user_id"].to_numpy(np.int64),
            "started_at": sp["started_at"].to_numpy(),
            "finished_at": sp["finished_at"].to_numpy(),
            "place": np.where(merge_ids >= FIRST_PLACE, merge_ids, UNSEEN),
            "raw_place": merge_ids,
        }
    )

    # days before the prediction day, in the dataset's timezone, as the samples' diff_hist
    h = sp["user_id"].to_numpy(np.int64)
    start_date = _local_day(sp["started_at"], cfg.timezone)
    at_date = _local_day(pd.Series(at_utc), cfg.timezone)
    diff = at_date[h] - start_date
    in_window = diff <= cfg.samples.previous_days
    sp = sp.loc[in_window].reset_index(drop=True)
    h, diff = h[in_window], diff[in_window]
    position_from_end = sp.groupby(h).cumcount(ascending=False).to_numpy()
    if bundle.max_history is not None:  # the most recent visits the model can take
        recent = position_from_end < bundle.max_history
        sp, h, diff, position_from_end = (
            sp.loc[recent].reset_index(drop=True),
            h[recent],
            diff[recent],
            position_from_end[recent],
        )

    lengths = np.bincount(h, minlength=n_hist)
    empty = np.flatnonzero(lengths == 0)
    if len(empty):
        names = ", ".join(_history_name(uniques[i], user_ids[i]) for i in empty[:5])
        raise ValueError(
            f"empty history: {len(empty)} of {n_hist} histories have no visit to score ({names}"
            f"{', ...' if len(empty) > 5 else ''}): a visit counts if it lasted more than "
            f"{cfg.staypoints.activity_time_threshold_min:g} min and started in the "
            f"{cfg.samples.previous_days} days before the prediction time"
        )
    users = _user_index(user_ids, bundle.users)
    encoded_loc = np.where(sp["location_id"].to_numpy() >= FIRST_PLACE, sp["location_id"].to_numpy(), UNSEEN)
    width = int(lengths.max())
    position = sp.groupby(h).cumcount().to_numpy()
    packed = np.zeros((n_hist, width, len(PACKED_FEATURES)), dtype=np.int64)
    packed[h, position, 0] = encoded_loc
    packed[h, position, 1] = sp["start_min"].to_numpy()
    packed[h, position, 2] = sp["weekday"].to_numpy()
    packed[h, position, 3] = np.minimum(sp["duration"].to_numpy(), cfg.samples.duration_cap_min)
    packed[h, position, 4] = diff
    packed[:, :, 5] = users[:, None]
    meta = pd.DataFrame(
        {
            "user_id": user_ids,
            "known_user": users > 0,
            "at": at_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "visits_used": lengths,
            "new_place_visits": np.bincount(h, weights=encoded_loc == UNSEEN, minlength=n_hist).astype(
                np.int64
            ),
        }
    )
    if HISTORY_ID in v.columns:
        meta.insert(0, HISTORY_ID, np.asarray(uniques, dtype=object))
    logger.info(
        "%d visits -> %d histories (%d visits used, %d of them at new places, %d unknown users)",
        len(v),
        n_hist,
        int(lengths.sum()),
        int(meta["new_place_visits"].sum()),
        int((~meta["known_user"]).sum()),
    )
    return Histories(packed, meta, request, pd.Series(at_utc))


def sample_histories(table: pa.Table) -> Histories:
    """The histories of a samples table (already in the model's ids), packed without a Python loop; times
    and durations in minutes as the table holds them (the scorer bins them as training does)."""
    lengths = table.column("hist_len").to_numpy().astype(np.int64)
    width = max(int(lengths.max()) if len(lengths) else 1, 1)
    packed = np.zeros((len(lengths), width, len(PACKED_FEATURES)), dtype=np.int64)
    for j, column in enumerate(("loc_hist", "start_min_hist", "weekday_hist", "duration_hist", "diff_hist")):
        packed[:, :, j] = pad_lists(table.column(column), lengths, width)
    packed[:, :, 5] = table.column("user").to_numpy().astype(np.int64)[:, None]
    meta = pd.DataFrame({"user_id": table.column("user_id").to_numpy().astype(np.int64)})
    meta["known_user"] = packed[:, 0, 5] > 0
    if "staypoint_id" in table.column_names:
        meta["staypoint_id"] = table.column("staypoint_id").to_numpy()
    return Histories(packed, meta)


def packed_histories(packed: np.ndarray) -> Histories:
    """Histories already packed in the model's ids (the older JSON form): no raw user id is known."""
    return Histories(packed, pd.DataFrame({"user": packed[:, 0, 5]}))


def to_histories(raw: RawHistory, bundle: ModelBundle, at: pd.Timestamp | None = None) -> Histories:
    """Any :class:`RawHistory` -> :class:`Histories` for ``bundle``."""
    if raw.kind == "visits":
        return encode_visits(raw.data, bundle, at)
    if raw.kind == "samples":
        return sample_histories(raw.data)
    return packed_histories(raw.data)


# --------------------------------------------------------------------------- #
# scoring and answers
# --------------------------------------------------------------------------- #


def predict(
    bundle: ModelBundle, histories: Histories, k: int = 5, batch_size: int = 2048, progress: bool = False
) -> list[dict[str, Any]]:
    """Answers for every history: the top-``k`` known places and P(new place), in the input's order.

    Args:
        bundle: the model.
        histories: from :func:`encode_visits` (or :func:`sample_histories`).
        k: places per answer.
        batch_size: histories scored at once.
        progress: show a progress bar (on stderr).

    Returns:
        One dict per history: its meta fields, ``p_new_place`` (when the model has a new-place head) and
        ``places``: ``rank``, ``location_id`` (>= 2), ``probability`` (over places) and, with a vocabulary,
        ``latitude``, ``longitude`` and ``n_visits`` (staypoints at this place in the training data).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    routine = _routine_answers(bundle, histories)
    n = len(histories.packed)
    ranked: list[np.ndarray] = []
    probabilities: list[np.ndarray] = []
    p_new: list[np.ndarray] = []
    columns = [TextColumn("scoring histories"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
    bar_console = Console(stderr=True)  # stdout is for the answers
    with (
        Progress(*columns, console=bar_console, disable=not progress, transient=True) as bar,
        torch.no_grad(),
    ):
        task = bar.add_task("score", total=n)
        for start in range(0, n, batch_size):
            chunk = histories.packed[start : start + batch_size]
            width = max(int((chunk[:, :, 0] != 0).sum(axis=1).max()), 1)
            packed = torch.from_numpy(np.ascontiguousarray(chunk[:, :width]))
            if routine is None:
                probs = bundle.scorer(packed)  # (b, V)
            else:
                probs = torch.from_numpy(routine[0][start : start + batch_size]).exp()
            if bundle.head is not None:
                batch = packed_batch(packed, bundle.preprocess.samples.duration_cap_min)
                features = novelty_features(probs.clamp(min=1e-30).log(), batch).numpy().astype(np.float64)
                if routine is not None:
                    features = np.column_stack([features, routine[1][start : start + batch_size]])
                p_new.append(bundle.head.predict(features))
            places = probs[:, FIRST_PLACE:].numpy().astype(np.float64)
            places /= np.clip(places.sum(axis=1, keepdims=True), 1e-12, None)
            top = top_k(places, k)
            ranked.append(np.array([[loc + FIRST_PLACE for loc, _ in row] for row in top], dtype=np.int64))
            probabilities.append(np.array([[p for _, p in row] for row in top]))
            bar.advance(task, len(chunk))
    return _answers(bundle, histories.meta, np.concatenate(ranked), np.concatenate(probabilities), p_new)


def _routine_answers(bundle: ModelBundle, histories: Histories) -> tuple[np.ndarray, np.ndarray] | None:
    """A routine kind's log-probabilities and explore features for every history (None: not a routine
    kind, whose scorer reads the packed histories)."""
    if bundle.routine is None:
        return None
    if histories.visits is None:
        raise ValueError(
            f"the {bundle.kind} model answers from visits or positionfixes (it reads the user's whole past), "
            "not from a samples table or packed histories"
        )
    return bundle.routine.answer(histories.visits, histories.packed[:, 0, 5], histories.at)


def predict_visits(
    bundle: ModelBundle, visits: pd.DataFrame, k: int = 5, at: str | pd.Timestamp | None = None
) -> list[dict[str, Any]]:
    """Visits (a DataFrame, e.g. from an HTTP request) -> answers: :func:`validate_visits`,
    :func:`encode_visits`, :func:`predict`."""
    checked = validate_visits(visits, "request")
    stamp = None if at is None or at == "" else parse_time(at, "request", "at")
    return predict(bundle, encode_visits(checked, bundle, stamp), k)


def _answers(
    bundle: ModelBundle,
    meta: pd.DataFrame,
    ranked: np.ndarray,
    probs: np.ndarray,
    p_new: Sequence[np.ndarray],
) -> list[dict[str, Any]]:
    places = bundle.locations.set_index("loc_index") if bundle.locations is not None else None
    details: dict[int, dict[str, Any]] = {}
    if places is not None:
        wanted = np.unique(ranked)
        found = places.reindex(wanted)
        for loc, row in zip(wanted.tolist(), found.itertuples(), strict=True):
            if row.latitude == row.latitude:  # a location the vocabulary knows
                details[loc] = {
                    "latitude": round(float(row.latitude), 6),
                    "longitude": round(float(row.longitude), 6),
                    # visits the model learnt from (bundles written before that column: all staypoints)
                    "n_visits": int(getattr(row, "n_train_visits", row.n_staypoints)),
                }
    p_new_all = np.concatenate(p_new) if p_new else None
    records = meta.to_dict(orient="records")
    answers = []
    for i, record in enumerate(records):
        answer = {key: _plain(value) for key, value in record.items()}
        if p_new_all is not None:
            answer["p_new_place"] = round(float(p_new_all[i]), 6)
        answer["places"] = [
            {
                "rank": r + 1,
                "location_id": int(loc),
                **details.get(int(loc), {}),
                "probability": round(float(p), 6),
            }
            for r, (loc, p) in enumerate(zip(ranked[i], probs[i], strict=True))
        ]
        answers.append(answer)
    return answers


def example_visits(staypoints: pd.DataFrame, locations: pd.DataFrame, n: int = 6) -> pd.DataFrame:
    """A few real visits in the input format (a registered model's input example): the last ``n``
    staypoints of the first user at known locations, at their location's centre, times as ISO text.

    Args:
        staypoints: a dataset's final staypoints (``user_id``, ``location_id``, ``started_at``, ...).
        locations: its location vocabulary.
    """
    known = staypoints[staypoints["location_id"] >= FIRST_PLACE]
    user = known[known["user_id"] == known["user_id"].iloc[0]].sort_values("started_at").tail(n)
    centres = locations.set_index("loc_index").loc[user["location_id"].to_numpy()]
    return pd.DataFrame(
        {
            "user_id": user["user_id"].to_numpy(np.int64),
            "started_at": user["started_at"].dt.strftime("%Y-%m-%dT%H:%M:%SZ").to_numpy(),
            "finished_at": user["finished_at"].dt.strftime("%Y-%m-%dT%H:%M:%SZ").to_numpy(),
            "latitude": centres["latitude"].to_numpy(np.float64),
            "longitude": centres["longitude"].to_numpy(np.float64),
        }
    )


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


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


def _ns(times: pd.Series) -> np.ndarray:
    return times.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy("datetime64[ns]").view(np.int64)


def _local_day(times: pd.Series, timezone: str) -> np.ndarray:
    """Whole days since the epoch of each time's wall-clock date in ``timezone``."""
    local = times.dt.tz_convert(timezone).dt.tz_localize(None).dt.normalize()
    return local.to_numpy("datetime64[D]").astype(np.int64)


def _user_index(user_ids: np.ndarray, users: pd.DataFrame | None) -> np.ndarray:
    if users is None or not len(users):
        return np.zeros(len(user_ids), dtype=np.int64)
    lookup = pd.Series(users["user_index"].to_numpy(np.int64), index=users["user_id"].to_numpy(np.int64))
    return lookup.reindex(user_ids).fillna(0).to_numpy(np.int64)


def _history_name(key: Any, user_id: int) -> str:
    return f"user {user_id}" if key == user_id else f"history {key!r} of user {user_id}"


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value
