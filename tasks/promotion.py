"""Champion / challenger: move the ``champion`` alias only to a model that is better on the same test split.

The challenger is this run's best version of a model kind (on the validation metric used for selection).
The champion is the version holding the ``champion`` alias. Both are scored on the test split of the
current dataset: the challenger was trained on it; a champion trained on earlier data reads the same
samples translated into its own location and user ids (``nextloc.vocabulary``; locations it never saw are
unseen to it, like any unseen test location). The alias moves only if the challenger is strictly better on
the decision metric, and the decision (both scores) is recorded on the MLflow parent run.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pyarrow.parquet as pq
from prefect import get_run_logger, task

from nextloc.data import SampleTensors
from nextloc.metrics import evaluate_scores
from nextloc.vocabulary import translate_samples
from tasks import tracking
from tasks.catalog import Catalog
from tasks.evaluate import load_scorer, pack_batch
from tasks.train import DataRef, TrackingConfig, mlflow_name


@task(name="champion-challenger", task_run_name="champion vs challenger: {kind}")
def champion_challenger(
    kind: str,
    runs: list[dict[str, Any]],
    data: DataRef,
    decision_metric: str,
    select_metric: str,
    tracking_cfg: TrackingConfig,
    parent_run_id: str,
    match_radius_m: float = 50.0,
) -> dict[str, Any]:
    """Score this run's best ``kind`` (challenger) and the ``champion`` on the current test split; decide.

    Returns:
        The decision: ``promoted`` (bool), ``reason``, both versions and both scores.
    """
    logger = get_run_logger()
    tracking.configure(tracking_cfg.tracking_uri, tracking_cfg.experiment)
    client = tracking.MlflowClient()
    name = tracking.registered_name(kind)
    mine = [r for r in runs if r["kind"] == kind and r["results"].get("registered_version")]
    if not mine:
        return {"promoted": False, "reason": f"no registered {kind} version in this run"}
    challenger = max(
        mine,
        key=lambda r: client.get_run(r["run_id"]).data.metrics.get(mlflow_name(select_metric), float("-inf")),
    )
    decision: dict[str, Any] = {
        "metric": f"test {decision_metric}",
        "challenger_version": str(challenger["results"]["registered_version"]),
        "challenger_run_id": challenger["run_id"],
        "challenger_score": float(challenger["results"][decision_metric]),
    }
    champion = None
    with contextlib.suppress(mlflow.exceptions.MlflowException):
        champion = client.get_model_version_by_alias(name, tracking.CHAMPION)
    if champion is None:
        decision.update(promoted=True, reason="no champion yet")
    elif str(champion.version) == str(decision["challenger_version"]):
        decision.update(promoted=False, reason="the challenger already is the champion (cached training)")
    else:
        decision["champion_version"] = str(champion.version)
        decision["champion_run_id"] = champion.run_id
        score, how = _score_champion(kind, champion, data, decision_metric, match_radius_m, tracking_cfg)
        decision["champion_scored_on"] = how
        if score is None:
            decision.update(promoted=True, reason=f"the champion cannot be scored on this test split ({how})")
        else:
            decision["champion_score"] = score
            better = decision["challenger_score"] > score
            decision.update(
                promoted=better,
                reason=f"challenger {'better' if better else 'not better'} on test {decision_metric}: "
                f"{decision['challenger_score']:.2f} vs {score:.2f}",
            )
    if decision["promoted"]:
        client.set_registered_model_alias(name, tracking.CHAMPION, decision["challenger_version"])
    _record(client, parent_run_id, kind, decision)
    logger.info("%s: %s -> %s", name, decision["reason"], "promoted" if decision["promoted"] else "kept")
    return decision


def _score_champion(
    kind: str, champion, data: DataRef, metric: str, radius_m: float, tracking_cfg: TrackingConfig
) -> tuple[float | None, str]:
    """The champion's ``metric`` (%) on the current test split, and how it was obtained."""
    client = tracking.MlflowClient()
    run = client.get_run(champion.run_id)
    if run.data.tags.get("data_fingerprint") == data.fingerprint:
        value = run.data.metrics.get(f"test_{mlflow_name(metric)}")
        return (float(value), "its own run: same dataset") if value is not None else (None, "no test metric")
    catalog = Catalog(data.data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            folder = Path(
                mlflow.artifacts.download_artifacts(
                    run_id=champion.run_id, artifact_path="vocabulary", dst_path=tmp
                )
            )
        except (mlflow.exceptions.MlflowException, OSError) as err:
            return None, f"its run has no vocabulary artifact ({err.__class__.__name__})"
        table, stats = translate_samples(
            pq.read_table(catalog.samples("test")),
            pd.read_parquet(catalog.vocabulary("locations")),
            pd.read_parquet(folder / "locations.parquet"),
            pd.read_parquet(catalog.vocabulary("users")),
            pd.read_parquet(folder / "users.parquet"),
            radius_m,
        )
    scorer = load_scorer(kind, str(champion.version), tracking_cfg.tracking_uri, tracking_cfg.experiment)
    samples = SampleTensors(table)
    metrics, _ = evaluate_scores(lambda batch: scorer(pack_batch(batch)), samples, batch_size=512)
    how = f"test split translated into its ids (locations matched within {radius_m:g} m): " + ", ".join(
        f"{k} {v:.1f}" for k, v in stats.items()
    )
    return float(metrics[metric]), how


def _record(client, parent_run_id: str, kind: str, decision: dict[str, Any]) -> None:
    """Both scores as metrics, the decision as tags and a JSON artifact, on the parent run."""
    prefix = f"champion_challenger.{kind}"
    metric = decision.get("metric", "").replace("test ", "")
    for role in ("challenger", "champion"):
        if f"{role}_score" in decision:
            client.log_metric(
                parent_run_id, f"{prefix}.{role}_test_{mlflow_name(metric)}", decision[f"{role}_score"]
            )
    client.set_tag(parent_run_id, f"{prefix}.decision", "promoted" if decision["promoted"] else "kept")
    client.set_tag(parent_run_id, f"{prefix}.reason", decision["reason"][:500])
    tracking.log_dict_artifact(parent_run_id, decision, f"champion_challenger_{kind}.json")
    if decision.get("challenger_run_id"):
        client.set_tag(decision["challenger_run_id"], "champion_challenger", decision["reason"][:500])
