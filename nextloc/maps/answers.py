"""Answers on an interactive map: ``nextloc predict --map answers.html``.

One page, one layer per history (ticked in the layer control; the first one shown, the view following the
layer last ticked). A layer holds:

* **the history**: its visits in time order joined by a line; one circle per visited spot, labelled with
  the spot's visit numbers (``1,3,7``: :func:`nextloc.maps.png.visit_label`, so labels of visits at one spot
  never print over each other), red where the visit was at a place the model never saw, the latest visit
  with a thick ring; a popup each (visit numbers, times, place);
* **the answer**: the top-k places as orange circles whose area grows with the probability, labelled
  ``#rank``, a popup each with the rank, probability, visits in the training data and the centre;
* **the actual next place**, when known (a test sample: a champion's maps in MLflow), a green circle.

Where labels would cover each other the page hides some (:func:`nextloc.maps.web.add_label`): the ranks
are kept first, in rank order, then the actual next place, then the visits, latest first.

The legend gives each history's P(new place) and, with ``--coverage``, its answer set. The page is built by :mod:`nextloc.maps.web` (Leaflet
inlined, OpenStreetMap tiles when online). What each layer holds is returned (:class:`WebMap`), so a
test compares it with what a browser shows.
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

from nextloc.maps.png import in_view, visit_label
from nextloc.predict.answer_set import describe_set
from nextloc.predict.histories import Histories, history_visits
from nextloc.preprocessing.sequences import UNSEEN

logger = logging.getLogger(__name__)

__all__ = ["MAX_LAYERS", "MapLayer", "WebMap", "answers_page", "predictions_page"]

MAX_LAYERS = 50  # histories drawn by predictions_page: the first ones
VISIT, NEW_VISIT, PLACE, LATEST, ACTUAL = "#1f77b4", "#d62728", "#ff7f0e", "#08306b", "#2ca02c"


@dataclass(frozen=True)
class MapLayer:
    """What one history's layer holds: its name, visited spots, places drawn (those with coordinates),
    P(new place) (None: the model has no new-place head), whether the actual next place is drawn and the
    answer set's line in the legend (:func:`nextloc.predict.answer_set.describe_set`; None without one)."""

    name: str
    spots: int
    places: int
    visits: int
    p_new_place: float | None
    actual: bool = False
    answer_set: str | None = None

    @property
    def markers(self) -> int:
        """Circles: one per spot, per place and for the actual next place, each with a popup."""
        return self.spots + self.places + int(self.actual)


@dataclass(frozen=True)
class WebMap:
    """A written page: its file and its layers, in order."""

    path: Path
    layers: tuple[MapLayer, ...]

    @property
    def markers(self) -> int:
        return sum(layer.markers for layer in self.layers)


def predictions_page(
    histories: Histories,
    answers: Sequence[Mapping[str, Any]],
    locations: pd.DataFrame | None,
    path: Path,
    limit: int = MAX_LAYERS,
) -> WebMap:
    """The first ``limit`` answers of :func:`nextloc.predict.answer.predict` on their histories, one layer each."""
    if len(answers) > limit:
        logger.info("the web map draws the first %d of %d answers", limit, len(answers))
    items = [(history_visits(histories, i, locations), answers[i]) for i in range(min(limit, len(answers)))]
    return answers_page(items, path)


def answers_page(
    items: Sequence[tuple[pd.DataFrame, Mapping[str, Any]]],
    path: Path,
    actuals: Sequence[tuple[float, float] | None] = (),
) -> WebMap:
    """``(history, answer)`` pairs on one page (see the module docstring), written to ``path``.

    Args:
        items: each history (``latitude``, ``longitude``, optional ``place`` (``1``: a place the model never
            saw) and ``started_at``: :func:`nextloc.predict.histories.history_visits`) and its answer
            (:func:`nextloc.predict.answer.predict`).
        path: the ``.html`` file to write.
        actuals: per item, ``(latitude, longitude)`` of where the user really went next, if known.

    Raises:
        ValueError: no answer, or nothing to draw (no visit and no place with coordinates).
        FileNotFoundError: Leaflet's files are missing (:func:`nextloc.maps.web.inline_assets`).
    """
    from nextloc.maps.web import add_legend, new_map, write_page

    if not items:
        raise ValueError("no answer to draw")
    known = [*actuals, *[None] * (len(items) - len(actuals))]
    bounds = _bounds(*items[0], known[0])
    if bounds is None:
        raise ValueError(
            "nothing to draw: the first history has no visit and its answer no place with coordinates"
        )
    fmap = new_map(bounds)
    layers = tuple(
        _add_layer(fmap, history, answer, known[i], i == 0) for i, (history, answer) in enumerate(items)
    )
    _add_layer_control(fmap, layers)
    add_legend(fmap, _legend(layers))
    title = f"nextloc: {len(layers)} answer(s)"
    write_page(fmap, Path(path), title)
    logger.info("web map of %d answer(s): %s", len(layers), path)
    return WebMap(Path(path), layers)


def _bounds(
    history: pd.DataFrame, answer: Mapping[str, Any], actual: tuple[float, float] | None
) -> list[list[float]] | None:
    """``[[south, west], [north, east]]`` of a history, the actual next place and the places the PNG maps
    would frame (:func:`nextloc.maps.png.in_view`: a place far away would shrink the history to a dot)."""
    visits = history[["latitude", "longitude"]].to_numpy(float).reshape(-1, 2)
    places = _places(answer)
    place_ll = np.array([[p["latitude"], p["longitude"]] for p in places], float).reshape(-1, 2)
    actual_ll = np.array([actual] if actual else [], float).reshape(-1, 2)
    points = np.concatenate([visits, place_ll[in_view(visits, place_ll, actual_ll)], actual_ll])
    points = points[np.isfinite(points).all(axis=1)]
    if not len(points):
        return None
    return [points.min(axis=0).tolist(), points.max(axis=0).tolist()]


def _places(answer: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [p for p in answer.get("places", []) if p.get("latitude") is not None]


def _add_layer(
    fmap: Any,
    history: pd.DataFrame,
    answer: Mapping[str, Any],
    actual: tuple[float, float] | None,
    show: bool,
) -> MapLayer:
    import folium

    name = _layer_name(answer, len(history))
    group = folium.FeatureGroup(name=escape(name), overlay=True, show=show).add_to(fmap)
    places = _places(answer)
    for place in places:  # under the history: a visit's circle stays clickable over its place's
        _add_place(group, place)
    if actual is not None:
        _add_actual(group, actual)
    coords = history[["latitude", "longitude"]].to_numpy(float).reshape(-1, 2)
    if len(coords) >= 2:
        folium.PolyLine(coords.tolist(), color=VISIT, weight=2.5, opacity=0.7).add_to(group)
    spots = _spots(history)
    for spot in spots:
        _add_spot(group, spot, len(history))
    p_new = answer.get("p_new_place")
    p_new = None if p_new is None else float(p_new)
    chosen = describe_set(answer)
    return MapLayer(name, len(spots), len(places), len(history), p_new, actual is not None, chosen)


@dataclass
class _Spot:
    latitude: float
    longitude: float
    numbers: list[int]  # visit numbers, from 1
    new: bool  # some visit here was at a place the model never saw
    places: list[int]
    times: list[str]


def _spots(history: pd.DataFrame) -> list[_Spot]:
    """The history's visits grouped by their coordinates (visits at one place share them), in order of
    first visit."""
    lat = history["latitude"].to_numpy(float)
    lon = history["longitude"].to_numpy(float)
    place = history["place"].to_numpy(np.int64) if "place" in history else np.full(len(history), -1)
    started = history["started_at"] if "started_at" in history else pd.Series(pd.NaT, index=history.index)
    spots: dict[tuple[float, float], _Spot] = {}
    for i, key in enumerate(zip(np.round(lat, 6).tolist(), np.round(lon, 6).tolist(), strict=True)):
        if not all(map(math.isfinite, key)):
            continue
        spot = spots.setdefault(key, _Spot(key[0], key[1], [], False, [], []))
        spot.numbers.append(i + 1)
        spot.places.append(int(place[i]))
        stamp = started.iloc[i]
        spot.times.append("" if pd.isna(stamp) else pd.Timestamp(stamp).strftime("%Y-%m-%d %H:%M %Z").strip())
        spot.new = spot.new or bool(place[i] == UNSEEN)
    return list(spots.values())


def _add_circle(
    group: Any, at: tuple[float, float], label: tuple[Any, ...], popup: str, **style: Any
) -> None:
    """A filled circle at ``at`` (``(lat, lon)``) drawn with ``style`` (folium's ``CircleMarker`` options), its
    permanent label (:func:`nextloc.maps.web.add_label`'s text, direction, tier and order) and its popup."""
    import folium

    from nextloc.maps.web import add_label, add_popup

    marker = folium.CircleMarker(list(at), fill=True, **style).add_to(group)
    add_label(marker, *label)
    add_popup(marker, popup)


def _add_spot(group: Any, spot: _Spot, n_visits: int) -> None:
    from nextloc.maps.web import VISIT_LABEL

    latest = spot.numbers[-1] == n_visits
    colour = NEW_VISIT if spot.new else VISIT
    label = visit_label(spot.numbers) + (" (latest)" if latest else "")
    lines = [f"<b>visit {escape(', '.join(map(str, spot.numbers)))}</b> of {n_visits}"]
    for number, place, time in zip(spot.numbers, spot.places, spot.times, strict=True):
        where = "a place the model never saw" if place == UNSEEN else (f"place {place}" if place >= 0 else "")
        lines.append(f"#{number}: {escape(time)} {escape(where)}".rstrip())
    lines.append(f"at {spot.latitude:.5f}, {spot.longitude:.5f}")
    _add_circle(
        group,
        (spot.latitude, spot.longitude),
        (escape(label), "right", VISIT_LABEL, -spot.numbers[-1]),  # the latest first
        "<br>".join(lines),
        radius=6,
        color=LATEST if latest else colour,
        weight=4 if latest else 1.5,
        fill_color=colour,
        fill_opacity=0.85,
    )


def _add_place(group: Any, place: Mapping[str, Any]) -> None:
    from nextloc.maps.web import RANK_LABEL

    probability = float(place["probability"])
    rank = int(place["rank"])
    visits = place.get("n_visits")
    lines = [
        f"<b>#{rank}</b> place {escape(str(place.get('location_id', '?')))}",
        f"probability {probability:.3f}",
        f"visits in training {'?' if visits is None else int(visits)}",
        f"centre {float(place['latitude']):.5f}, {float(place['longitude']):.5f}",
    ]
    _add_circle(
        group,
        (float(place["latitude"]), float(place["longitude"])),
        (f"#{rank}", "bottom", RANK_LABEL, rank),
        "<br>".join(lines),
        radius=8 + 30 * math.sqrt(max(probability, 0.0)),  # area grows with the probability
        color="#c05800",
        weight=1.5,
        fill_color=PLACE,
        fill_opacity=0.4,
    )


def _add_actual(group: Any, actual: tuple[float, float]) -> None:
    from nextloc.maps.web import ACTUAL_LABEL

    _add_circle(
        group,
        (float(actual[0]), float(actual[1])),
        ("actual next place", "left", ACTUAL_LABEL),
        f"<b>where the user really went next</b><br>at {actual[0]:.5f}, {actual[1]:.5f}",
        radius=7,
        color="#145214",
        weight=2,
        fill_color=ACTUAL,
        fill_opacity=0.9,
    )


def _layer_name(answer: Mapping[str, Any], n_visits: int) -> str:
    who = f"user {answer['user_id']}" if "user_id" in answer else f"user index {answer.get('user', '?')}"
    if answer.get("history_id") is not None:
        who += f", history {answer['history_id']}"
    when = f" at {answer['at']}" if answer.get("at") else ""
    return f"{who}{when} ({n_visits} visits)"


def _add_layer_control(fmap: Any, layers: Sequence[MapLayer]) -> None:
    """The layer control, open, and the view following the layer last ticked."""
    import folium
    from branca.element import MacroElement
    from jinja2 import Template

    folium.LayerControl(collapsed=len(layers) < 2).add_to(fmap)
    follow = MacroElement()
    follow._template = Template(
        "{% macro script(this, kwargs) %}"
        "{{ this._parent.get_name() }}.on('overlayadd', function (e) {"
        " if (e.layer.getBounds && e.layer.getBounds().isValid()) {"
        " {{ this._parent.get_name() }}.fitBounds(e.layer.getBounds(), {paddingTopLeft: [30, 60],"
        " paddingBottomRight: [30, 170], maxZoom: 16}); } });"
        "{% endmacro %}"
    )
    fmap.add_child(follow)


def _legend(layers: Sequence[MapLayer]) -> str:
    key = (
        f'<span style="color:{VISIT}">&#9679;</span> visits, numbered in order, joined in time order; '
        f'<span style="color:{NEW_VISIT}">&#9679;</span> at a place the model never saw; '
        f'<span style="color:{LATEST}">&#9711;</span> the latest<br>'
        f'<span style="color:{PLACE}">&#11044;</span> predicted next places #rank (area &prop; probability)'
    )
    if any(layer.actual for layer in layers):
        key += f'<br><span style="color:{ACTUAL}">&#9679;</span> the actual next place'

    rows = "".join(
        f"<li>{escape(layer.name)}: P(new place) "
        f"{'n/a (no new-place head)' if layer.p_new_place is None else f'{layer.p_new_place:.3f}'}"
        f"{'' if layer.answer_set is None else f'; {escape(layer.answer_set)}'}</li>"
        for layer in layers
    )
    return f"{key}<ul style='margin:4px 0 0 0; padding-left:16px'>{rows}</ul>"
