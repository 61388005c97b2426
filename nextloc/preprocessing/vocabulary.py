"""What the encoded ids of a dataset mean, and how to read one dataset's samples in another's ids.

A model only knows the ids of the dataset it was trained on: location ``k >= 2`` is the ``k-2``-th train
location, user ``u >= 1`` the ``u``-th user. When new data arrives, DBSCAN and the encoders run again and
ids shift, so comparing a champion trained on old data with a challenger on the new test split needs the
new samples translated into the champion's ids. Locations are matched by their centre (the mean of their
staypoints' coordinates): each new location maps to the nearest old one within ``radius_m``, otherwise it
is unseen (1) for the old model, exactly as an unseen test location is for any model. Users map by their
GeoLife user id; a user the old model never saw gets 0.

Each user row also carries a fingerprint of that user's final staypoints (their start and end times), so a
later run can tell which users' data changed since a model was trained (:func:`user_data_groups`).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from nextloc.io.visits import EARTH_RADIUS_M
from nextloc.preprocessing.sequences import UNSEEN

LOCATION_COLUMNS = ["loc_index", "raw_location_id", "latitude", "longitude", "n_staypoints", "n_train_visits"]
USER_COLUMNS = ["user_index", "user_id", "data_fingerprint"]
USER_GROUPS = ("changed", "unchanged", "new_user", "unknown")
NEAREST_CHUNK = 1 << 21  # distances computed at once by nearest_locations (16 MiB of float64)


def location_vocabulary(located: pd.DataFrame, encoded: pd.DataFrame) -> pd.DataFrame:
    """The train location vocabulary: encoded index, raw DBSCAN id and centre of each location, the number
    of located staypoints behind it (``n_staypoints``, every user and split) and its number of visits in
    the train split (``n_train_visits``, the final merged staypoints: what a model learnt from).

    Args:
        located: located staypoints (raw ``location_id``, ``latitude``, ``longitude``; with a ``fitted``
            column, the deployment protocol's, only the staypoints DBSCAN was fitted on count).
        encoded: the final staypoints (encoded ``location_id``, ``raw_location_id``, ``split``).
    """
    if "fitted" in located.columns:
        located = located[located["fitted"].to_numpy(bool)]
    known = encoded.loc[encoded["location_id"] >= 2, ["location_id", "raw_location_id"]].drop_duplicates()
    centres = location_centres(located)
    vocab = known.rename(columns={"location_id": "loc_index"}).join(centres, on="raw_location_id")
    train_visits = encoded.loc[encoded["split"] == "train"].groupby("location_id").size()
    vocab["n_train_visits"] = vocab["loc_index"].map(train_visits).fillna(0).astype(np.int64)
    return vocab.sort_values("loc_index")[LOCATION_COLUMNS].reset_index(drop=True)


def location_centres(located: pd.DataFrame) -> pd.DataFrame:
    """Each DBSCAN location's centre (the mean of its staypoints' ``latitude`` and ``longitude``) and its
    number of staypoints ``n_staypoints``, indexed by the raw ``location_id``."""
    return located.groupby("location_id").agg(
        latitude=("latitude", "mean"), longitude=("longitude", "mean"), n_staypoints=("latitude", "size")
    )


def user_vocabulary(encoded: pd.DataFrame) -> pd.DataFrame:
    """Encoded user index -> GeoLife user id, with a fingerprint of the user's staypoints.

    The fingerprint hashes the user's staypoint start and end times in time order (not the location ids,
    which move whenever anyone's data changes DBSCAN's result), so it changes exactly when the user's own
    staypoints do.
    """
    users = encoded[["user", "user_id"]].drop_duplicates().rename(columns={"user": "user_index"})
    times = encoded[["user_id", "started_at", "finished_at"]].sort_values(
        ["user_id", "started_at", "finished_at"], kind="stable"
    )
    fingerprints = {
        user_id: _times_fingerprint(group["started_at"], group["finished_at"])
        for user_id, group in times.groupby("user_id", sort=True)
    }
    users["data_fingerprint"] = users["user_id"].map(fingerprints)
    return users.sort_values("user_index")[USER_COLUMNS].reset_index(drop=True)


def user_data_groups(current: pd.DataFrame, previous: pd.DataFrame) -> dict[int, str]:
    """Per GeoLife user of ``current``: did the user's data change since ``previous`` (another vocabulary)?

    Returns:
        ``user_id -> group``: ``"unchanged"`` (same staypoints), ``"changed"``, ``"new_user"`` (absent from
        ``previous``) or ``"unknown"`` (``previous`` was written before fingerprints existed).
    """
    if "data_fingerprint" not in previous.columns:
        return {int(u): "unknown" for u in current["user_id"]}
    before = dict(zip(previous["user_id"], previous["data_fingerprint"], strict=True))
    groups = {}
    for user_id, fingerprint in zip(current["user_id"], current["data_fingerprint"], strict=True):
        if user_id not in before:
            groups[int(user_id)] = "new_user"
        else:
            groups[int(user_id)] = "unchanged" if before[user_id] == fingerprint else "changed"
    return groups


def _times_fingerprint(started: pd.Series, finished: pd.Series) -> str:
    digest = hashlib.blake2b(digest_size=8)
    for column in (started, finished):
        values = pd.to_datetime(column, utc=True).astype("int64").to_numpy()
        digest.update(np.ascontiguousarray(values).tobytes())
    return digest.hexdigest()


def nearest_locations(
    latitude: np.ndarray, longitude: np.ndarray, locations: pd.DataFrame, radius_m: float
) -> np.ndarray:
    """The location index (``loc_index``) of the nearest centre within ``radius_m`` metres, else 1 (unseen).

    One rule for every "which known place is this?": places of another vocabulary
    (:func:`location_mapping`) and a user's visits (:mod:`nextloc.predict.answer`). The nearest centre is the one at
    the least haversine distance, every centre measured (in chunks of :data:`NEAREST_CHUNK` distances: a
    request's few visits take well under a millisecond, and no tree library is imported to answer); the
    radius test uses the same haversine in metres as everywhere else.

    Args:
        latitude: ``(N,)`` degrees.
        longitude: ``(N,)`` degrees.
        locations: a location vocabulary (``loc_index``, ``latitude``, ``longitude``).
        radius_m: the match radius in metres.

    Returns:
        ``(N,)`` int64: a ``loc_index`` (>= 2) or :data:`~nextloc.preprocessing.sequences.UNSEEN`.
    """
    lat = np.asarray(latitude, dtype=np.float64)
    lon = np.asarray(longitude, dtype=np.float64)
    out = np.full(len(lat), UNSEEN, dtype=np.int64)
    if not len(lat) or not len(locations):
        return out
    centre_lat = locations["latitude"].to_numpy(np.float64)
    centre_lon = locations["longitude"].to_numpy(np.float64)
    nearest = np.empty(len(lat), dtype=np.int64)
    step = max(1, NEAREST_CHUNK // len(centre_lat))
    for start in range(0, len(lat), step):
        rows = slice(start, start + step)
        dist = _haversine_m(lat[rows, None], lon[rows, None], centre_lat[None, :], centre_lon[None, :])
        nearest[rows] = np.argmin(dist, axis=1)
    dist = _haversine_m(lat, lon, centre_lat[nearest], centre_lon[nearest])
    ok = dist <= radius_m
    out[ok] = locations["loc_index"].to_numpy(np.int64)[nearest[ok]]
    return out


def location_mapping(source: pd.DataFrame, target: pd.DataFrame, radius_m: float) -> np.ndarray:
    """``mapping[i]`` = the ``target`` index of ``source`` location ``i`` (0 pad, 1 unseen kept as they are).

    Each source location goes to the target location with the nearest centre if it is within
    ``radius_m`` metres (haversine), else to 1 (unseen): :func:`nearest_locations`.
    """
    size = int(source["loc_index"].max()) + 1 if len(source) else 2
    mapping = np.full(max(size, 2), UNSEEN, dtype=np.int64)
    mapping[0] = 0
    if len(source):
        idx = source["loc_index"].to_numpy()
        mapping[idx] = nearest_locations(
            source["latitude"].to_numpy(), source["longitude"].to_numpy(), target, radius_m
        )
    return mapping


def translate_samples(
    samples: pa.Table,
    source_locations: pd.DataFrame,
    target_locations: pd.DataFrame,
    source_users: pd.DataFrame,
    target_users: pd.DataFrame,
    radius_m: float = 50.0,
) -> tuple[pa.Table, dict[str, float]]:
    """The samples of one dataset in the ids of another (see the module docstring).

    Returns:
        The translated table (same rows, same columns) and the share (%) of history entries, targets and
        users that found a match.
    """
    locs = location_mapping(source_locations, target_locations, radius_m)
    by_user_id = dict(zip(target_users["user_id"], target_users["user_index"], strict=True))
    users = np.zeros(int(source_users["user_index"].max()) + 1 if len(source_users) else 1, dtype=np.int64)
    for index, user_id in zip(source_users["user_index"], source_users["user_id"], strict=True):
        users[index] = by_user_id.get(user_id, 0)

    def remap(column: str, mapping: np.ndarray) -> pa.Array:
        col = samples.column(column).combine_chunks()
        if pa.types.is_list(col.type):
            values = mapping[np.clip(col.values.to_numpy(zero_copy_only=False), 0, len(mapping) - 1)]
            return pa.ListArray.from_arrays(col.offsets, pa.array(values.astype(np.int32)))
        return pa.array(
            mapping[np.clip(col.to_numpy(zero_copy_only=False), 0, len(mapping) - 1)].astype(np.int32)
        )

    out = samples
    for column, mapping in (("loc_hist", locs), ("target_loc", locs), ("user", users), ("user_hist", users)):
        if column in samples.column_names:
            out = out.set_column(out.schema.get_field_index(column), column, remap(column, mapping))
    hist = pc.list_flatten(out.column("loc_hist")).to_numpy()
    src_hist = pc.list_flatten(samples.column("loc_hist")).to_numpy()
    target, src_target = out.column("target_loc").to_numpy(), samples.column("target_loc").to_numpy()
    stats = {
        "history_matched_pct": _share((hist >= 2) & (src_hist >= 2), src_hist >= 2),
        "targets_matched_pct": _share((target >= 2) & (src_target >= 2), src_target >= 2),
        "users_matched_pct": _share(out.column("user").to_numpy() > 0, np.ones(out.num_rows, bool)),
    }
    return out, stats


def _share(hit: np.ndarray, of: np.ndarray) -> float:
    return float(100.0 * hit.sum() / of.sum()) if of.sum() else 100.0


def _haversine_m(lat1, lon1, lat2, lon2) -> np.ndarray:
    lat1, lon1, lat2, lon2 = map(np.radians, (lat1, lon1, lat2, lon2))
    a = np.sin((lat2 - lat1) / 2) ** 2 + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


def place_centres(locations: pd.DataFrame, num_places: int) -> np.ndarray:
    """``(num_places, 2)`` latitude/longitude per encoded place from ``vocabulary/locations.parquet``
    (``loc_index``, ``latitude``, ``longitude``); NaN for 0, 1 and any id it lacks."""
    centres = np.full((num_places, 2), np.nan)
    index = locations["loc_index"].to_numpy(np.int64)
    ok = index < num_places
    centres[index[ok]] = locations[["latitude", "longitude"]].to_numpy(np.float64)[ok]
    return centres


def place_popularity(locations: pd.DataFrame, num_places: int) -> np.ndarray:
    """``(num_places,)`` each encoded place's visits in train (``n_train_visits`` of
    ``vocabulary/locations.parquet``); 0 for 0, 1 and any id it lacks."""
    popularity = np.zeros(num_places)
    index = locations["loc_index"].to_numpy(np.int64)
    ok = index < num_places
    popularity[index[ok]] = locations["n_train_visits"].to_numpy(np.float64)[ok]
    return popularity
