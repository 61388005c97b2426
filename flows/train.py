"""The ``train`` flow: every configured model x seed on a preprocessed dataset, tracked in MLflow."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefect import get_run_logger
from prefect.runtime import flow_run

from nextloc.evaluation.leaderboard import leaderboard
from nextloc.evaluation.metrics import HEADLINE
from nextloc.fingerprint import hash_file
from nextloc.preprocessing.sequences import SPLITS
from nextloc.training.overrides import resolve_overrides
from runtime.caching import Artifact
from runtime.catalog import Catalog, require_preprocessed
from runtime.locking import data_dir_lock
from runtime.reuse import Decisions, Settled, Trainings
from runtime.runners import training_runner
from runtime.sections import moved, sectioned_flow
from tasks.promotion import PromotionRule, champion_challenger
from tasks.train import DEFAULT_MODELS, DataRef, TrackingConfig, TrainRun, train_model_task
from tracking import mlflow_runs
from tracking.plots import log_comparison
from tracking.settings import Tracking, default_tracking_uri
from tracking.versions import champion_versions

__all__ = ["DEFAULT_MODELS", "dataset_ref", "train"]

#: The flat parameters of the ``train`` flow before its sections, and where each went.
RENAMED = {
    **moved("training", ("models", "seeds", "model_overrides", "train_overrides", "device")),
    **moved("promotion", PromotionRule.model_fields),
    **moved("tracking", ("tracking_uri", "experiment")),
}


@sectioned_flow(
    RENAMED,
    name="train",
    flow_run_name="train {training.models} seeds {training.seeds}",
    validate_parameters=True,
    task_runner=training_runner(1),
)
def train(
    data_dir: str = "data/geolife",
    training: TrainRun = TrainRun(),
    promotion: PromotionRule = PromotionRule(),
    tracking: Tracking = Tracking(),
    promote: bool = True,
) -> dict[str, Any]:
    """Train, evaluate (best checkpoint) and register each model; decide each kind's champion.

    One MLflow parent run per flow run, one child run per model and seed; a rerun with nothing new (every
    training cached, every champion where its decision left it) adds none and names the parent run that
    holds its results (:class:`runtime.reuse.Trainings`). Each kind's champion is decided by
    the one champion rule (:mod:`tasks.promotion`), unless ``promote=False``. Each (model, seed) task is
    cached on the samples' content fingerprint, its configuration and the code. Trainings run in worker
    processes (``with_options(task_runner=training_runner(n))`` runs ``n`` at once;
    separate processes keep each seed's random streams its own), or one task each on a Dask cluster
    (:func:`runtime.runners.make_training_runner`: the same results). On a CPU each uses one intra-op thread:
    these small models train about twice as fast that way. Overrides (:mod:`nextloc.training.overrides`) are
    checked before any work. ``training.workers`` is for the caller's runner
    (:meth:`runtime.runners.Runner.trainings`); ``tracking.mlflow_ui_url`` is for the pipeline's summary.
    """
    overrides = resolve_overrides(training.model_overrides, training.train_overrides)  # before any work
    models, seeds = list(training.models) or DEFAULT_MODELS, list(training.seeds)
    with data_dir_lock(data_dir):  # one writer per data directory
        data = dataset_ref(data_dir)
        tracking_cfg = TrackingConfig(tracking.tracking_uri, tracking.experiment)
        calls = _training_calls(models, seeds, data, overrides, training.device, tracking_cfg)
        trainings = Trainings.look_up(train_model_task, calls, Catalog(data.data_dir))
        decided = list(dict.fromkeys(models)) if promote else []  # the kinds whose champion is decided
        uri = tracking.tracking_uri or default_tracking_uri()
        decisions = Decisions(promotion, decided, uri, tracking.experiment, champion_versions)
        settled = trainings.settled(decisions)
        if settled is not None:  # nothing new: the results are on the parent run that recorded them
            results = trainings.cached_results()
            outcome = {
                "parent_run_id": settled.parent_run_id,
                "promotion": settled.promotion,
                "settled": True,
                "experiment_id": settled.experiment_id,
            }
        else:
            outcome, results = _record_and_decide(
                trainings, promotion, decided, data, tracking_cfg, models, seeds
            )
            settled = Settled(outcome["parent_run_id"], outcome["experiment_id"], outcome["promotion"])
            trainings.remember(results, decisions, settled)
        board = leaderboard([(r["kind"], r["results"]) for r in results])
        _log_outcome(board, outcome)
        return {**outcome, "leaderboard": board, "runs": results, "data": data}


def _training_calls(
    models: list[str],
    seeds: list[int],
    data: DataRef,
    overrides: tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]],
    device: str,
    tracking_cfg: TrackingConfig,
) -> list[dict[str, Any]]:
    """The training task's parameters for each model x seed, in that order (``overrides``: the per-kind model
    and training overrides, :func:`nextloc.training.overrides.resolve_overrides`)."""
    per_kind_model, per_kind_train = overrides
    return [
        {
            "kind": kind,
            "seed": seed,
            "data": data,
            "model_overrides": per_kind_model.get(kind, {}),
            "train_overrides": per_kind_train.get(kind, {}),
            "tracking_cfg": tracking_cfg,
            "parent_run_id": None,  # not in the cache key; set once a parent run is needed
            "device": device,
        }
        for kind in models
        for seed in seeds
    ]


def _record_and_decide(
    trainings: Trainings,
    rule: PromotionRule,
    decided: list[str],
    data: DataRef,
    tracking_cfg: TrackingConfig,
    models: list[str],
    seeds: list[int],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A parent run holding the trainings (the cached ones read back), each kind's champion decision, the
    leaderboard and its chart: ``({parent_run_id, promotion, experiment_id, settled: False}, results)``."""
    experiment_id = mlflow_runs.configure(tracking_cfg.tracking_uri, tracking_cfg.experiment)
    parent_tags = {**mlflow_runs.data_tags(data.fingerprint, data.metadata.path), **_prefect_tags()}
    parent_params = {"models": ",".join(models), "seeds": ",".join(map(str, seeds))}
    name = mlflow_runs.parent_run_name(datetime.now(UTC), models)
    with mlflow_runs.parent_run(experiment_id, name, parent_tags, parent_params) as parent_id:
        results = trainings.run(parent_run_id=parent_id)
        board = leaderboard([(r["kind"], r["results"]) for r in results])
        decisions = {
            kind: champion_challenger(kind, results, data, rule, tracking_cfg, parent_id) for kind in decided
        }
        mlflow_runs.log_leaderboard(parent_id, board, results, decisions)
        log_comparison(parent_id, board)
    outcome = {"parent_run_id": parent_id, "promotion": decisions, "experiment_id": experiment_id}
    return {**outcome, "settled": False}, results


def _log_outcome(board: dict[str, Any], outcome: dict[str, Any]) -> None:
    logger = get_run_logger()
    if outcome["settled"]:
        logger.info(
            "nothing new: every training cached and every champion as decided; the results are on MLflow "
            "parent run %s (no new parent run)",
            outcome["parent_run_id"],
        )
    logger.info(
        "leaderboard (test %s): %s",
        HEADLINE,
        {k: round(v[HEADLINE]["mean"], 2) for k, v in board.items()},
    )


def _prefect_tags() -> dict[str, str]:
    """The Prefect flow run behind the parent run: ids, name and UI links (the root flow run too, e.g. the
    ``preprocess-train`` run that holds the summary artifact, when this flow runs inside it)."""
    from prefect.utilities.urls import url_for

    run_id = flow_run.get_id()
    if not run_id:
        return {}
    tags = {"prefect.flow_run_id": str(run_id), "prefect.flow_run_name": str(flow_run.get_name() or "")}
    root_id = str(flow_run.get_root_flow_run_id() or run_id)
    if root_id != str(run_id):
        tags["prefect.root_flow_run_id"] = root_id
    for key, value in (("prefect.flow_run_url", run_id), ("prefect.root_flow_run_url", root_id)):
        url = url_for("flow-run", obj_id=value)
        if url and (key == "prefect.flow_run_url" or root_id != str(run_id)):
            tags[key] = url
    return tags


def dataset_ref(data_dir: str) -> DataRef:
    """Describe the preprocessed dataset under ``data_dir`` (fails clearly if preprocessing has not run)."""
    catalog = require_preprocessed(data_dir)
    samples = {s: Artifact.record(catalog.samples(s), hash_file(catalog.samples(s))) for s in SPLITS}
    return DataRef(str(catalog.root), samples, Artifact.record(catalog.metadata, hash_file(catalog.metadata)))
