"""The ``retrain`` flow: merge new trajectory dumps, then rerun ``preprocess-train`` on what changed.

Scheduled (deployment ``retrain/geolife-dumps``) and on demand. New dumps in ``incoming_dir`` are merged
into the raw store ``raw_dir`` once each (a manifest of content fingerprints makes a repeat a no-op; a
dump that does not parse is quarantined with its reason). Then ``preprocess-train`` runs: its per-user
tasks are cached on each user's raw files, so only the users a dump touched are recomputed; the dataset
steps, training and the champion/challenger decision run again on the new data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger

from flows.pipeline import preprocess_train
from nextloc.config import PreprocessConfig
from runtime.locking import data_dir_lock
from runtime.runners import Runner
from runtime.sections import moved, sectioned_flow
from tasks.dumps import DumpIntake, merge_new_dumps
from tasks.promotion import PromotionRule
from tasks.train import TrainRun
from tracking.settings import Tracking

#: The flat parameters of ``retrain`` before its sections, and where each went.
RENAMED = {
    **moved("training", ("models", "seeds", "model_overrides", "train_overrides")),
    **moved("promotion", ("decision_metric",)),
    **moved("intake", DumpIntake.model_fields),
    **moved("tracking", ("tracking_uri",)),
    "pipeline": "one of retrain's sections (preprocess, training, promotion, runner, tracking)",
}


@sectioned_flow(
    RENAMED, name="retrain", flow_run_name="retrain {incoming_dir} -> {raw_dir}", validate_parameters=True
)
def retrain(
    incoming_dir: str = "data/incoming",
    raw_dir: str = "data/raw/geolife",
    data_dir: str = "data/geolife",
    input_timezone: str = "UTC",
    intake: DumpIntake = DumpIntake(),
    preprocess: PreprocessConfig = PreprocessConfig(),
    training: TrainRun = TrainRun(),
    promotion: PromotionRule = PromotionRule(),
    runner: Runner = Runner(),
    tracking: Tracking = Tracking(),
) -> dict[str, Any]:
    """Merge new dumps from ``incoming_dir`` into ``raw_dir``; if anything new arrived (or ``intake.force``),
    retrain.

    ``intake`` (:class:`tasks.dumps.DumpIntake`) says which dumps are merged; ``input_timezone`` and the
    sections ``preprocess``, ``training``, ``promotion``, ``runner`` and ``tracking`` go to
    ``preprocess-train`` as they are (:func:`flows.pipeline.preprocess_train`).
    """
    logger = get_run_logger()
    staging = str(Path(data_dir) / "_dumps" / "staging")
    with data_dir_lock(raw_dir):  # one merger per raw store
        merged = merge_new_dumps(incoming_dir, raw_dir, staging, intake.min_age_s, intake.max_bad_row_share)
    if not merged["files_new"] and not intake.force:
        logger.info("no new trajectory files (%d dumps seen); nothing to retrain", len(merged["dumps"]))
        return {"retrained": False, "merged": merged}
    logger.info("%d new files for users %s: retraining", merged["files_new"], merged["users"])
    result = preprocess_train(
        raw_dir=raw_dir,
        data_dir=data_dir,
        input_timezone=input_timezone,
        preprocess=preprocess,
        training=training,
        promotion=promotion,
        runner=runner,
        tracking=tracking,
    )
    return {"retrained": True, "merged": merged, **result}
