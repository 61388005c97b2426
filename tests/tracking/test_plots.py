"""The parent run's chart of the kinds (:func:`tracking.plots.log_comparison`) against a real SQLite store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest

from nextloc.maps.web import external_references
from tracking import mlflow_runs
from tracking.plots import COMPARISON, log_comparison

GOLDEN = Path(__file__).parents[1] / "golden" / "leaderboard"


@pytest.fixture
def parent_run(tmp_path: Path) -> Iterator[str]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment_id = mlflow_runs.configure(uri, "t")
    with mlflow_runs.parent_run(experiment_id, "p", {}, {}) as run_id:
        yield run_id


def test_the_chart_goes_beside_the_leaderboard(parent_run: str, tmp_path: Path) -> None:
    """leaderboard.json, leaderboard_chart.png and leaderboard_chart.html at the parent run's top level; the
    page fetches nothing and lists every kind, one with no test value (NaN) included."""
    sample = json.loads((GOLDEN / "sample.json").read_text())
    mlflow_runs.log_leaderboard(parent_run, sample["leaderboard"], sample["runs"], sample["promotion"])
    logged = log_comparison(parent_run, sample["leaderboard"])
    assert logged == [f"{COMPARISON}.png", f"{COMPARISON}.html"]
    names = {a.path for a in mlflow.MlflowClient().list_artifacts(parent_run)}
    assert names == {"leaderboard.json", *logged}
    page = Path(
        mlflow.artifacts.download_artifacts(
            run_id=parent_run, artifact_path=logged[1], dst_path=str(tmp_path)
        )
    )
    html = page.read_text()
    assert external_references(html) == []
    for row in ("<td>mhsa</td><td>2</td><td>20.19 ± 0.26</td>", "<td>ranker</td><td>0</td><td>-</td>"):
        assert row in html


def test_no_kind_is_a_warning_and_no_artifact(parent_run: str, caplog: pytest.LogCaptureFixture) -> None:
    assert log_comparison(parent_run, {}) == []
    assert "no comparison chart" in caplog.text
    assert mlflow.MlflowClient().list_artifacts(parent_run) == []
