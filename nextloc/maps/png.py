"""Answers on a map: a history's visits in order and the predicted places, sized by probability, as a PNG.

Decisions:

* **Drawn from the coordinates; a basemap where tiles can be had.** A local metric projection (metres
  east and north of the drawing's centre, equirectangular: exact enough over a city) with an equal aspect
  keeps distances true; the axes are in metres, or kilometres when the drawing spans more than
  :data:`KM_ABOVE_M`, and say where their origin is. Under it, web map tiles warped into that projection
  (:mod:`nextloc.maps.tiles`: ``$NEXTLOC_MAP_TILES``, cached on disk); offline, or when anything about the
  tiles fails, one warning and the same picture on the plain axes, so it works offline and in CI.
* **matplotlib without pyplot.** A :class:`~matplotlib.figure.Figure` on its own Agg canvas: no global
  backend is chosen and no figure registry grows, so a caller's own plotting (a notebook) is untouched.
* **What was drawn is returned.** :class:`DrawnMap` is read back from the drawn artists (the line's data,
  the scatters' offsets and sizes), not from the inputs, so a test checks the picture itself.
* **The history**: visits joined by a line in time order, numbered from 1 (visits within about ten
  pixels share a label, ``1,3,7``), an arrow on the last move and a ring on the latest visit; visits at
  places the model never saw are crosses. **The answer**: the top-k places as discs whose area grows with
  the probability, labelled ``#rank``, and a key in the corner with each place's probability; the title
  gives the user, the time asked and P(new place). An optional ``actual`` place (what the user really did
  next, for a test sample) is a star.
* **Labels never cover each other**: once the layout is final, the ranks (first) and the visit numbers
  are moved to the first free spot around their point (:func:`nextloc.maps.labels.place_labels`), with a
  leader line when pushed away from it.
* **The view** frames the history, the actual place, the first place and every place within
  :data:`VIEW_REACH` times their reach (at least :data:`MIN_REACH_M`): one place 20 km away would shrink
  a history of a few streets to a dot, so such a place is drawn outside the view and the key gives its
  distance and direction instead.
* **Many answers**: one figure, one panel each, for the first :data:`MAX_PANELS` answers (the CLI's
  ``--map``); the files are written atomically (:func:`nextloc.atomic.atomic_path`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from nextloc.atomic import atomic_path
from nextloc.maps.labels import Placed, place_labels
from nextloc.maps.tiles import TileSource, add_basemaps
from nextloc.predict.answer import visits_at_centres
from nextloc.predict.answer_set import describe_set
from nextloc.predict.histories import Histories, history_visits
from nextloc.preprocessing.sequences import FIRST_PLACE

logger = logging.getLogger(__name__)

__all__ = [
    "DrawnMap",
    "MapQuestion",
    "Panel",
    "draw_answer",
    "draw_answers",
    "draw_predictions",
    "in_view",
    "map_questions",
    "project",
    "visit_label",
]

MAX_PANELS = 4  # answers drawn by draw_predictions (the CLI's --map): the first ones
PANEL_INCHES = 6.4
DPI = 100  # a panel is 640 x 640 pixels
KM_ABOVE_M = 3000.0  # axes in km when the drawing spans more than this
EARTH_RADIUS_M = 6_371_008.8
MAX_NUMBERED = 40  # visits numbered one by one; beyond, only the first and the latest
MIN_SPAN_M = 400.0  # a drawing of one spot still shows this much around it
PLACES_LABEL = "predicted next places (area ∝ probability)"
VIEW_REACH = 3.0  # places within this many times the history's reach are framed; farther ones are listed
MIN_REACH_M = 2000.0
COMPASS = ("N", "NE", "E", "SE", "S", "SW", "W", "NW")
# the visit numbers and ranks: offset from their point, above the markers, no part in the layout (they are
# placed once it is final: nextloc.maps.labels)
LABEL = {"textcoords": "offset points", "zorder": 7, "in_layout": False}


@dataclass(frozen=True)
class Panel:
    """What one panel drew, read back from its artists (coordinates in the panel's projected unit).

    Attributes:
        title: the panel's title.
        origin: ``(latitude, longitude)`` of the projection's origin.
        unit_m: metres per axis unit (1 or 1000).
        history: ``(n, 2)`` the history line's points, oldest first.
        places: ``(k, 2)`` the predicted places' centres, rank 1 first.
        place_sizes: ``(k,)`` their marker areas (points squared).
        probabilities: ``(k,)`` their probabilities.
        actual: ``(1, 2)`` the actual next place, or ``(0, 2)``.
        in_view: ``(k,)`` which places the view frames (a far one is drawn outside it and listed).
        place_lines: the key in the panel's corner, one line per place.
        labels: the ranks, then the visit numbers, as drawn (their boxes in pixels).
        basemap: the attribution of the tiles drawn under the panel; ``""``: no basemap, the plain axes.
    """

    title: str
    origin: tuple[float, float]
    unit_m: float
    history: np.ndarray
    places: np.ndarray
    place_sizes: np.ndarray
    probabilities: np.ndarray
    actual: np.ndarray
    in_view: np.ndarray
    place_lines: tuple[str, ...]
    labels: tuple[Placed, ...] = ()
    basemap: str = ""


@dataclass(frozen=True)
class DrawnMap:
    """A written map: its file, its size in pixels and what each panel drew."""

    path: Path
    width_px: int
    height_px: int
    panels: tuple[Panel, ...]


def project(
    latitude: np.ndarray, longitude: np.ndarray, origin: tuple[float, float], unit_m: float = 1.0
) -> np.ndarray:
    """``(n, 2)`` east and north of ``origin`` (``(lat, lon)``) in units of ``unit_m`` metres
    (equirectangular at the origin's latitude)."""
    lat0, lon0 = origin
    radians = math.pi / 180.0
    east = (np.asarray(longitude, float) - lon0) * radians * math.cos(lat0 * radians) * EARTH_RADIUS_M
    north = (np.asarray(latitude, float) - lat0) * radians * EARTH_RADIUS_M
    return np.column_stack([east, north]) / unit_m


def draw_answer(
    history: pd.DataFrame,
    answer: Mapping[str, Any],
    path: Path,
    actual: tuple[float, float] | None = None,
    tiles: TileSource | None | Literal["env"] = "env",
) -> DrawnMap:
    """One answer on a map (see the module docstring), written to ``path`` as a 640 x 640 PNG.

    Args:
        history: the visits it was answered from, oldest first: ``latitude``, ``longitude``, optional
            ``place`` (``1``: a place the model never saw) (:func:`nextloc.predict.histories.history_visits`).
        answer: one answer of :func:`nextloc.predict.answer.predict`.
        path: the PNG to write.
        actual: ``(latitude, longitude)`` of where the user really went next, if known.
        tiles: the basemap's tile source; ``"env"``: ``$NEXTLOC_MAP_TILES``
            (:func:`nextloc.maps.tiles.configured`); None: no basemap.

    Raises:
        ValueError: nothing to draw (no visit and no place with coordinates).
    """
    return draw_answers([(history, answer, actual)], path, tiles)


def draw_answers(
    items: Sequence[tuple[pd.DataFrame, Mapping[str, Any], tuple[float, float] | None]],
    path: Path,
    tiles: TileSource | None | Literal["env"] = "env",
) -> DrawnMap:
    """Several answers, one panel each (two per row), in one PNG: ``items`` are ``(history, answer,
    actual)`` and ``tiles`` as :func:`draw_answer` takes them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not items:
        raise ValueError("no answer to draw")
    columns = min(len(items), 2)
    rows = math.ceil(len(items) / columns)
    fig = Figure(figsize=(PANEL_INCHES * columns, PANEL_INCHES * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    drawn = [_draw_panel(ax, *item) for ax, item in zip(axes, items, strict=False)]
    for ax in axes[len(items) :]:
        ax.set_axis_off()
    path = Path(path)
    views = [(panel.origin, panel.unit_m) for panel, _ in drawn]
    marks = add_basemaps(axes[: len(items)], views, tiles, path)
    renderer = fig.canvas.get_renderer()
    fig.get_layout_engine().execute(fig)  # the final layout: the labels are placed in its pixels
    fig.set_layout_engine("none")  # kept as it is: saving lays out nothing again
    panels = tuple(
        replace(
            panel,
            labels=place_labels(ax, labels, renderer, _kept_free(mark, renderer)),
            basemap="" if mark is None else mark.get_text(),
        )
        for ax, (panel, labels), mark in zip(axes, drawn, marks or [None] * len(drawn), strict=False)
    )
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    width, height = (int(round(v * DPI)) for v in fig.get_size_inches())
    logger.info("drew %d answer(s) on %s (%d x %d px)", len(items), path, width, height)
    return DrawnMap(path, width, height, panels)


def _kept_free(mark: Any, renderer: Any) -> list[tuple[float, float, float, float]]:
    """The box the labels keep off: a basemap's attribution (``mark``), padded as its box is drawn."""
    return [] if mark is None else [tuple(mark.get_window_extent(renderer).padded(2).extents)]


def draw_predictions(
    histories: Histories,
    answers: Sequence[Mapping[str, Any]],
    locations: pd.DataFrame | None,
    path: Path,
    limit: int = MAX_PANELS,
    tiles: TileSource | None | Literal["env"] = "env",
) -> DrawnMap:
    """The first ``limit`` answers of :func:`nextloc.predict.answer.predict` on their histories, in one PNG
    (``tiles`` as :func:`draw_answer` takes them)."""
    count = min(limit, len(answers))
    items = [(history_visits(histories, i, locations), answers[i], None) for i in range(count)]
    return draw_answers(items, path, tiles)


@dataclass(frozen=True)
class MapQuestion:
    """A question a dataset can answer itself, for a model's maps: a user's visits before one of their
    targets, the time asked (the target's start) and the target's place centre (None: a new place)."""

    user_id: int
    visits: pd.DataFrame
    at: pd.Timestamp
    actual: tuple[float, float] | None


def map_questions(
    samples: pd.DataFrame,
    staypoints: pd.DataFrame,
    locations: pd.DataFrame,
    n_users: int = 3,
    days: int = 7,
) -> list[MapQuestion]:
    """The ``n_users`` users with the most samples (ties: the lower user id; a deterministic choice), each
    asked at the target of their last sample.

    The visits are the user's staypoints at known places that started in the ``days + 1`` days before the
    target (the model's encoder applies its own calendar-day window), at their places' centres
    (:func:`nextloc.predict.answer.visits_at_centres`: the dataset keeps no staypoint coordinates, and a new place
    has no centre, so its visits are left out). A user with no such visit is skipped.

    Args:
        samples: a split's samples (``user_id``, ``staypoint_id``: the target).
        staypoints: the dataset's final staypoints (``id``, ``user_id``, ``location_id``, times).
        locations: its location vocabulary.
        n_users: how many users.
        days: the samples' ``previous_days``.
    """
    counts = samples.groupby("user_id").size()
    users = sorted(counts.index, key=lambda u: (-int(counts[u]), int(u)))[:n_users]
    by_id = staypoints.set_index("id")
    centres = locations.set_index("loc_index")
    questions = []
    for user_id in users:
        target = by_id.loc[int(samples.loc[samples["user_id"] == user_id, "staypoint_id"].max())]
        at = target["started_at"]
        before = staypoints[
            (staypoints["user_id"] == user_id)
            & (staypoints["started_at"] < at)
            & (staypoints["started_at"] >= at - pd.Timedelta(days=days + 1))
            & (staypoints["location_id"] >= FIRST_PLACE)
        ].sort_values("started_at")
        if before.empty:
            logger.info("user %s has no visit at a known place before their last target: no map", user_id)
            continue
        place = int(target["location_id"])
        actual = None
        if place >= FIRST_PLACE:
            actual = (float(centres.loc[place, "latitude"]), float(centres.loc[place, "longitude"]))
        questions.append(MapQuestion(int(user_id), visits_at_centres(before, locations), at, actual))
    return questions


def _draw_panel(
    ax: Any, history: pd.DataFrame, answer: Mapping[str, Any], actual: tuple[float, float] | None
) -> tuple[Panel, list[Any]]:
    """One answer on ``ax``: what was drawn, and its labels (ranks first) for :func:`place_labels`."""
    places = [p for p in answer.get("places", []) if "latitude" in p]
    place_ll = np.array([[p["latitude"], p["longitude"]] for p in places], float).reshape(-1, 2)
    probabilities = np.array([p["probability"] for p in places], float)
    hist_ll = history[["latitude", "longitude"]].to_numpy(float).reshape(-1, 2)
    actual_ll = np.array([actual] if actual else [], float).reshape(-1, 2)
    framed = in_view(hist_ll, place_ll, actual_ll)
    view = np.concatenate([hist_ll, place_ll[framed], actual_ll])
    if not len(view):
        raise ValueError("nothing to draw: the history has no visit and the answer no place with coordinates")
    origin = ((view[:, 0].min() + view[:, 0].max()) / 2, (view[:, 1].min() + view[:, 1].max()) / 2)
    span_m = np.ptp(project(view[:, 0], view[:, 1], origin), axis=0).max()
    unit_m = 1000.0 if span_m > KM_ABOVE_M else 1.0
    new = history["place"].to_numpy() == 1 if "place" in history else np.zeros(len(history), bool)
    tolerance = max(span_m, MIN_SPAN_M) / unit_m / 60  # about 10 pixels of a 640-pixel panel
    line, visit_labels = _draw_history(ax, project(*hist_ll.T, origin, unit_m), new, tolerance)
    discs, rank_labels = _draw_places(ax, project(*place_ll.T, origin, unit_m), places)
    star = ax.scatter(*project(*actual_ll.T, origin, unit_m).T, marker="*", s=260, c="tab:green")
    star.set(edgecolor="black", linewidth=0.6, zorder=6)
    if actual:
        ax.scatter([], [], marker="*", s=120, c="tab:green", edgecolor="black", label="actual next place")
    drawn_places = np.asarray(discs.get_offsets(), float).reshape(-1, 2)
    centre = _frame(
        ax, np.concatenate([line.get_xydata(), drawn_places[framed], star.get_offsets()]), origin, unit_m
    )
    lines = _place_lines(places, (drawn_places - centre) * unit_m, framed)
    # the legend and the key go under the map, where they cover nothing
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.08), fontsize=7, frameon=False)
    ax.text(1.0, -0.09, "\n".join(lines), transform=ax.transAxes, fontsize=7, ha="right", va="top")
    title = _title(answer, len(history))
    ax.set_title(title, fontsize=10)
    panel = Panel(
        title=title,
        origin=(float(origin[0]), float(origin[1])),
        unit_m=unit_m,
        history=np.asarray(line.get_xydata(), float),
        places=drawn_places,
        place_sizes=np.asarray(discs.get_sizes(), float),
        probabilities=probabilities,
        actual=np.asarray(star.get_offsets(), float).reshape(-1, 2),
        in_view=framed,
        place_lines=tuple(lines),
    )
    return panel, [*rank_labels, *visit_labels]


def in_view(history: np.ndarray, places: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Which places the view frames: those within :data:`VIEW_REACH` times the reach of the history, the
    actual place and the first place from their centre (at least :data:`MIN_REACH_M`). A far place would
    shrink the history to a dot; it is listed with its distance and direction instead."""
    focus = np.concatenate([history, places[:1], actual])
    if not len(focus):
        return np.zeros(len(places), bool)
    centre = ((focus[:, 0].min() + focus[:, 0].max()) / 2, (focus[:, 1].min() + focus[:, 1].max()) / 2)
    reach = np.hypot(*project(*focus.T, centre).T).max()
    limit = max(VIEW_REACH * reach, MIN_REACH_M)
    return np.hypot(*project(*places.T, centre).T) <= limit


def _place_lines(places: list[Mapping[str, Any]], offsets_m: np.ndarray, in_view: np.ndarray) -> list[str]:
    """The places' key: ``#rank probability``, and for a place off the map its distance and direction from
    the view's centre."""
    lines = []
    for place, (east, north), seen in zip(places, offsets_m, in_view, strict=True):
        line = f"#{place['rank']}  p {place['probability']:.3f}"
        if not seen:
            compass = COMPASS[round(math.degrees(math.atan2(east, north)) / 45) % 8]
            line += f"  off the map: {math.hypot(east, north) / 1000:.1f} km {compass}"
        lines.append(line)
    return lines


def _draw_history(ax: Any, xy: np.ndarray, new: np.ndarray, tolerance: float) -> tuple[Any, list[Any]]:
    """The visits in order: the line, the points, their numbers (one label for the visits within
    ``tolerance`` of each other), the last move and the latest; returns the line and the labels."""
    (line,) = ax.plot(xy[:, 0], xy[:, 1], "-", color="tab:blue", linewidth=1.2, alpha=0.6, zorder=2)
    line.set_label(f"history ({len(xy)} visits, numbered in order)" if len(xy) else "_none")
    known = ~new
    ax.scatter(xy[known, 0], xy[known, 1], s=22, c="tab:blue", edgecolor="white", linewidth=0.5, zorder=4)
    if new.any():
        ax.scatter(*xy[new].T, s=40, marker="x", c="tab:red", zorder=4, label="visit at a new place")
    labels = [
        ax.annotate(label, spot, xytext=(4, 4), fontsize=7, color="navy", **LABEL)
        for spot, label in _visit_labels(xy, tolerance).items()
    ]
    if len(xy) >= 2 and not np.allclose(xy[-2], xy[-1]):
        arrow = {"arrowstyle": "-|>", "color": "tab:blue", "linewidth": 1.6, "mutation_scale": 14}
        ax.annotate("", xy=tuple(xy[-1]), xytext=tuple(xy[-2]), arrowprops=arrow, zorder=5)
    if len(xy):
        ax.scatter(*xy[-1], s=150, facecolor="none", edgecolor="navy", linewidth=1.5, zorder=5)
        ax.scatter([], [], s=60, facecolor="none", edgecolor="navy", label="latest visit")
    return line, labels


def _visit_labels(xy: np.ndarray, tolerance: float) -> dict[tuple[float, float], str]:
    """Each drawn spot's visit numbers (from 1), ``1,3,…,9`` when many; visits within ``tolerance`` of a
    spot's first visit share its label (they would print over each other); only the first and the latest
    visit beyond :data:`MAX_NUMBERED` visits."""
    numbers: dict[tuple[float, float], list[int]] = {}
    chosen = range(len(xy)) if len(xy) <= MAX_NUMBERED else (0, len(xy) - 1)
    for i in chosen:
        point = (float(xy[i, 0]), float(xy[i, 1]))
        spot = next((s for s in numbers if math.dist(s, point) <= tolerance), point)
        numbers.setdefault(spot, []).append(i + 1)
    return {spot: visit_label(n) for spot, n in numbers.items()}


def visit_label(numbers: Sequence[int]) -> str:
    """The label of a spot visited as ``numbers`` (from 1, in order): ``1,3,7``, or ``1,3,…,9`` when more
    than four (the PNG maps and :mod:`nextloc.maps.answers` label visits alike)."""
    n = list(numbers)
    return ",".join(map(str, n)) if len(n) <= 4 else f"{n[0]},{n[1]},…,{n[-1]}"


def _draw_places(ax: Any, xy: np.ndarray, places: list[Mapping[str, Any]]) -> tuple[Any, list[Any]]:
    """The predicted places, area growing with the probability, labelled ``#rank``; returns the discs and
    the labels."""
    probabilities = np.array([p["probability"] for p in places], float)
    discs = ax.scatter(
        xy[:, 0],
        xy[:, 1],
        s=60.0 + 1800.0 * probabilities,
        c="tab:orange",
        alpha=0.45,
        edgecolor="darkorange",
        linewidth=1.2,
        zorder=3,
    )
    if len(xy):  # the legend's marker at a fixed size (the discs' own would be the largest)
        ax.scatter([], [], s=90, c="tab:orange", alpha=0.45, edgecolor="darkorange", label=PLACES_LABEL)
    labels = [
        ax.annotate(f"#{place['rank']}", (x, y), xytext=(5, -11), fontsize=8, **LABEL)
        for (x, y), place in zip(xy, places, strict=True)
    ]
    return discs, labels


def _frame(ax: Any, xy: np.ndarray, origin: tuple[float, float], unit_m: float) -> np.ndarray:
    """Equal aspect, a margin around ``xy`` (at least :data:`MIN_SPAN_M`), axes that say where their origin
    is; returns the view's centre."""
    low, high = xy.min(axis=0), xy.max(axis=0)
    centre = (low + high) / 2
    half = max(float((high - low).max()) * 0.6, MIN_SPAN_M / unit_m / 2)
    ax.set_xlim(centre[0] - half, centre[0] + half)
    ax.set_ylim(centre[1] - half, centre[1] + half)
    ax.set_aspect("equal")
    unit = "km" if unit_m == 1000 else "m"
    lat, lon = origin
    where = f"{abs(lat):.4f}°{'N' if lat >= 0 else 'S'} {abs(lon):.4f}°{'E' if lon >= 0 else 'W'}"
    ax.set_xlabel(f"{unit} east of {where}", fontsize=8)
    ax.set_ylabel(f"{unit} north", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    return centre


def _title(answer: Mapping[str, Any], n_visits: int) -> str:
    who = f"user {answer['user_id']}" if "user_id" in answer else f"user index {answer.get('user', '?')}"
    if answer.get("history_id") is not None:
        who += f", history {answer['history_id']}"
    when = f" at {answer['at']}" if answer.get("at") else ""
    p_new = answer.get("p_new_place")
    new = f"P(new place) {p_new:.2f}" if p_new is not None else "no new-place head"
    title = f"{who}{when}: {n_visits} visits\ntop {len(answer.get('places', []))} next places, {new}"
    chosen = describe_set(answer, most=4)  # with --coverage: the answer set, one more line
    return title if chosen is None else f"{title}\n{chosen}"
