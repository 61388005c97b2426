"""nextloc.evaluation.leaderboard: one builder, its Markdown and terminal renderings pinned against recorded text."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from nextloc.evaluation.leaderboard import (
    Champion,
    build_leaderboard,
    champions,
    decision_text,
    description_markdown,
    print_terminal,
    summary_champions_markdown,
    summary_tables_markdown,
)

GOLDEN = Path(__file__).parents[2] / "golden" / "leaderboard"


def _name(kind: str) -> str:
    return f"nextloc-{kind}"


@pytest.fixture
def sample() -> dict[str, Any]:
    return json.loads((GOLDEN / "sample.json").read_text())


def test_rows_best_headline_first_nan_last(sample: dict[str, Any]) -> None:
    board = build_leaderboard(sample["leaderboard"])
    assert [(row.kind, row.seeds) for row in board.rows] == [("mhsa", 2), ("markov", 1), ("ranker", 0)]
    mhsa = board.rows[0]
    assert mhsa.cell("place_acc@1") == "20.19 ± 0.26"
    assert mhsa.cell("new_place_brier", " +- ") == "0.105 +- 0.007"
    assert mhsa.cell("no_such_metric") == "-"
    assert board.rows[2].cell("place_acc@1") == "-"
    assert board.champions == ()


def test_champions_keep_a_given_sentence_and_make_a_missing_one(sample: dict[str, Any]) -> None:
    decisions = {
        **sample["promotion"],
        "markov": {**sample["promotion"]["markov"], "decision": "kept: given"},
    }
    marks = champions(decisions, _name)
    assert [mark.registered_name for mark in marks] == ["nextloc-mhsa", "nextloc-markov", "nextloc-ranker"]
    assert marks[0].verdict == "promoted"
    assert marks[0].detail.startswith("v3 (seed 1) is the champion of nextloc-mhsa")
    assert marks[0].groups == {"unchanged": {"n": 10, "delta": 1.25}, "new_user": {"n": 2, "delta": -0.5}}
    assert marks[1] == Champion("nextloc-markov", "kept: given", {})
    assert marks[2].decision == "kept: no registered ranker version in this run"


def test_decision_text_tells_one_story() -> None:
    promoted = {
        "promoted": True,
        "reason": "no champion yet",
        "challenger_version": "2",
        "challenger_seed": 1,
    }
    assert decision_text("nextloc-mhsa", promoted) == (
        "promoted: v2 (seed 1) is the champion of nextloc-mhsa (no champion yet)"
    )
    kept = {**promoted, "promoted": False, "champion_version": "1", "reason": "delta 0.1 < 0.5"}
    assert decision_text("nextloc-mhsa", kept) == (
        "kept: v1 stays the champion of nextloc-mhsa; challenger v2 (seed 1): delta 0.1 < 0.5"
    )
    same = {**kept, "champion_version": "2", "reason": "cached"}
    assert decision_text("nextloc-mhsa", same) == (
        "kept: v2 (seed 1) already is the champion of nextloc-mhsa (cached)"
    )
    assert decision_text("nextloc-mhsa", {"promoted": False, "reason": "no registered version"}) == (
        "kept: no registered version"
    )


def test_description_markdown_is_the_recorded_text(sample: dict[str, Any]) -> None:
    board = build_leaderboard(sample["leaderboard"], champions(sample["promotion"], _name))
    expected = (GOLDEN / "description.md").read_text()
    assert description_markdown(board, "Prefect flow run: [x](http://p/x)") == expected
    bare = description_markdown(build_leaderboard(sample["leaderboard"]))
    assert bare == (GOLDEN / "description_bare.md").read_text()


def test_summary_markdown_is_the_recorded_text(sample: dict[str, Any]) -> None:
    board = build_leaderboard(sample["leaderboard"], champions(sample["promotion"], _name))
    recorded = (GOLDEN / "summary_ui.md").read_text()
    tables = "\n".join(summary_tables_markdown(board))
    assert tables in recorded
    assert recorded.endswith("\n".join(summary_champions_markdown(board)) + "\n")
    assert summary_champions_markdown(build_leaderboard(sample["leaderboard"])) == []


def test_terminal_tables_are_what_the_cli_printed(sample: dict[str, Any]) -> None:
    """The text ``commands/main.py:_print_leaderboard`` printed for this board (recorded, 150 columns)."""
    out = io.StringIO()
    print_terminal(
        build_leaderboard(sample["leaderboard"]), "MLflow parent run abc", Console(file=out, width=150)
    )
    assert out.getvalue() == (GOLDEN / "terminal.txt").read_text()
