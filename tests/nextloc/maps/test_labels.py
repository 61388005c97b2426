"""Labels that never cover each other (:mod:`nextloc.maps.labels`): close points drawn on a real Agg figure, the
label boxes measured by matplotlib's renderer after the figure is saved, and compared pairwise."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from nextloc.maps.labels import GAP_PX, boxes_overlap, place_labels


def crowded_figure(points: np.ndarray, texts: list[str]):
    fig = Figure(figsize=(4, 4), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.scatter(*points.T, s=20)
    ax.set(xlim=(0, 100), ylim=(0, 100), xlabel="x")
    labels = [
        ax.annotate(t, tuple(p), xytext=(5, -11), textcoords="offset points", fontsize=8, in_layout=False)
        for p, t in zip(points, texts, strict=True)
    ]
    fig.get_layout_engine().execute(fig)
    return fig, ax, labels


def measured(fig, labels) -> list[tuple[float, ...]]:
    renderer = fig.canvas.get_renderer()
    return [tuple(label.get_window_extent(renderer).extents) for label in labels]


def test_close_points_get_labels_that_do_not_intersect(tmp_path: Path) -> None:
    """Twelve points within 3 units of each other (a few pixels), each with a label at the same offset:
    drawn as given they all cover each other; placed, no two boxes meet, as the saved figure shows them."""
    rng = np.random.default_rng(0)
    points = 50 + rng.uniform(-3, 3, size=(12, 2))
    texts = [f"#{i}" for i in range(1, 13)]
    fig, ax, labels = crowded_figure(points, texts)
    before = measured(fig, labels)
    assert sum(boxes_overlap(a, b) for a, b in itertools.combinations(before, 2)) > 10
    placed = place_labels(ax, labels, fig.canvas.get_renderer())
    fig.savefig(tmp_path / "labels.png", dpi=100)  # the layout runs again: the labels take no part
    after = measured(fig, labels)
    assert [p.text for p in placed] == texts
    assert np.allclose([p.box for p in placed], after)
    for a, b in itertools.combinations(after, 2):
        assert not boxes_overlap(a, b), (a, b)
        assert not boxes_overlap(a, b, GAP_PX - 0.01)
    frame = ax.get_window_extent(fig.canvas.get_renderer()).extents
    assert all(
        frame[0] <= x0 and x1 <= frame[2] and frame[1] <= y0 and y1 <= frame[3] for x0, y0, x1, y1 in after
    )
    assert any(p.ring > 1 for p in placed)  # a crowd pushes some off the first ring, with a leader line
    assert len(ax.texts) > len(labels)


def test_a_free_label_keeps_its_own_offset_and_the_placement_is_deterministic() -> None:
    points = np.array([[20.0, 20.0], [80.0, 80.0], [50.0, 50.0], [51.0, 50.5]])
    results = []
    for _ in range(2):
        fig, ax, labels = crowded_figure(points, ["a", "b", "c", "d"])
        results.append(place_labels(ax, labels, fig.canvas.get_renderer()))
        assert [label.xyann for label in labels[:3]] == [(5, -11)] * 3  # alone at its place: not moved
        assert labels[3].xyann != (5, -11)
    assert results[0] == results[1]


def test_a_label_of_a_point_outside_the_axes_is_not_drawn() -> None:
    fig, ax, labels = crowded_figure(np.array([[50.0, 50.0], [500.0, 50.0]]), ["in", "out"])
    inside, outside = place_labels(ax, labels, fig.canvas.get_renderer())
    assert inside.ring == 1
    assert outside.ring == 0
    assert outside.box == pytest.approx((0, 0, 0, 0))


def test_labels_keep_off_the_boxes_they_are_told_to_avoid() -> None:
    """A box to keep free (a basemap's attribution) where a label would stay: the label moves off it."""
    fig, ax, labels = crowded_figure(np.array([[50.0, 50.0]]), ["#1"])
    (alone,) = place_labels(ax, labels, fig.canvas.get_renderer())
    assert labels[0].xyann == (5, -11)  # free: its own place
    x0, y0, x1, y1 = alone.box
    credit = (x0 - 5, y0 - 3, x1 + 5, y1 + 3)
    fig, ax, labels = crowded_figure(np.array([[50.0, 50.0]]), ["#1"])
    (placed,) = place_labels(ax, labels, fig.canvas.get_renderer(), [credit])
    assert not boxes_overlap(placed.box, credit, GAP_PX - 0.01)
    assert labels[0].xyann != (5, -11)
