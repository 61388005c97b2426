"""A preprocessed dataset on an interactive map: ``nextloc map --data-dir D [--user U] --out map.html``.

Layers (each in the layer control):

* **Locations**: every DBSCAN location of the final staypoints (``raw_location_id``: places first seen in
  validation or test included), a circle whose area grows with its visits (staypoints) and whose colour
  says how many users visit it (:data:`USER_COLOURS`); at the vocabulary's centre where the model knows the
  place, else at its staypoints' mean. A popup each: ids, visits, users, centre.
* **Staypoints several users hold** (hidden at first): the recordings GeoLife keeps under two users
  (:mod:`nextloc.raw.duplicates`: same start, end and place), one circle per shared staypoint naming its holders;
  the legend lists the user pairs of the ingest report (:func:`nextloc.raw.duplicates.describe_pairs`).
* With a user: **their staypoints** in time order (colour by split; a thick magenta ring where another user
  holds the same staypoint) and **their moves**, the line between consecutive staypoints.

Large data stays responsive: a layer of more than :data:`CLUSTER_ABOVE` circles is clustered
(Leaflet.markercluster), and circles are drawn on a canvas; each layer is one data array and a loop
(:func:`nextloc.maps.web.point_layer`), not a script block per circle.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nextloc.maps.web import Point
from nextloc.raw.duplicates import STAYPOINT_KEY, describe_pairs

logger = logging.getLogger(__name__)

__all__ = ["CLUSTER_ABOVE", "DatasetMap", "STAYPOINT_COLUMNS", "dataset_page", "location_summary"]

CLUSTER_ABOVE = 2000  # a layer with more circles than this is clustered
#: colour by how many users visit a location: (at least this many users, colour), the last that fits
USER_COLOURS = ((1, "#1f77b4"), (2, "#2ca02c"), (3, "#ff7f0e"), (5, "#d62728"), (10, "#6a1b9a"))
SPLIT_COLOURS = {"train": "#1f77b4", "val": "#9467bd", "test": "#2ca02c"}
SHARED = "#e377c2"
VIEW_RADIUS_M = 40_000.0  # the first view frames the points this close to their median
#: the final staypoints' columns this module reads
STAYPOINT_COLUMNS = (
    "id",
    "user_id",
    "location_id",
    "raw_location_id",
    "started_at",
    "finished_at",
    "split",
    "latitude",
    "longitude",
)


@dataclass(frozen=True)
class PageLayer:
    """One layer of the page: its name, circles (each with a popup), whether they are clustered."""

    name: str
    markers: int
    clustered: bool


@dataclass(frozen=True)
class DatasetMap:
    """A written dataset page: its file and its layers (the line of moves is not a circle: not listed)."""

    path: Path
    layers: tuple[PageLayer, ...]

    @property
    def markers(self) -> int:
        return sum(layer.markers for layer in self.layers)


def _check(staypoints: pd.DataFrame, source: str) -> None:
    missing = [c for c in STAYPOINT_COLUMNS if c not in staypoints.columns]
    if missing:
        raise ValueError(f"{source}: the staypoints have no column(s) {missing} (preprocess the data again)")


def location_summary(staypoints: pd.DataFrame, locations: pd.DataFrame | None) -> pd.DataFrame:
    """One row per DBSCAN location of ``staypoints`` (``raw_location_id >= 0``), most visited first:
    ``raw_location_id``, ``loc_index`` (-1: not in the model's vocabulary), ``latitude``, ``longitude``
    (the vocabulary's centre, else the staypoints' mean), ``visits``, ``n_users``, ``users`` (sorted ids)."""
    located = staypoints[staypoints["raw_location_id"].to_numpy() >= 0]
    grouped = located.groupby("raw_location_id", sort=True)
    table = pd.DataFrame(
        {
            "latitude": grouped["latitude"].mean(),
            "longitude": grouped["longitude"].mean(),
            "visits": grouped.size(),
            "n_users": grouped["user_id"].nunique(),
            "users": grouped["user_id"].agg(lambda u: sorted(set(u.tolist()))),
        }
    )
    table["loc_index"] = -1
    if locations is not None and len(locations):
        vocab = locations.drop_duplicates("raw_location_id").set_index("raw_location_id")
        known = table.index.intersection(vocab.index)
        for column in ("latitude", "longitude", "loc_index"):
            table.loc[known, column] = vocab.loc[known, column].to_numpy()
    table = table.reset_index().sort_values(["visits", "raw_location_id"], ascending=[False, True])
    return table.reset_index(drop=True)


def _user_colour(n_users: int) -> str:
    return next(colour for least, colour in reversed(USER_COLOURS) if n_users >= least)


def _users_text(users: Sequence[int], limit: int = 12) -> str:
    shown = ", ".join(str(u) for u in users[:limit])
    return shown + (f" and {len(users) - limit} more" if len(users) > limit else "")


def _location_points(table: pd.DataFrame) -> list[Point]:
    points = []
    for row in table.itertuples(index=False):
        known = (
            f"place {row.loc_index} of the model" if row.loc_index >= 0 else "not in the model's vocabulary"
        )
        popup = (
            f"<b>location {row.raw_location_id}</b> ({known})<br>{row.visits} visits by {row.n_users} "
            f"user(s): {escape(_users_text(row.users))}<br>centre {row.latitude:.5f}, {row.longitude:.5f}"
        )
        radius = min(3.0 + 2.0 * math.sqrt(row.visits), 30.0)  # area grows with the visits
        points.append(Point(row.latitude, row.longitude, radius, _user_colour(row.n_users), popup))
    return points


def _holders(staypoints: pd.DataFrame) -> pd.Series:
    """Per staypoint id held by several users (same start, end and place), the sorted user ids holding it."""
    key = list(STAYPOINT_KEY)
    held = staypoints[staypoints.duplicated(key, keep=False)]
    users = held.groupby(key, sort=False)["user_id"].transform(lambda u: [sorted(set(u.tolist()))] * len(u))
    return pd.Series(users.to_numpy(), index=held["id"].to_numpy())


def _when(row: Any) -> str:
    start, end = pd.Timestamp(row.started_at), pd.Timestamp(row.finished_at)
    minutes = (end - start).total_seconds() / 60
    return f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC ({minutes:.0f} min)"


def _shared_points(staypoints: pd.DataFrame, holders: pd.Series) -> list[Point]:
    """One circle per staypoint several users hold (its first holder's row)."""
    first = staypoints[staypoints["id"].isin(holders.index)].sort_values(["started_at", "user_id"])
    first = first.drop_duplicates(list(STAYPOINT_KEY))
    return [
        Point(
            row.latitude,
            row.longitude,
            6.0,
            SHARED,
            f"<b>held by users {escape(_users_text(holders[row.id]))}</b><br>{_when(row)}<br>"
            f"location {row.raw_location_id}",
        )
        for row in first.itertuples(index=False)
    ]


def _user_points(visits: pd.DataFrame, holders: pd.Series) -> list[Point]:
    points = []
    for number, row in enumerate(visits.itertuples(index=False), start=1):
        others = [u for u in holders.get(row.id, []) if u != row.user_id]
        place = f"location {row.raw_location_id}" if row.raw_location_id >= 0 else "no location (noise)"
        popup = (
            f"<b>staypoint {row.id}</b>, user {row.user_id}'s visit {number} of {len(visits)}<br>{_when(row)}"
            f"<br>{place}, {escape(str(row.split))} split"
        )
        if others:
            popup += f"<br><b>also held by user(s) {escape(_users_text(others))}</b> (a shared recording)"
        colour = SPLIT_COLOURS.get(str(row.split), "#7f7f7f")
        ring = (SHARED, 4.0) if others else (colour, 1.0)  # a shared one: the split's colour in a ring
        points.append(Point(row.latitude, row.longitude, 5.0, ring[0], popup, ring[1], fill=colour))
    return points


def _bounds(latitude: np.ndarray, longitude: np.ndarray) -> list[list[float]]:
    """The view: the points within :data:`VIEW_RADIUS_M` of their median (GeoLife has trips abroad that would
    zoom out to the world; they stay on the map, outside the first view), or all when that leaves none."""
    from nextloc.maps.png import project

    ok = np.isfinite(latitude) & np.isfinite(longitude)
    lat, lon = latitude[ok], longitude[ok]
    origin = (float(np.median(lat)), float(np.median(lon)))
    near = np.hypot(*project(lat, lon, origin).T) <= VIEW_RADIUS_M
    if near.any():
        lat, lon = lat[near], lon[near]
    return [[float(lat.min()), float(lon.min())], [float(lat.max()), float(lon.max())]]


def dataset_page(
    staypoints: pd.DataFrame,
    locations: pd.DataFrame | None,
    duplicates: Mapping[str, Any] | None,
    path: Path,
    user: int | None = None,
    source: str = "the dataset",
) -> DatasetMap:
    """Write the dataset's map (see the module docstring) to ``path``.

    Args:
        staypoints: the final staypoints (:data:`STAYPOINT_COLUMNS`).
        locations: the location vocabulary (``loc_index``, ``raw_location_id``, centre), or None.
        duplicates: the ingest report's ``duplicates`` section (:func:`nextloc.raw.duplicates.duplicate_report`),
            or None.
        path: the ``.html`` file.
        user: draw this user's staypoints and moves too.
        source: what the staypoints are, for errors (the data directory).

    Raises:
        ValueError: a missing column, no staypoint, or a user without staypoints.
    """
    from nextloc.maps.web import new_map, point_layer, write_page

    _check(staypoints, source)
    if staypoints.empty:
        raise ValueError(f"{source}: no staypoint to draw")
    table = location_summary(staypoints, locations)
    holders = _holders(staypoints)
    visits = _user_visits(staypoints, user, source)
    focus = visits if visits is not None else table
    fmap = new_map(_bounds(focus["latitude"].to_numpy(float), focus["longitude"].to_numpy(float)), True)
    shared = _shared_points(staypoints, holders)
    layers = [
        (f"Locations ({len(table)}, area ∝ visits, colour: users)", _location_points(table), True),
        (f"Staypoints several users hold ({len(shared)})", shared, False),
    ]
    if visits is not None:
        _add_moves(fmap, visits, user)
        layers.append((f"User {user}'s staypoints ({len(visits)})", _user_points(visits, holders), True))
    drawn = []
    for name, points, show in layers:
        cluster = len(points) > CLUSTER_ABOVE
        point_layer(points, escape(name, quote=False), cluster=cluster, show=show).add_to(fmap)
        drawn.append(PageLayer(name, len(points), cluster))
    _finish(fmap, table, staypoints, duplicates, user)
    write_page(fmap, Path(path), f"nextloc: {source}", cluster=any(layer.clustered for layer in drawn))
    return DatasetMap(Path(path), tuple(drawn))


def _user_visits(staypoints: pd.DataFrame, user: int | None, source: str) -> pd.DataFrame | None:
    if user is None:
        return None
    visits = staypoints[staypoints["user_id"].to_numpy() == user].sort_values("started_at")
    if visits.empty:
        users = sorted(staypoints["user_id"].unique().tolist())
        raise ValueError(f"{source}: user {user} has no staypoint (the users are {_users_text(users, 20)})")
    return visits


def _add_moves(fmap: Any, visits: pd.DataFrame, user: int | None) -> None:
    import folium

    group = folium.FeatureGroup(name=f"User {user}'s moves", overlay=True, show=True).add_to(fmap)
    coords = visits[["latitude", "longitude"]].round(6).to_numpy(float).tolist()
    if len(coords) >= 2:
        folium.PolyLine(coords, color="#08306b", weight=1.5, opacity=0.5).add_to(group)


def _finish(
    fmap: Any,
    table: pd.DataFrame,
    staypoints: pd.DataFrame,
    duplicates: Mapping[str, Any] | None,
    user: int | None,
) -> None:
    """The layer control and the legend: counts, the colour key, the users sharing recordings."""
    import folium

    from nextloc.maps.web import add_legend

    folium.LayerControl(collapsed=False).add_to(fmap)
    key = " ".join(
        f'<span style="color:{colour}">&#11044;</span> {least}{"+" if i == len(USER_COLOURS) - 1 else ""}'
        for i, (least, colour) in enumerate(USER_COLOURS)
    )
    lines = [
        f"<b>{len(table)} locations</b>, {len(staypoints)} staypoints, {staypoints['user_id'].nunique()} users",
        f"users per location: {key}",
    ]
    if user is not None:
        splits = " ".join(f'<span style="color:{c}">&#9679;</span> {s}' for s, c in SPLIT_COLOURS.items())
        lines.append(f"user {user}'s staypoints by split: {splits}; line: moves in time order")
    pairs = (duplicates or {}).get("pairs") or []
    mine = [p for p in pairs if user in p["users"]] if user is not None else []
    if mine:
        lines.append(
            f'<span style="color:{SHARED}">&#9711;</span> user {user} shares recordings: '
            + escape(describe_pairs({"pairs": mine}, 3))
        )
    if pairs:
        lines.append("users sharing recordings: " + escape(describe_pairs({"pairs": pairs}, 3)))
    add_legend(fmap, "<br>".join(lines))
