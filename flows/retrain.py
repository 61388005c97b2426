"""The ``retrain`` flow: merge new trajectory dumps, then rerun ``preprocess-train`` on what changed.

Scheduled (deployment ``retrain/geolife-dumps``) and on demand. New dumps in ``incoming_dir`` are merged
into the raw store ``raw_dir`` once each (a manifest of content fingerprints makes a repeat a no-op; a
dump that does not parse is quarantined with its reason). Then ``preprocess-train`` runs: its per-user
tasks are cached on each user's raw files, so only the users a dump touched are recomputed; the dataset
steps, training and the champion/challenger decision run again on the new data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from prefect import flow, get_run_logger
from pydantic import Field

from flows.pipeline import preprocess_train
from flows.train import DEFAULT_MODELS
from nextloc.raw.dumps import DEFAULT_MAX_BAD_ROW_SHARE
from nextloc.training.overrides import ModelOverrides, TrainOverrides
from runtime.locking import data_dir_lock
from tasks.dumps import merge_new_dumps
from tasks.promotion import DEFAULT_DECISION_METRIC, DecisionMetric
from tasks.train import ModelKind


@flow(name="retrain", flow_run_name="retrain {incoming_dir} -> {raw_dir}", validate_parameters=True)
def retrain(
    incoming_dir: str = "data/incoming",
    raw_dir: str = "data/raw/geolife",
    data_dir: str = "data/geolife",
    models: list[ModelKind] = DEFAULT_MODELS,
    seeds: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] = [0],  # noqa: B006
    model_overrides: ModelOverrides | None = None,
    train_overrides: TrainOverrides | None = None,
    decision_metric: DecisionMetric = DEFAULT_DECISION_METRIC,
    min_age_s: Annotated[float, Field(ge=0)] = 60.0,
    max_bad_row_share: Annotated[float, Field(ge=0, le=1)] = DEFAULT_MAX_BAD_ROW_SHARE,
    force: bool = False,
    tracking_uri: str | None = None,
    pipeline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Merge new dumps from ``incoming_dir`` into ``raw_dir``; if anything new arrived (or ``force``), retrain.

    Args:
        min_age_s: dumps changed more recently than this are left for the next run (a copy may be running).
        max_bad_row_share: a dump with a file that has more than this share of bad rows (or no valid row)
            is quarantined whole: the raw store is append-only.
        force: run ``preprocess-train`` even if no new file arrived.
        pipeline: any other ``preprocess-train`` parameter (``{"locations": {"epsilon_m": 50}}``).
    """
    logger = get_run_logger()
    staging = str(Path(data_dir) / "_dumps" / "staging")
    with data_dir_lock(raw_dir):  # one merger per raw store
        merged = merge_new_dumps(incoming_dir, raw_dir, staging, min_age_s, max_bad_row_share)
    if not merged["files_new"] and not force:
        logger.info("no new trajectory files (%d dumps seen); nothing to retrain", len(merged["dumps"]))
        return {"retrained": False, "merged": merged}
    logger.info("%d new files for users %s: retraining", merged["files_new"], merged["users"])
    result = preprocess_train(
        raw_dir=raw_dir,
        data_dir=data_dir,
        models=models,
        seeds=seeds,
        model_overrides=model_overrides,
        train_overrides=train_overrides,
        decision_metric=decision_metric,
        tracking_uri=tracking_uri,
        **(pipeline or {}),
    )
    return {"retrained": True, "merged": merged, **result}
