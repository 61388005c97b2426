"""Visits -> histories in the model's ids, exactly as preprocessing builds a sample's history.

:func:`encode_visits` takes validated visits (:mod:`nextloc.io.visits`) of one or many users, in steps:

1. **Which history** each visit belongs to: its ``history_id`` if the input has one (several questions
   about one user), else its ``user_id``; the user is the raw (GeoLife) user id, and a user the model never
   saw is said so (``known_user: false``) and scored as user ``0``.
2. **The question's time**: ``at`` if given, else the end of the history's last visit.
3. **Activities at known places**: only activities count (the dataset's ``activity_time_threshold_min``,
   :func:`nextloc.preprocessing.staypoints.create_activity_flag`) that started before the question; each is the known
   location with the nearest centre within the model's match radius, else a new place (``1``,
   :func:`nextloc.preprocessing.vocabulary.nearest_locations`); consecutive visits of one location merge as in
   preprocessing (:func:`nextloc.preprocessing.locations.merge_staypoints`). A new place keeps an id of its own while
   merging, so that two new places never merge into one.
4. **The window**: the visits that started in the ``previous_days`` days before the question (``diff``
   counted in days in the dataset's timezone, as the samples' ``diff_hist``), at most the model's
   ``max_history`` most recent; time features from :func:`nextloc.preprocessing.sequences.add_time_features` in the
   dataset's timezone, durations capped at its ``duration_cap_min``.

A samples table (:func:`sample_histories`) or the older packed JSON form (:func:`packed_histories`) is
already in the model's ids.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from nextloc.bundle import ModelBundle
from nextloc.config import PreprocessConfig
from nextloc.io.visits import HISTORY_ID
from nextloc.lists import pad_lists
from nextloc.models.packed import pack_columns
from nextloc.predict.history_reader import RawHistory
from nextloc.preprocessing.locations import merge_runs
from nextloc.preprocessing.sequences import DAY_NS, FIRST_PLACE, UNSEEN, WallTimes, wall_clock_ns
from nextloc.preprocessing.staypoints import activity_mask, to_ns
from nextloc.preprocessing.vocabulary import nearest_locations

logger = logging.getLogger(__name__)


@dataclass
class Histories:
    """Histories in the model's ids, ready to score.

    Attributes:
        packed: ``(B, T, 6)`` int64, :data:`nextloc.models.packed.PACKED_FEATURES`, right-padded with 0.
        meta: one row per history (what the answer says about it: ``user_id``, ``known_user``, ``at``,
            ``visits_used``, ``new_place_visits``, ...), in the order of the input.
        visits: every visit of the request before each question (not only the window), for the routine
            kinds: ``history``, ``started_at``, ``finished_at``, ``place`` (encoded), ``raw_place``,
            ``latitude``, ``longitude``; None for histories that were never visits (a samples table).
        at: ``(B,)`` each question's time (UTC), with ``visits``.
        windowed: the visits each packed row holds, as arrays (None for histories that were never
            visits); :attr:`window` is their table, built when a map asks for it, not at every answer.
    """

    packed: np.ndarray
    meta: pd.DataFrame
    visits: pd.DataFrame | None = None
    at: pd.Series | None = None
    windowed: _Stays | None = field(default=None, repr=False)

    @cached_property
    def window(self) -> pd.DataFrame | None:
        """The visits each packed row holds, in order (what a map of the answer draws,
        :func:`history_visits`): ``history``, ``started_at``, ``place`` (``1``: a new place), ``latitude``,
        ``longitude`` (the request's own coordinates of the first visit merged into it); None for
        histories that were never visits."""
        return None if self.windowed is None else _window_visits(self.windowed)


def encode_visits(visits: pd.DataFrame, bundle: ModelBundle, at: pd.Timestamp | None = None) -> Histories:
    """Visits of one or many users -> histories in the model's ids (see the module docstring).

    Args:
        visits: validated visits (:func:`nextloc.io.visits.validate_visits`); an optional ``history_id`` column
            splits one user's visits into several histories (else one history per ``user_id``).
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
    if not len(visits):
        raise ValueError("empty history: no visit given")
    v = visits.reset_index(drop=True)
    keys = _history_keys(v)
    start_ns, end_ns = to_ns(v["started_at"]), to_ns(v["finished_at"])
    at_ns = _question_times(end_ns, keys, at)
    at_utc = pd.to_datetime(at_ns, utc=True)
    stays = _merged_activities(v, start_ns, end_ns, keys.hist, at_ns, bundle)
    request = _request_visits(stays)
    stays, diff = _window(stays, at_ns, bundle)
    lengths = _visits_per_history(stays.hist, keys, bundle.preprocess)
    users = _user_index(keys.user_ids, bundle.users)
    packed = _pack(stays, diff, lengths, users, bundle.preprocess)
    meta = pd.DataFrame(
        {
            "user_id": keys.user_ids,
            "known_user": users > 0,
            "at": at_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "visits_used": lengths,
            "new_place_visits": (packed[:, :, 0] == UNSEEN).sum(axis=1).astype(np.int64),
        }
    )
    if HISTORY_ID in v.columns:
        meta.insert(0, HISTORY_ID, np.asarray(keys.uniques, dtype=object))
    logger.info(
        "%d visits -> %d histories (%d visits used, %d of them at new places, %d unknown users)",
        len(v),
        len(keys.uniques),
        int(lengths.sum()),
        int(meta["new_place_visits"].sum()),
        int((~meta["known_user"]).sum()),
    )
    return Histories(packed, meta, request, pd.Series(at_utc), stays)


@dataclass(frozen=True)
class _Keys:
    """Which history each visit belongs to.

    Attributes:
        hist: ``(N,)`` each visit's history, ``0..H-1`` in order of first appearance.
        uniques: ``(H,)`` each history's key (its ``history_id``, else its ``user_id``).
        user_ids: ``(H,)`` each history's raw user id.
    """

    hist: np.ndarray
    uniques: pd.Index
    user_ids: np.ndarray


def _history_keys(v: pd.DataFrame) -> _Keys:
    keys = v[HISTORY_ID] if HISTORY_ID in v.columns else v["user_id"]
    hist, uniques = pd.factorize(keys, sort=False)
    first_row = np.full(len(uniques), len(v), dtype=np.int64)
    np.minimum.at(first_row, hist, np.arange(len(v)))
    if HISTORY_ID in v.columns:
        per_history_users = v.groupby(hist)["user_id"].nunique()
        if (per_history_users > 1).any():
            bad = uniques[int(per_history_users.idxmax())]
            raise ValueError(f"history_id {bad!r} holds visits of several users")
    return _Keys(hist, uniques, v["user_id"].to_numpy(np.int64)[first_row])


def _question_times(end_ns: np.ndarray, keys: _Keys, at: pd.Timestamp | None) -> np.ndarray:
    """Each history's prediction time in UTC nanoseconds: ``at``, else the end of its last visit."""
    n_hist = len(keys.uniques)
    if at is None:
        at_ns = np.full(n_hist, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(at_ns, keys.hist, end_ns)
        return at_ns
    stamp = pd.Timestamp(at)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return np.full(n_hist, stamp.value, dtype=np.int64)


@dataclass(frozen=True)
class _Stays:
    """Merged activities as arrays, sorted by (history, start_day, start_min) as preprocessing sorts them.

    ``place`` is the merge id: a known place (>= 2), or a negative id of its own for each new place.
    """

    hist: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    place: np.ndarray
    latitude: np.ndarray
    longitude: np.ndarray
    wall: WallTimes

    def take(self, rows: np.ndarray) -> _Stays:
        """The stays at ``rows`` (a boolean mask or positions)."""
        wall = WallTimes(**{name: getattr(self.wall, name)[rows] for name in WallTimes.__dataclass_fields__})
        arrays = (self.hist, self.start_ns, self.end_ns, self.place, self.latitude, self.longitude)
        return _Stays(*(a[rows] for a in arrays), wall)

    def encoded(self) -> np.ndarray:
        """The places in the model's ids (a new place is :data:`~nextloc.preprocessing.sequences.UNSEEN`)."""
        return np.where(self.place >= FIRST_PLACE, self.place, UNSEEN)


def _merged_activities(
    v: pd.DataFrame, start_ns: np.ndarray, end_ns: np.ndarray, hist: np.ndarray, at_ns: np.ndarray, bundle
) -> _Stays:
    """The activities that started before their history's question, as places, merged
    (:func:`nextloc.preprocessing.locations.merge_runs`) and with their wall-clock features
    (:class:`~nextloc.preprocessing.sequences.WallTimes`), in preprocessing's order."""
    cfg = bundle.preprocess
    keep = activity_mask(start_ns, end_ns, cfg.staypoints.activity_time_threshold_min)
    keep &= start_ns < at_ns[hist]
    lat, lon = v["latitude"].to_numpy(np.float64), v["longitude"].to_numpy(np.float64)
    loc = nearest_locations(lat, lon, bundle.locations, bundle.match_radius_m)
    merge_id = np.where(loc >= FIRST_PLACE, loc, -1 - np.arange(len(v)))
    rows = np.flatnonzero(keep)
    rows = rows[np.lexsort((start_ns[rows], hist[rows]))]  # merge_staypoints' order: (user, start), stable
    first, last = merge_runs(
        hist[rows], merge_id[rows], start_ns[rows], end_ns[rows], cfg.locations.merge_max_gap_min
    )
    start, end = (
        start_ns[rows[first]],
        end_ns[rows[last]],
    )  # merging keeps the first visit's place and coordinates
    wall = WallTimes.of(start, end, cfg.timezone)
    kept = rows[first]
    stays = _Stays(hist[kept], start, end, merge_id[kept], lat[kept], lon[kept], wall)
    return stays.take(np.lexsort((wall.start_min, wall.start_date, stays.hist)))  # add_time_features' order


def _utc(ns: np.ndarray) -> pd.DatetimeIndex:
    return pd.to_datetime(np.asarray(ns, dtype=np.int64), utc=True)


def _request_visits(stays: _Stays) -> pd.DataFrame:
    """Every merged visit before each question, for the routine kinds (:attr:`Histories.visits`)."""
    return pd.DataFrame(
        {
            "history": stays.hist,
            "started_at": _utc(stays.start_ns),
            "finished_at": _utc(stays.end_ns),
            "place": stays.encoded(),
            "raw_place": stays.place,
            "latitude": stays.latitude,
            "longitude": stays.longitude,
        }
    )


def _window_visits(stays: _Stays) -> pd.DataFrame:
    """The windowed visits with their coordinates (:attr:`Histories.window`)."""
    return pd.DataFrame(
        {
            "history": stays.hist,
            "started_at": _utc(stays.start_ns),
            "place": stays.encoded(),
            "latitude": stays.latitude,
            "longitude": stays.longitude,
        }
    )


def history_visits(histories: Histories, index: int, locations: pd.DataFrame | None) -> pd.DataFrame:
    """The visits history ``index`` was answered from, oldest first: ``started_at`` (NaT for a samples
    table), ``place``, ``latitude``, ``longitude``.

    Visits carry the request's own coordinates. A samples table (or packed histories) holds place ids only:
    each visit is drawn at its place's centre in ``locations`` (the model's vocabulary), and a visit at a new
    place, which has no centre, is left out.
    """
    if histories.window is not None:
        rows = histories.window[histories.window["history"].to_numpy() == index]
        return rows.drop(columns="history").reset_index(drop=True)
    places = histories.packed[index, :, 0]
    places = places[places >= FIRST_PLACE]
    if locations is None:
        raise ValueError("a samples table's history is place ids: drawing it needs the model's vocabulary")
    centres = locations.set_index("loc_index").reindex(places)
    return pd.DataFrame(
        {
            "started_at": pd.Series(pd.NaT, index=range(len(places)), dtype="datetime64[ns, UTC]"),
            "place": places,
            "latitude": centres["latitude"].to_numpy(np.float64),
            "longitude": centres["longitude"].to_numpy(np.float64),
        }
    )


def _window(stays: _Stays, at_ns: np.ndarray, bundle: ModelBundle) -> tuple[_Stays, np.ndarray]:
    """The visits within ``previous_days`` of their question (at most the ``max_history`` most recent), and
    each one's days before the question's day (wall-clock dates in the dataset's timezone)."""
    cfg = bundle.preprocess
    at_date = wall_clock_ns(at_ns, cfg.timezone) // DAY_NS
    diff = at_date[stays.hist] - stays.wall.start_date
    in_window = diff <= cfg.samples.previous_days
    stays, diff = stays.take(in_window), diff[in_window]
    if bundle.max_history is not None:  # the most recent visits the model can take
        h = stays.hist
        recent = np.searchsorted(h, h, side="right") - 1 - np.arange(len(h)) < bundle.max_history
        stays, diff = stays.take(recent), diff[recent]
    return stays, diff


def _visits_per_history(h: np.ndarray, keys: _Keys, cfg: PreprocessConfig) -> np.ndarray:
    """Visits left in each history; a history with none is an error naming it (the first five)."""
    n_hist = len(keys.uniques)
    lengths = np.bincount(h, minlength=n_hist)
    empty = np.flatnonzero(lengths == 0)
    if len(empty):
        names = ", ".join(_history_name(keys.uniques[i], keys.user_ids[i]) for i in empty[:5])
        raise ValueError(
            f"empty history: {len(empty)} of {n_hist} histories have no visit to score ({names}"
            f"{', ...' if len(empty) > 5 else ''}): a visit counts if it lasted more than "
            f"{cfg.staypoints.activity_time_threshold_min:g} min and started in the "
            f"{cfg.samples.previous_days} days before the prediction time"
        )
    return lengths


def _pack(
    stays: _Stays, diff: np.ndarray, lengths: np.ndarray, users: np.ndarray, cfg: PreprocessConfig
) -> np.ndarray:
    """``(H, T, 6)`` packed histories (:mod:`nextloc.models.packed`), right-padded with 0."""
    h = stays.hist  # ascending: each history's visits are consecutive
    position = np.arange(len(h)) - np.searchsorted(h, h, side="left")

    def column(values: np.ndarray) -> np.ndarray:
        out = np.zeros((len(lengths), int(lengths.max())), dtype=np.int64)
        out[h, position] = values
        return out

    columns = {
        "location": stays.encoded(),
        "start_min": stays.wall.start_min,
        "weekday": stays.wall.weekday,
        "duration_min": np.minimum(stays.wall.duration, cfg.samples.duration_cap_min),
        "diff_days": diff,
    }
    return pack_columns({key: column(values) for key, values in columns.items()}, users)


# a samples table's list column of each packed sequence column
SAMPLE_COLUMNS = {
    "location": "loc_hist",
    "start_min": "start_min_hist",
    "weekday": "weekday_hist",
    "duration_min": "duration_hist",
    "diff_days": "diff_hist",
}


def sample_histories(table: pa.Table) -> Histories:
    """The histories of a samples table (already in the model's ids), packed without a Python loop; times
    and durations in minutes as the table holds them (the scorer bins them as training does)."""
    lengths = table.column("hist_len").to_numpy().astype(np.int64)
    width = max(int(lengths.max()) if len(lengths) else 1, 1)
    columns = {key: pad_lists(table.column(name), lengths, width) for key, name in SAMPLE_COLUMNS.items()}
    packed = pack_columns(columns, table.column("user").to_numpy())
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


def _user_index(user_ids: np.ndarray, users: pd.DataFrame | None) -> np.ndarray:
    if users is None or not len(users):
        return np.zeros(len(user_ids), dtype=np.int64)
    lookup = pd.Series(users["user_index"].to_numpy(np.int64), index=users["user_id"].to_numpy(np.int64))
    return lookup.reindex(user_ids).fillna(0).to_numpy(np.int64)


def _history_name(key: Any, user_id: int) -> str:
    return f"user {user_id}" if key == user_id else f"history {key!r} of user {user_id}"
