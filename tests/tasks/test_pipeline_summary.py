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


def test_render_summary_names_the_users_sharing_recordings() -> None:
    """With a ``duplicates`` section, one line names the pairs; with the runs' metrics without copies, the
    runs table gains their column (a run that lacks them shows ``-``)."""
    sample = json.loads((GOLDEN / "sample.json").read_text())
    sample["preprocessed"]["ingest"]["duplicates"] = {
        "pairs": [
            {"users": [0, 3], "shared_files": 129, "shared_staypoints": 400, "copied_test_samples": 90},
            {"users": [153, 163], "shared_files": 230, "shared_staypoints": 800, "copied_test_samples": 270},
        ],
        "copied_test_samples": 360,
        "test_samples": 3502,
        "n_files_dropped": 0,
    }
    sample["runs"][0]["results"].update({"place_acc@1_dedup": 9.5, "n_test_dedup": 3142})
    markdown = render_summary(sample["preprocessed"], {**sample, "promotion": {}}, "7", None)
    assert (
        "- users sharing recordings: 153/163 (230 files, 800 staypoints, 270 test targets); 000/003 (129 files, "
        "400 staypoints, 90 test targets); 360 of 3502 test samples are copies (see `ingest_report.json`)\n"
    ) in markdown
    assert "| model | seed | test place acc@1 | without copies (n) | test acc@1 | MLflow run |\n" in markdown
    assert "| markov | 0 | 10.00 | 9.50 (3142) | 19.00 | `aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa` |\n" in markdown
    assert "| mhsa | 0 | 20.00 | - |" in markdown
    golden = (GOLDEN / "summary_noui.md").read_text()
    assert "users sharing recordings" not in golden
    assert "without copies" not in golden
