"""Labels that never cover each other: a deterministic greedy placement, measured by the renderer.

matplotlib draws a label where it is told, over any other; two places 60 m apart on a map of a few
kilometres get ``#3`` and ``#5`` on top of each other. :func:`place_labels` moves each label, in the
order given (the caller puts the important ones first), to the first free position around its point:

* the candidates are the label's own offset, then eight directions (the text's box beside the point:
  right, above right, above, ...), on rings :data:`RING_PT` points apart, nearest first;
* a candidate is free when its box, as the renderer measures the text, comes no closer than
  :data:`GAP_PX` to a label placed before it (or a box the caller keeps free: a basemap's attribution)
  and stays inside the axes; a first pass also keeps it off the other labelled points
  (:data:`POINT_PX` around each), a second drops that wish when a crowd leaves no room;
* a label moved past the first ring gets a thin leader line to its point.

The figure's layout must be final first (the caller runs its layout engine): the labels are measured in
pixels. The caller makes them with ``in_layout=False``, so that the layout that saving runs again is the
one they were placed in. Nothing is random: the same figure gives the same picture.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["Placed", "boxes_overlap", "place_labels"]

RING_PT = 6.0  # points between rings of candidate positions
MAX_RINGS = 40
GAP_PX = 2.0  # the least space between two labels (touching ones read as one: "#2" "23" as "#223")
POINT_PX = 4.0  # half the side of the square kept free around each labelled point (first pass)
# the eight directions: (x, y) unit offset, horizontal and vertical alignment of the text at that offset
DIRECTIONS = (
    (1, 0, "left", "center"),
    (1, 1, "left", "bottom"),
    (0, 1, "center", "bottom"),
    (-1, 1, "right", "bottom"),
    (-1, 0, "right", "center"),
    (-1, -1, "right", "top"),
    (0, -1, "center", "top"),
    (1, -1, "left", "top"),
)
LEADER = {"arrowstyle": "-", "color": "0.45", "linewidth": 0.5, "shrinkA": 0.0, "shrinkB": 1.5}


@dataclass(frozen=True)
class Placed:
    """A label as drawn: its text, its box in pixels (``x0, y0, x1, y1``, origin bottom left) and the ring
    it was placed on (1: beside its point; 0: not drawn, its point is outside the axes)."""

    text: str
    box: tuple[float, float, float, float]
    ring: int


def boxes_overlap(a: Sequence[float], b: Sequence[float], gap: float = 0.0) -> bool:
    """Whether two ``x0, y0, x1, y1`` boxes share more than an edge, or come closer than ``gap``."""
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


def place_labels(
    ax: Any,
    labels: Sequence[Any],
    renderer: Any,
    avoid: Sequence[tuple[float, float, float, float]] = (),
) -> tuple[Placed, ...]:
    """Move ``labels`` (annotations of ``ax`` at a data point, offset in points) so that none covers another
    nor any box of ``avoid`` (pixels: a basemap's attribution) (see the module docstring); returns each as
    drawn, in the order given."""
    frame = ax.get_window_extent(renderer).extents
    anchors = [label for label in labels if _shown(ax, label)]
    points = np.array([ax.transData.transform(label.xy) for label in anchors], float).reshape(-1, 2)
    taken: list[tuple[float, float, float, float]] = list(avoid)
    placed: dict[int, Placed] = {}
    for i, label in enumerate(anchors):
        others = np.delete(points, i, axis=0)
        ring, box = _first_free(label, renderer, frame, taken, others)
        taken.append(box)
        placed[id(label)] = Placed(label.get_text(), box, ring)
        if ring > 1:
            leader = ax.annotate(
                "", label.xy, xytext=label.xyann, textcoords="offset points", arrowprops=LEADER, zorder=6
            )
            leader.set_in_layout(False)
    return tuple(placed.get(id(label), Placed(label.get_text(), (0.0, 0.0, 0.0, 0.0), 0)) for label in labels)


def _shown(ax: Any, label: Any) -> bool:
    """Whether the label's point is inside the axes (matplotlib draws no annotation of a point outside)."""
    return bool(label.get_visible() and ax.contains_point(ax.transData.transform(label.xy)))


def _first_free(
    label: Any,
    renderer: Any,
    frame: Sequence[float],
    taken: list[tuple[float, float, float, float]],
    points: np.ndarray,
) -> tuple[int, tuple[float, float, float, float]]:
    """Set ``label`` to its first free candidate: off the other points if any candidate allows, else off
    the labels only, else (a crowd beyond :data:`MAX_RINGS` rings) off the labels outside the axes too."""
    own = (*label.xyann, label.get_horizontalalignment(), label.get_verticalalignment())
    for keep_off_points, inside in ((True, True), (False, True), (False, False)):
        for ring, (dx, dy, ha, va) in _candidates(own):
            label.xyann = (dx, dy)
            label.set_horizontalalignment(ha)
            label.set_verticalalignment(va)
            box = tuple(label.get_window_extent(renderer).extents)
            if inside and not (
                frame[0] <= box[0] and box[2] <= frame[2] and frame[1] <= box[1] and box[3] <= frame[3]
            ):
                continue
            if any(boxes_overlap(box, other, GAP_PX) for other in taken):
                continue
            if keep_off_points and _covers(box, points):
                continue
            return ring, box
    logger.warning("label %r: no free position within %d rings", label.get_text(), MAX_RINGS)
    return ring, box


def _candidates(own: tuple[float, float, str, str]) -> Iterator[tuple[int, tuple[float, float, str, str]]]:
    """The label's own position (ring 1), then the eight directions on each ring, nearest first."""
    yield 1, own
    for ring in range(1, MAX_RINGS + 1):
        gap = RING_PT * ring
        for dx, dy, ha, va in DIRECTIONS:
            yield ring, (dx * gap, dy * gap, ha, va)


def _covers(box: Sequence[float], points: np.ndarray) -> bool:
    """Whether ``box`` meets the square of :data:`POINT_PX` around any of ``points`` (pixels)."""
    if not len(points):
        return False
    x, y = points[:, 0], points[:, 1]
    return bool(
        np.any(
            (x + POINT_PX > box[0])
            & (x - POINT_PX < box[2])
            & (y + POINT_PX > box[1])
            & (y - POINT_PX < box[3])
        )
    )
