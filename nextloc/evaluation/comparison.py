"""The kinds compared in one chart: test place Acc@1 and place MRR per model kind, mean ± std over seeds.

The picture beside the leaderboard on a training's parent run: a bar per kind and metric, best test place
Acc@1 at the top (the leaderboard's order, :func:`nextloc.evaluation.leaderboard.rank_board`), the seed
spread as error bars (the sample standard deviation; none for one seed) and each bar's ``mean ± std`` at
its end. :func:`draw_comparison` writes it as a PNG and, optionally, as a web page holding the same chart
as inline SVG with the numbers in a table beneath (nothing fetched from elsewhere).

matplotlib without pyplot (a :class:`~matplotlib.figure.Figure` on its own Agg canvas), as in
:mod:`nextloc.maps.png`; the same board writes the same bytes (no date in the files, a fixed SVG id salt).
What was drawn is returned, read back from the bars (:class:`ComparisonChart`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from io import StringIO
from pathlib import Path

import numpy as np

from nextloc.atomic import atomic_path, write_text_atomic
from nextloc.evaluation.leaderboard import Board, format_summary, rank_board
from nextloc.evaluation.metrics import HEADLINE

logger = logging.getLogger(__name__)

__all__ = ["COMPARED", "ComparisonChart", "draw_comparison"]

#: the metrics compared (result key -> label), in the order of the bars of a kind
COMPARED = {HEADLINE: "place Acc@1", "place_mrr": "place MRR"}
COLOURS = ("tab:blue", "tab:orange")
DPI = 100
WIDTH_IN = 8.0


@dataclass(frozen=True)
class ComparisonChart:
    """A written chart: its files, the kinds top to bottom, and per metric the bars' lengths (the means)
    and error bars (the standard deviations) in that order, read back from the drawn bars."""

    png: Path
    html: Path | None
    kinds: tuple[str, ...]
    seeds: tuple[int, ...]
    means: Mapping[str, tuple[float, ...]]
    stds: Mapping[str, tuple[float, ...]]


def draw_comparison(
    board: Board, png: Path, html: Path | None = None, title: str = "test metrics per model kind"
) -> ComparisonChart:
    """Draw ``board`` (:func:`nextloc.evaluation.leaderboard.leaderboard`) as in the module docstring to
    ``png`` and, given ``html``, as a web page there.

    Raises:
        ValueError: an empty board.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not board:
        raise ValueError("no model kind to compare")
    kinds = tuple(rank_board(board, HEADLINE))
    seeds = tuple(int(board[kind][HEADLINE]["n"]) for kind in kinds)
    fig = Figure(figsize=(WIDTH_IN, 1.3 + 0.6 * len(kinds)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    drawn = _draw_bars(ax, board, kinds)
    ax.set_yticks(
        np.arange(len(kinds)), [f"{k} ({n} seed{'s' * (n != 1)})" for k, n in zip(kinds, seeds, strict=True)]
    )
    ax.invert_yaxis()  # the best at the top
    ax.set_xlabel("% of the test samples (error bars: ± std over seeds)")
    ax.set_xlim(0, _x_max(drawn))
    ax.grid(True, axis="x", linewidth=0.3, alpha=0.5)
    fig.legend(loc="outside lower center", ncols=len(COMPARED), fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    png = Path(png)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None})
    if html is not None:
        write_text_atomic(Path(html), _page(fig, board, kinds, seeds, title))
    logger.info("comparison of %d kind(s): %s", len(kinds), ", ".join(map(str, filter(None, (png, html)))))
    means = {key: tuple(float(v) for v in widths) for key, (widths, _) in drawn.items()}
    stds = {key: tuple(float(v) for v in errors) for key, (_, errors) in drawn.items()}
    return ComparisonChart(png, None if html is None else Path(html), kinds, seeds, means, stds)


def _draw_bars(ax, board: Board, kinds: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A bar per kind and metric with its error bar and ``mean ± std``; returns per metric the bars'
    lengths and error bars as drawn (NaN: no value, no bar)."""
    height = 0.8 / len(COMPARED)
    drawn = {}
    for i, (key, label) in enumerate(COMPARED.items()):
        mean = np.array([board[kind][key]["mean"] for kind in kinds], float)
        std = np.array([board[kind][key]["std"] for kind in kinds], float)
        y = np.arange(len(kinds)) - 0.4 + height * (i + 0.5)
        bars = ax.barh(
            y,
            np.nan_to_num(mean),
            height,
            xerr=np.nan_to_num(std),
            color=COLOURS[i],
            label=label,
            error_kw={"capsize": 3, "elinewidth": 1, "ecolor": "black"},
        )
        texts = [format_summary(board[kind][key]) for kind in kinds]
        ax.bar_label(bars, [f" {t}" for t in texts], fontsize=7, padding=3)
        widths = np.array([bar.get_width() for bar in bars.patches], float)
        segments = bars.errorbar.lines[2][0].get_segments()
        errors = np.array([(s[1, 0] - s[0, 0]) / 2 for s in segments], float)
        drawn[key] = (np.where(np.isnan(mean), np.nan, widths), np.where(np.isnan(mean), np.nan, errors))
    return drawn


def _x_max(drawn: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> float:
    """Room for the longest bar, its error bar and its label."""
    ends = [np.nanmax(np.concatenate([w + e, [0.0]])) for w, e in drawn.values()]
    return max(10.0, 1.25 * float(max(ends)))


def _page(fig, board: Board, kinds: Sequence[str], seeds: Sequence[int], title: str) -> str:
    """The chart as a web page: inline SVG (text as text, a fixed id salt, no date) and the numbers."""
    import matplotlib

    svg = StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "nextloc", "svg.fonttype": "none"}):
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
    chart = svg.getvalue()
    chart = chart[chart.index("<svg") :]  # no XML prologue or DOCTYPE inside the page
    head = "".join(f"<th>{escape(label)} (mean ± std)</th>" for label in COMPARED.values())
    rows = "".join(
        f"<tr><td>{escape(kind)}</td><td>{n}</td>"
        + "".join(f"<td>{escape(format_summary(board[kind][key]))}</td>" for key in COMPARED)
        + "</tr>"
        for kind, n in zip(kinds, seeds, strict=True)
    )
    style = (
        "body{font:14px sans-serif;margin:16px}table{border-collapse:collapse;margin-top:12px}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child{text-align:left}"
        "svg{max-width:100%;height:auto}"
    )
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{style}</style></head><body>\n{chart}\n"
        f'<table id="comparison"><tr><th>model</th><th>seeds</th>{head}</tr>{rows}</table>\n</body></html>\n'
    )
