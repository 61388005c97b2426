"""Prefect task: train (or fit) one model for one seed, evaluate its best checkpoint, record it in MLflow.

The fitting itself is the library's (:mod:`nextloc.training.fit_kind`, which imports torch): the task imports it
only when it runs, so that importing this module (the flows, a cached run) imports no torch.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import pandas as pd
from prefect import get_run_logger, task
from pydantic import BaseModel, ConfigDict, Field

from nextloc.config import PreprocessConfig
from nextloc.evaluation.metrics import RESULT_KEYS, SET_KEYS
from nextloc.models import registry
from nextloc.preprocessing.sequences import SPLITS
from nextloc.raw.duplicates import copied_in_splits
from nextloc.storage import write_json, write_parquet, write_with
from nextloc.training.overrides import ModelOverrides, TrainOverrides
from runtime.caching import TASK_SOURCE, Artifact, ContentInputs
from runtime.catalog import Catalog
from tracking import mlflow_runs, versions
from tracking.mlflow_runs import SELECTED_EPOCH, selected_name
from tracking.plots import plot_per_user, plot_training_curves

if TYPE_CHECKING:
    from nextloc.evaluation.evaluate import Evaluation
    from nextloc.training.fit_kind import FittedKind

ModelKind = Literal[registry.kinds()]  # type: ignore[valid-type]  (validated by pydantic at the flow boundary)
DEFAULT_MODELS = list(registry.DEFAULT_KINDS)
Seed = Annotated[int, Field(ge=0)]


class TrainRun(BaseModel):
    """The ``training`` section of the flows: which models, how many seeds, on what.

    Attributes:
        models: the model kinds to train (empty: :data:`DEFAULT_MODELS`).
        seeds: one training per model and seed.
        model_overrides, train_overrides: keys of a neural kind's model config and training recipe
            (``{"mhsa": {"max_epochs": 2}}``, :mod:`nextloc.training.overrides`), checked when made.
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda``.
        workers: trainings at once on the local runner (processes).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: list[ModelKind] = Field(default_factory=lambda: list(DEFAULT_MODELS))
    seeds: Annotated[list[Seed], Field(min_length=1)] = Field(default_factory=lambda: [0])
    model_overrides: ModelOverrides | None = None
    train_overrides: TrainOverrides | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    workers: Annotated[int, Field(ge=1)] = 2


@dataclass(frozen=True)
class DataRef:
    """The preprocessed dataset a model is trained on (paths + content fingerprints)."""

    data_dir: str = field(metadata={"cache_key": False})  # where; what is in it: the artifacts
    samples: dict[str, Artifact]
    metadata: Artifact

    @property
    def fingerprint(self) -> str:
        """Content fingerprint of the samples and metadata."""
        return "-".join([self.metadata.fingerprint, *(self.samples[s].fingerprint for s in SPLITS)])


@dataclass(frozen=True)
class _Run:
    """One training run being recorded: its MLflow run, its folder, the kind and seed, what it trained on."""

    run_id: str
    run_dir: Path
    kind: str
    seed: int
    meta: dict[str, Any]
    catalog: Catalog
    data: DataRef


@dataclass(frozen=True)
class TrackingConfig:
    """Where runs go."""

    tracking_uri: str | None = None
    experiment: str = mlflow_runs.DEFAULT_EXPERIMENT


@task(
    name="train-model",
    task_run_name="train {kind} seed {seed}",
    cache_policy=TASK_SOURCE + ContentInputs(exclude=["parent_run_id"]),
    persist_result=True,
    retries=1,  # a retry resumes from the last completed epoch (see fit's resume state)
    retry_delay_seconds=5,
)
def train_model_task(
    kind: str,
    seed: int,
    data: DataRef,
    model_overrides: dict[str, Any],
    train_overrides: dict[str, Any],
    tracking_cfg: TrackingConfig,
    parent_run_id: str | None,
    device: str = "auto",
) -> dict[str, Any]:
    """Train ``kind`` with ``seed``; evaluate the best checkpoint on val and test; log everything to MLflow.

    Writes ``<data_dir>/results/<kind>/seed<seed>/``: ``results.json`` (test metrics in percent), each sample's
    outcomes on test and validation (``val_per_sample.parquet``: what :mod:`tasks.promotion` reads). A network
    keeps its resume state in ``checkpoints/`` there while it trains: a rerun after a crash continues from the
    last completed epoch (unless the model, overrides or data changed); it is deleted once all is recorded.
    """
    from nextloc.training import (
        fit_kind,  # torch: only when a model trains (a cached run reads its result back)
    )
    from nextloc.training.kernels import describe_device

    logger = get_run_logger()
    registry.kind(kind)  # an unknown kind fails here, before any work
    # On a CPU, one intra-op thread unless asked ($NEXTLOC_TORCH_THREADS): sums split over more threads round
    # differently, so a seed's weights would depend on --workers and on the machine's cores. Trainings run
    # side by side in processes; on one core each, the trainer's helper threads use the spare ones.
    threads = None if "num_threads" in train_overrides else int(os.environ.get("NEXTLOC_TORCH_THREADS", "1"))
    dev = fit_kind.training_device(device, threads)
    where = describe_device(dev)
    logger.info("%s seed %d trains on %s", kind, seed, where)
    meta = json.loads(Path(data.metadata.path).read_text())
    splits = fit_kind.load_splits({s: Path(data.samples[s].path) for s in SPLITS}, dev, kind)
    experiment_id = mlflow_runs.configure(tracking_cfg.tracking_uri, tracking_cfg.experiment)
    tags = {"model": kind, "seed": str(seed), **mlflow_runs.data_tags(data.fingerprint, data.metadata.path)}
    tags |= {"data_dir": data.data_dir, "device": where}
    catalog = Catalog(data.data_dir)
    run_dir = catalog.run_dir(kind, seed)
    with mlflow_runs.training_run(experiment_id, kind, seed, tags, parent_run_id) as run_id:
        samples = {s: (data.samples[s].path, data.samples[s].fingerprint) for s in SPLITS}
        mlflow_runs.log_split_inputs(Path(data.data_dir).name, samples)
        started = time.perf_counter()
        fitted = fit_kind.fit_kind(
            kind,
            seed,
            splits,
            meta,
            model_overrides=model_overrides,
            train_overrides=train_overrides,
            device=dev,
            checkpoint_dir=run_dir / "checkpoints",
            staypoints=catalog.staypoints,
            locations=catalog.vocabulary("locations"),
            located=catalog.located,
        )
        mlflow_runs.log_training(
            {"model": kind, "seed": seed, "device": str(dev), **fitted.params}, fitted.history
        )
        fitted_at = time.perf_counter()
        evaluation = fitted.evaluate(splits)
        stages = _stage_seconds(fitted, fitted_at - started, time.perf_counter() - fitted_at)
        _flag_copies(evaluation, catalog.staypoints, splits)
        # drop what only the evaluation read (its memory grows with the data)
        fitted, splits = fitted.answered(), None
        results_json = _results_json(fitted, evaluation, time.perf_counter() - started, run_id)
        results_json["stage_seconds"] = stages
        run = _Run(run_id, run_dir, kind, seed, meta, catalog, data)
        with tempfile.TemporaryDirectory() as tmp:  # the bundle, until MLflow has copied it
            fitted = _save_bundle(run, fitted, evaluation, Path(tmp) / "bundle")
            _record(run, fitted, evaluation, results_json, Path(tmp) / "bundle")
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # recorded: nothing left to resume
    _log_result(kind, seed, evaluation, fitted.selected_epoch)
    return {"kind": kind, "seed": seed, "run_id": run_id, "results": results_json}


def _log_result(kind: str, seed: int, evaluation: Evaluation, selected_epoch: int | None) -> None:
    get_run_logger().info(
        "%s seed %d: test place acc@1 %.2f place mrr %.2f new-place AUC %.1f (acc@1 %.2f mrr %.2f; selected epoch %s)",
        kind,
        seed,
        evaluation.test["place_acc@1"],
        evaluation.test["place_mrr"],
        evaluation.test.get("new_place_auc", float("nan")),
        evaluation.test["acc@1"],
        evaluation.test["mrr"],
        selected_epoch,
    )


def _flag_copies(evaluation: Evaluation, staypoints: Path, splits: dict[str, Any]) -> None:
    """Flag each validation and test sample whose target is a copy of another user's staypoint."""
    copied = copied_in_splits(staypoints, {split: splits[split].table for split in ("val", "test")})
    evaluation.val_copied, evaluation.test_copied = copied["val"], copied["test"]


def _stage_seconds(fitted: FittedKind, fit: float, evaluate: float) -> dict[str, float]:
    """Where a training's time went: ``build`` (a routine kind's questions and their candidates), ``fit``
    (the rest of fitting), ``evaluate``; :func:`_record` adds ``record`` (files, MLflow, the bundle)."""
    build = float(fitted.timing.get("build_seconds", 0.0))
    return {"build": round(build, 2), "fit": round(fit - build, 2), "evaluate": round(evaluate, 2)}


def _results_json(fitted: FittedKind, evaluation: Evaluation, seconds: float, run_id: str) -> dict[str, Any]:
    """``results.json`` before registration (test metrics in percent, the answer sets' coverage (%) and size,
    the validation metrics, timing, run id)."""
    return {
        **{k: evaluation.test[k] for k in RESULT_KEYS},
        **{k: evaluation.test[k] for k in SET_KEYS if k in evaluation.test},
        "n_test": evaluation.test["n"],
        **evaluation.dedup(),
        "n_params": fitted.n_params,
        SELECTED_EPOCH: fitted.selected_epoch,
        "refit_on_train_val": fitted.selection_model is not None,
        "val": evaluation.val,
        **({"past_places": evaluation.past_places} if evaluation.past_places is not None else {}),
        "target_in_history": evaluation.target_in_history,
        "train_seconds": round(seconds, 2),
        "resumed_from_epoch": int(fitted.timing.get("resumed_from_epoch", 0)),
        "mlflow_run_id": run_id,
    }


def _save_bundle(run: _Run, fitted: FittedKind, evaluation: Evaluation, folder: Path) -> FittedKind:
    """Write the model's bundle into ``folder`` (weights, config, vocabulary, new-place head, a routine kind's
    users' tally written index by index; nothing pickled); returns the fit without what only the bundle
    read (a routine kind's data: MLflow loads the bundle to check its input example, beside the fit)."""
    from nextloc.bundle import save_bundle  # torch: only when a model trains and is registered

    save_bundle(
        folder,
        run.kind,
        fitted.model,
        PreprocessConfig.model_validate(run.meta["config"]),
        head=evaluation.head,
        locations=_vocabulary(run.catalog, "locations"),
        users=_vocabulary(run.catalog, "users"),
        tally=fitted.tally_parts(),
    )
    return fitted.bundled()


def _vocabulary(catalog: Catalog, name: str) -> pd.DataFrame | None:
    path = catalog.vocabulary(name)
    return pd.read_parquet(path) if path.is_file() else None


def _record(
    run: _Run, fitted: FittedKind, evaluation: Evaluation, results_json: dict[str, Any], bundle: Path
) -> None:
    """Write the run's files, log them, register ``bundle``, log the test metrics linked to it and describe
    its version; ``results_json`` gains the model URI, the registered version and whether the bundle holds
    the users' tally.

    The metrics come after the model: MLflow links a run's step-0 metrics to a model logged after them by
    inserting them again, which a database store answers with a duplicate-key error (``metric_pk``).
    """
    run_dir, catalog, started = run.run_dir, run.catalog, time.perf_counter()
    write_json(results_json, run_dir / "results.json")
    write_json(evaluation.head.to_dict(), run_dir / "new_place_head.json")
    write_parquet(evaluation.per_sample("test"), run_dir / "test_per_sample.parquet")
    # validation's outcomes: what the champion rule reads (tasks/promotion.py)
    write_parquet(evaluation.per_sample("val"), run_dir / "val_per_sample.parquet")
    write_with(lambda tmp: evaluation.per_user.to_csv(tmp, index=False), run_dir / "per_user.csv")
    _log_artifacts(run, fitted, evaluation)
    for vocab in ("locations", "users"):  # what the model's ids mean (to score it on later data)
        if catalog.vocabulary(vocab).is_file():
            mlflow_runs.log_file_artifact(run.run_id, catalog.vocabulary(vocab), "vocabulary")
    model_uri, version, model_id = _log_bundle(run.kind, bundle, catalog)
    mlflow_runs.log_run_metrics(_flat_metrics(fitted, evaluation), model_id=model_id)
    holds_tally = run.kind in registry.kinds("routine")
    results_json.update({"model_uri": model_uri, "registered_version": version, "holds_tally": holds_tally})
    versions.describe_version(run.kind, version, run.seed, run.data.fingerprint, results_json)
    if "stage_seconds" in results_json:
        results_json["stage_seconds"]["record"] = round(time.perf_counter() - started, 2)
    write_json(results_json, run_dir / "results.json")


def _log_bundle(kind: str, bundle: Path, catalog: Catalog) -> tuple[str, str, str]:
    """Register ``bundle`` with a pyfunc that answers visits, a few real visits as its input example;
    returns ``(model_uri, version, model_id)``."""
    from nextloc.predict.answer import EXAMPLE_COLUMNS, example_visits  # torch: only when registered

    example, locations = None, _vocabulary(catalog, "locations")
    if locations is not None and catalog.staypoints.is_file():
        staypoints = pd.read_parquet(catalog.staypoints, columns=list(EXAMPLE_COLUMNS))
        example = example_visits(staypoints, locations)
    return versions.log_model(bundle, example, kind, _requirements())


def _flat_metrics(fitted: FittedKind, evaluation: Evaluation) -> dict[str, float]:
    """Everything logged once per run: ``test_*``; ``val_*_at_selected``, the validation metrics of the model
    chosen on validation (at ``selected_epoch``, the epoch the recipe's monitor chose: not necessarily the
    epoch where each metric peaked); ``best_val_loss``, the lowest validation loss of any epoch; timing."""
    flat = {f"test_{k}": v for k, v in evaluation.test.items() if k != "n"}
    flat.update({(k if k.startswith("n_") else f"test_{k}"): float(v) for k, v in evaluation.dedup().items()})
    flat.update({selected_name(k): v for k, v in evaluation.val.items() if k != "n"})
    flat["test_target_in_history"] = evaluation.target_in_history
    if fitted.selected_epoch is not None:
        flat[SELECTED_EPOCH] = float(fitted.selected_epoch)
        flat[selected_name("loss")] = fitted.history[fitted.selected_epoch - 1]["val_loss"]
        flat["best_val_loss"] = min(r["val_loss"] for r in fitted.history)
    flat.update({k: float(v) for k, v in fitted.timing.items()})
    flat["n_params"] = float(fitted.n_params)
    return {k: v for k, v in flat.items() if v == v}  # NaN (e.g. an undefined AUC) is not logged


def _log_artifacts(run: _Run, fitted: FittedKind, evaluation: Evaluation) -> None:
    run_id, run_dir, kind, seed = run.run_id, run.run_dir, run.kind, run.seed
    if fitted.history:
        plot_training_curves(fitted.history, run_dir / "training_curves.png", title=f"{kind} seed {seed}")
        mlflow_runs.log_file_artifact(run_id, run_dir / "training_curves.png")
    plot_per_user(
        evaluation.per_user,
        run_dir / "per_user_accuracy.png",
        title=f"{kind} seed {seed}: test place Acc@1 per user",
    )
    for name in (
        "per_user_accuracy.png",
        "results.json",
        "per_user.csv",
        "new_place_head.json",
        "test_per_sample.parquet",
        "val_per_sample.parquet",
    ):
        mlflow_runs.log_file_artifact(run_id, run_dir / name)


def _requirements() -> list[str]:
    from importlib.metadata import version

    return [
        f"torch=={version('torch').split('+')[0]}",
        f"numpy=={version('numpy')}",
        f"pandas=={version('pandas')}",
        f"safetensors=={version('safetensors')}",
        f"lightgbm=={version('lightgbm')}",
        f"nextloc=={version('nextloc')}",
    ]
