"""Tasks of the ``preprocess-train`` flow around its two stages: where the input is, and the run summary."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from nextloc.evaluation.leaderboard import (
    build_leaderboard,
    champions,
    summary_champions_markdown,
    summary_tables_markdown,
)
from nextloc.evaluation.metrics import DEDUP_HEADLINE
from nextloc.raw.duplicates import describe_pairs
from nextloc.raw.rawdata import DEFAULT_RAW_DIR, SHARED_ARCHIVE, locate_raw_data
from runtime.catalog import Catalog
from tracking import mlflow_runs
from tracking.settings import tracking_server


@task(name="locate-raw-data")
def resolve_raw_dir(raw_dir: str | None) -> str:
    """``raw_dir`` if given (it must exist), else $NEXTLOC_GEOLIFE_DIR, data/raw/geolife, an archive, download."""
    logger = get_run_logger()
    if raw_dir:
        if not Path(raw_dir).exists():
            raise FileNotFoundError(f"raw_dir {raw_dir} does not exist")
        logger.info("GeoLife raw data: raw_dir %s", raw_dir)
        return str(raw_dir)
    found = locate_raw_data(DEFAULT_RAW_DIR, [SHARED_ARCHIVE])
    logger.info("GeoLife raw data: %s", found.source)
    return str(found.path)


@task(name="publish-summary")
def publish_summary(
    preprocessed: dict[str, Any],
    trained: dict[str, Any],
    tracking_uri: str | None,
    experiment: str,
    mlflow_ui_url: str | None = None,
) -> str:
    """Record the run: the ingest report on the MLflow parent run, and a markdown summary as a Prefect artifact.

    A rerun with nothing new (``trained["settled"]``, :mod:`runtime.reruns`) writes nothing to MLflow: the
    parent run its summary names holds the report already.

    The parent run gets the ingest report (``ingest_report.json``: every skipped row and file, with its
    file and line, and the users sharing recordings) as an artifact, and the skip counts and the user pairs
    sharing recordings as tags, so data problems travel with the metrics.

    Returns:
        The markdown text (also stored as the flow run's artifact ``preprocess-train-summary``).
    """
    if trained.get("settled"):  # a rerun with nothing new: the parent run it names already has all this
        experiment_id = trained["experiment_id"]
    else:
        experiment_id = mlflow_runs.configure(tracking_uri, experiment)
        _record_ingest(trained["parent_run_id"], preprocessed)
    markdown = render_summary(preprocessed, trained, experiment_id, _ui_url(tracking_uri, mlflow_ui_url))
    create_markdown_artifact(markdown, key="preprocess-train-summary", description="metrics and MLflow runs")
    get_run_logger().info("summary:\n%s", markdown)
    return markdown


def _record_ingest(parent_id: str, preprocessed: dict[str, Any]) -> None:
    """The ingest report and its counts (and the users sharing recordings) on the parent run."""
    ingest = preprocessed["ingest"]
    report = Catalog(preprocessed["data_dir"]).ingest_report
    if report.is_file():
        mlflow_runs.log_file_artifact(parent_id, report)
    tags = {
        "ingest.rows_skipped": str(ingest["rows_skipped"]),
        "ingest.files_skipped": str(ingest["files_skipped"]),
        **_duplicate_tags(ingest.get("duplicates")),
        "data_dir": preprocessed["data_dir"],
    }
    mlflow_runs.set_run_tags(parent_id, tags)


def render_summary(
    preprocessed: dict[str, Any], trained: dict[str, Any], experiment_id: str, ui_url: str | None
) -> str:
    """Markdown: dataset numbers, the test leaderboard (mean +- std over seeds), promotions, MLflow runs."""
    stats = preprocessed["stats"]

    def link(run_id: str) -> str:
        if not ui_url:
            return f"`{run_id}`"
        return f"[{run_id[:8]}]({ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id})"

    lines = [
        f"# preprocess-train: {preprocessed['data_dir']}",
        "",
        f"- users {stats['n_users']['train']}, locations `total_loc_num` {stats['total_loc_num']}, "
        f"samples train/val/test {stats['n_samples']['train']}/{stats['n_samples']['val']}/"
        f"{stats['n_samples']['test']}",
        f"- ingest: {preprocessed['ingest']['rows_skipped']} rows and "
        f"{preprocessed['ingest']['files_skipped']} files skipped (see `ingest_report.json`)",
        *_duplicate_lines(preprocessed["ingest"].get("duplicates")),
        f"- MLflow parent run {link(trained['parent_run_id'])}"
        + (
            " (this rerun trained and decided nothing new: no parent run of its own)"
            if trained.get("settled")
            else ""
        ),
    ]
    if ui_url:
        lines.append(
            f"- compare the models: [MLflow runs, {mlflow_runs.COMPARISON_VIEW_NAME} view]"
            f"({mlflow_runs.comparison_url(ui_url, experiment_id)})"
        )
    lines.append("")
    ranked = build_leaderboard(
        trained["leaderboard"], champions(trained.get("promotion") or {}, mlflow_runs.registered_name)
    )
    lines += summary_tables_markdown(ranked)
    lines += _runs_table(trained["runs"], link)
    lines += summary_champions_markdown(ranked)
    return "\n".join(lines) + "\n"


def _duplicate_lines(duplicates: dict[str, Any] | None) -> list[str]:
    """The summary's line on users sharing recordings (none when no pair does)."""
    if not duplicates or not duplicates["pairs"]:
        return []
    dropped = duplicates["n_files_dropped"]
    return [
        f"- users sharing recordings: {describe_pairs(duplicates, 5)}; {duplicates['copied_test_samples']} of "
        f"{duplicates['test_samples']} test samples are copies"
        + (f"; {dropped} copied files dropped" if dropped else "")
        + " (see `ingest_report.json`)"
    ]


def _duplicate_tags(duplicates: dict[str, Any] | None) -> dict[str, str]:
    """Parent-run tags: the user pairs sharing recordings, the test samples that are copies, files dropped."""
    if duplicates is None:
        return {}
    return {
        "duplicates.pairs": (describe_pairs(duplicates, 10) or "none")[:1000],
        "duplicates.copied_test_samples": str(duplicates["copied_test_samples"]),
        "duplicates.files_dropped": str(duplicates["n_files_dropped"]),
    }


def _runs_table(runs: list[dict[str, Any]], link: Callable[[str], str]) -> list[str]:
    """One row per run: test place acc@1, and (when some run knows it) the same without the test samples
    whose target is a copy of another user's, with their count; test acc@1; the MLflow run."""
    dedup = any(run["results"].get(DEDUP_HEADLINE) is not None for run in runs)
    header = ["model", "seed", "test place acc@1", *(["without copies (n)"] if dedup else []), "test acc@1"]
    lines = ["| " + " | ".join([*header, "MLflow run"]) + " |", "|---" * (len(header) + 1) + "|"]
    for run in runs:
        results = run["results"]
        cells = [run["kind"], str(run["seed"]), f"{results['place_acc@1']:.2f}"]
        if dedup:
            known = results.get(DEDUP_HEADLINE) is not None
            cells.append(f"{results[DEDUP_HEADLINE]:.2f} ({results['n_test_dedup']})" if known else "-")
        lines.append("| " + " | ".join([*cells, f"{results['acc@1']:.2f}", link(run["run_id"])]) + " |")
    return lines


def _ui_url(tracking_uri: str | None, explicit: str | None) -> str | None:
    """Where the MLflow UI is: the explicit URL, $NEXTLOC_MLFLOW_UI_URL, or an http(s) tracking URI."""
    if explicit:
        return explicit
    if os.environ.get("NEXTLOC_MLFLOW_UI_URL"):
        return os.environ["NEXTLOC_MLFLOW_UI_URL"]
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    return tracking_server(uri)
