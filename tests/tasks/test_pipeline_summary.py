"""The preprocess-train run summary (markdown), pinned against recorded text."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.pipeline import render_summary

GOLDEN = Path(__file__).parents[1] / "golden" / "leaderboard"


def test_render_summary_with_a_ui_and_champions() -> None:
    sample = json.loads((GOLDEN / "sample.json").read_text())
    markdown = render_summary(sample["preprocessed"], sample, "7", "http://mlflow:5000/")
    assert markdown == (GOLDEN / "summary_ui.md").read_text()


def test_render_summary_without_a_ui_or_champions() -> None:
    sample = json.loads((GOLDEN / "sample.json").read_text())
    markdown = render_summary(sample["preprocessed"], {**sample, "promotion": {}}, "7", None)
    assert markdown == (GOLDEN / "summary_noui.md").read_text()
