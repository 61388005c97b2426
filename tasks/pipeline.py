"""Tasks of the ``preprocess-train`` flow around its two stages: where the input is, and the run summary."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from nextloc.leaderboard import (
    build_leaderboard,
    champions,
    summary_champions_markdown,
    summary_tables_markdown,
)
from nextloc.rawdata import DEFAULT_RAW_DIR, SHARED_ARCHIVE, locate_raw_data
from tasks import tracking
from tasks.catalog import Catalog


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

    The parent run gets the ingest report (``ingest_report.json``: every skipped row and file, with its
    file and line) as an artifact, and the skip counts as tags, so data problems travel with the metrics.

    Returns:
        The markdown text (also stored as the flow run's artifact ``preprocess-train-summary``).
    """
    parent_id = trained["parent_run_id"]
    experiment_id = tracking.configure(tracking_uri, experiment)
    ingest = preprocessed["ingest"]
    report = Catalog(preprocessed["data_dir"]).ingest_report
    if report.is_file():
        tracking.log_file_artifact(parent_id, report)
    tags = {
        "ingest.rows_skipped": str(ingest["rows_skipped"]),
        "ingest.files_skipped": str(ingest["files_skipped"]),
        "data_dir": preprocessed["data_dir"],
    }
    tracking.set_run_tags(parent_id, tags)
    markdown = render_summary(preprocessed, trained, experiment_id, _ui_url(tracking_uri, mlflow_ui_url))
    create_markdown_artifact(markdown, key="preprocess-train-summary", description="metrics and MLflow runs")
    get_run_logger().info("summary:\n%s", markdown)
    return markdown


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
        f"- MLflow parent run {link(trained['parent_run_id'])}",
    ]
    if ui_url:
        lines.append(
            f"- compare the models: [MLflow runs, {tracking.COMPARISON_VIEW_NAME} view]"
            f"({tracking.comparison_url(ui_url, experiment_id)})"
        )
    lines.append("")
    ranked = build_leaderboard(
        trained["leaderboard"], champions(trained.get("promotion") or {}, tracking.registered_name)
    )
    lines += summary_tables_markdown(ranked)
    lines += ["| model | seed | test place acc@1 | test acc@1 | MLflow run |", "|---|---|---|---|---|"]
    for run in trained["runs"]:
        results = run["results"]
        lines.append(
            f"| {run['kind']} | {run['seed']} | {results['place_acc@1']:.2f} | {results['acc@1']:.2f} "
            f"| {link(run['run_id'])} |"
        )
    lines += summary_champions_markdown(ranked)
    return "\n".join(lines) + "\n"


def _ui_url(tracking_uri: str | None, explicit: str | None) -> str | None:
    """Where the MLflow UI is: the explicit URL, $NEXTLOC_MLFLOW_UI_URL, or an http(s) tracking URI."""
    if explicit:
        return explicit
    if os.environ.get("NEXTLOC_MLFLOW_UI_URL"):
        return os.environ["NEXTLOC_MLFLOW_UI_URL"]
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    return uri if uri.startswith(("http://", "https://")) else None
