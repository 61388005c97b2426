"""The kinds compared in one chart (:mod:`nextloc.evaluation.comparison`): what the bars show is read back
from the figure and compared with the leaderboard it was drawn from; the files are a PNG and a page that
fetches nothing, written the same for the same board."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from nextloc.evaluation.comparison import COMPARED, draw_comparison
from nextloc.evaluation.leaderboard import leaderboard
from nextloc.maps.web import external_references

RUNS = [  # (kind, place Acc@1, place MRR) per seed
    ("markov", 27.0, 37.0),
    ("pointer_plus", 41.0, 50.0),
    ("pointer_plus", 43.0, 53.0),
    ("ranker", 48.0, 56.0),
    ("ranker", 49.0, 56.5),
    ("ranker", 50.0, 57.0),
]


def board():
    return leaderboard([(kind, {"place_acc@1": acc, "place_mrr": mrr}) for kind, acc, mrr in RUNS])


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_the_chart_shows_each_kinds_mean_and_seed_spread_best_first(tmp_path: Path) -> None:
    chart = draw_comparison(board(), tmp_path / "kinds.png", tmp_path / "kinds.html")
    assert chart.kinds == ("ranker", "pointer_plus", "markov")  # best test place Acc@1 first
    assert chart.seeds == (3, 2, 1)
    assert chart.means["place_acc@1"] == pytest.approx((49.0, 42.0, 27.0))
    assert chart.means["place_mrr"] == pytest.approx((56.5, 51.5, 37.0))
    assert chart.stds["place_acc@1"] == pytest.approx((1.0, np.std([41, 43], ddof=1), 0.0))
    assert chart.stds["place_mrr"] == pytest.approx((0.5, np.std([50, 53], ddof=1), 0.0))
    width, height = png_size(chart.png)
    assert width == 800
    assert height > 250
    html = chart.html.read_text()
    assert external_references(html) == []
    assert "<svg" in html
    for label in COMPARED.values():
        assert label in html
    assert "<tr><td>ranker</td><td>3</td><td>49.00 ± 1.00</td><td>56.50 ± 0.50</td></tr>" in html
    again = draw_comparison(board(), tmp_path / "again.png", tmp_path / "again.html")
    assert again.png.read_bytes() == chart.png.read_bytes()
    assert again.html.read_bytes() == chart.html.read_bytes()


def test_a_missing_metric_draws_no_bar_and_an_empty_board_is_an_error(tmp_path: Path) -> None:
    rows = [("markov", {"place_acc@1": 27.0, "place_mrr": 37.0}), ("odd", {"place_acc@1": 30.0})]
    chart = draw_comparison(leaderboard(rows), tmp_path / "kinds.png")
    assert chart.html is None
    assert chart.kinds == ("odd", "markov")
    assert np.isnan(chart.means["place_mrr"][0])
    assert chart.means["place_mrr"][1] == pytest.approx(37.0)
    with pytest.raises(ValueError, match="no model kind"):
        draw_comparison({}, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
