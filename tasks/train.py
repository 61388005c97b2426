"""Prefect task: train (or fit) one model for one seed, evaluate its best checkpoint, record it in MLflow."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import torch
from prefect import get_run_logger, task

from nextloc.baselines import BaselineModule
from nextloc.config import PreprocessConfig
from nextloc.data import SampleTensors
from nextloc.duplicates import copied_samples
from nextloc.evaluate import Evaluation, evaluate, model_scores
from nextloc.metrics import RESULT_KEYS
from nextloc.models import build_model, count_parameters, model_settings, registry
from nextloc.predict import example_visits
from nextloc.ranking import RoutineData
from nextloc.sequences import SPLITS
from nextloc.serving import save_bundle
from nextloc.storage import write_json, write_parquet, write_with
from nextloc.train import TrainConfig, fit_model, fit_seed_ensemble, resolve_device
from tasks import tracking, versions
from tasks.caching import TASK_SOURCE, Artifact, ContentInputs
from tasks.catalog import Catalog
from tasks.plots import plot_per_user, plot_training_curves
from tasks.tracking import SELECTED_EPOCH, selected_name

ModelKind = Literal[registry.kinds()]  # type: ignore[valid-type]  (validated by pydantic at the flow boundary)


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
class TrackingConfig:
    """Where runs go."""

    tracking_uri: str | None = None
    experiment: str = tracking.DEFAULT_EXPERIMENT


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

    Writes ``<data_dir>/results/<kind>/seed<seed>/results.json`` (test metrics in percent). Neural training
    keeps its resume state in ``<data_dir>/results/<kind>/seed<seed>/checkpoints/`` while it runs, so a
    rerun after a crash continues from the last completed epoch (and is ignored, restarting from scratch,
    if the model, training overrides or data changed); the folder is deleted once the run is fully recorded.
    """
    logger, entry = get_run_logger(), registry.kind(kind)
    dev = resolve_device(device)
    if dev.type == "cpu" and "num_threads" not in train_overrides:
        # One intra-op thread unless asked ($NEXTLOC_TORCH_THREADS): sums split over more threads round
        # differently, so a seed's weights would depend on --workers and on the machine's cores. Trainings
        # run side by side in processes; on one core each, the trainer's helper threads use the spare ones.
        torch.set_num_threads(int(os.environ.get("NEXTLOC_TORCH_THREADS", "1")))
    meta = json.loads(Path(data.metadata.path).read_text())
    splits = {s: SampleTensors.from_parquet(Path(data.samples[s].path), dev) for s in SPLITS}
    vocab = {"total_loc_num": meta["total_loc_num"], "total_user_num": meta["total_user_num"]}
    experiment_id = tracking.configure(tracking_cfg.tracking_uri, tracking_cfg.experiment)
    tags = {"model": kind, "seed": str(seed), "data_fingerprint": data.fingerprint, "data_dir": data.data_dir}
    catalog = Catalog(data.data_dir)
    run_dir = catalog.run_dir(kind, seed)
    with tracking.training_run(experiment_id, kind, seed, tags, parent_run_id) as run_id:
        samples = {s: (data.samples[s].path, data.samples[s].fingerprint) for s in SPLITS}
        tracking.log_split_inputs(Path(data.data_dir).name, samples)
        started = time.perf_counter()
        if entry.is_neural:
            overrides = (model_overrides, train_overrides)
            result = _train_neural(kind, seed, splits, vocab, meta, *overrides, dev, run_dir / "checkpoints")
        elif entry.family == "routine":
            result = _fit_routine(kind, seed, splits, vocab, meta, catalog)
        else:
            result = _fit_baseline(kind, splits, vocab)
        tracking.log_training(
            {"model": kind, "seed": seed, "device": str(dev), **result["params"]}, result["history"]
        )
        # the model chosen on validation gives the validation metrics; the tested one may be a refit on train + val
        evaluation = evaluate(val=splits["val"], test=splits["test"], **_scoring(result))
        evaluation.test_copied = copied_samples(catalog.staypoints, splits["test"].table)
        results_json = _results_json(result, evaluation, time.perf_counter() - started, run_id)
        _record(run_id, run_dir, result, evaluation, kind, seed, meta, catalog, data, results_json)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # recorded: nothing left to resume
    logger.info(
        "%s seed %d: test place acc@1 %.2f place mrr %.2f new-place AUC %.1f (acc@1 %.2f mrr %.2f; selected epoch %s)",
        kind,
        seed,
        evaluation.test["place_acc@1"],
        evaluation.test["place_mrr"],
        evaluation.test.get("new_place_auc", float("nan")),
        evaluation.test["acc@1"],
        evaluation.test["mrr"],
        result["selected_epoch"],
    )
    return {"kind": kind, "seed": seed, "run_id": run_id, "results": results_json}


def _results_json(
    result: dict[str, Any], evaluation: Evaluation, seconds: float, run_id: str
) -> dict[str, Any]:
    """``results.json`` before registration (test metrics in percent, the validation ones, timing, run id)."""
    return {
        **{k: evaluation.test[k] for k in RESULT_KEYS},
        "n_test": evaluation.test["n"],
        **evaluation.dedup(),
        "n_params": result["n_params"],
        SELECTED_EPOCH: result["selected_epoch"],
        "refit_on_train_val": result["selection_model"] is not None,
        "val": evaluation.val,
        "target_in_history": evaluation.target_in_history,
        "train_seconds": round(seconds, 2),
        "resumed_from_epoch": int(result["timing"].get("resumed_from_epoch", 0)),
        "mlflow_run_id": run_id,
    }


def _record(
    run_id,
    run_dir: Path,
    result,
    evaluation: Evaluation,
    kind,
    seed,
    meta,
    catalog: Catalog,
    data,
    results_json,
):
    """Write the run's files, log them, register the bundle, log the test metrics linked to it and describe
    its version; ``results_json`` gains the model URI, the registered version and whether the bundle holds
    the users' profile.

    The metrics come after the model: MLflow links a run's step-0 metrics to a model logged after them by
    inserting them again, which a database store answers with a duplicate-key error (``metric_pk``).
    """
    write_json(results_json, run_dir / "results.json")
    write_json(evaluation.head.to_dict(), run_dir / "new_place_head.json")
    write_parquet(evaluation.per_sample(), run_dir / "test_per_sample.parquet")
    write_with(lambda tmp: evaluation.per_user.to_csv(tmp, index=False), run_dir / "per_user.csv")
    _log_artifacts(run_id, run_dir, result, evaluation, kind, seed)
    for vocab in ("locations", "users"):  # what the model's ids mean (to score it on later data)
        if catalog.vocabulary(vocab).is_file():
            tracking.log_file_artifact(run_id, catalog.vocabulary(vocab), "vocabulary")
    profile = result["routine_data"].routine.profile() if "routine_data" in result else None
    model_uri, version, model_id = _log_bundle(kind, result["model"], meta, evaluation, catalog, profile)
    tracking.log_run_metrics(_flat_metrics(result, evaluation), model_id=model_id)
    results_json.update(
        {"model_uri": model_uri, "registered_version": version, "holds_profile": profile is not None}
    )
    versions.describe_version(kind, version, seed, data.fingerprint, results_json)
    write_json(results_json, run_dir / "results.json")


def _train_neural(
    kind, seed, splits, vocab, meta, model_overrides, train_overrides, dev, checkpoint_dir: Path
) -> dict[str, Any]:
    """Train a neural ``kind`` (a seed ensemble: its members), resuming from (and writing) ``checkpoint_dir``."""
    entry = registry.kind(kind)
    member_kind, size = entry.trained.name, entry.size
    overrides = dict(model_overrides)
    if "max_seq_len" in model_settings(member_kind):  # the longest history of this dataset
        overrides.setdefault("max_seq_len", int(meta["max_hist_len"]) + 10)

    def build(model_seed: int = seed) -> torch.nn.Module:
        torch.manual_seed(model_seed)
        return build_model(member_kind, vocab["total_loc_num"], vocab["total_user_num"], **overrides).to(dev)

    cfg = TrainConfig.for_recipe(member_kind, seed=seed, **train_overrides)
    log_prob = entry.trained.log_prob_output
    if size:
        model, members = fit_seed_ensemble(
            build,
            splits["train"],
            splits["val"],
            cfg,
            size,
            log_prob_output=log_prob,
            checkpoint_dir=checkpoint_dir,
        )
        selection, refit, runs = members[0], None, members
        params = {"ensemble.member_kind": member_kind, "ensemble.size": size}
        params["ensemble.member_selected_epochs"] = ",".join(str(r.best_epoch) for r in members)
    else:
        selection, refit = fit_model(
            build,
            splits["train"],
            splits["val"],
            cfg,
            log_prob_output=log_prob,
            checkpoint_dir=checkpoint_dir,
        )
        model, runs, params = (refit or selection).model, [selection, *([refit] if refit else [])], {}
    model_cfg = getattr(selection.model, "config", None)
    params.update({f"model.{k}": v for k, v in (asdict(model_cfg) if model_cfg is not None else {}).items()})
    params.update({f"train.{k}": v for k, v in cfg.model_dump().items()})
    timing = {
        "train_seconds": sum(r.train_seconds for r in runs),
        "seconds_to_best": selection.seconds_to_best,
        "train_samples_per_s": selection.train_samples_per_s,
        # > 0 when a crashed attempt's checkpoint was resumed (the results are those of an uninterrupted run)
        "resumed_from_epoch": float(max(r.resumed_from_epoch for r in runs)),
    }
    return {
        "model": model,
        "selection_model": selection.model if refit else None,
        "history": selection.history,
        "selected_epoch": selection.best_epoch,
        "params": params,
        "n_params": count_parameters(model),
        "timing": timing,
        "log_prob": entry.log_prob_output,
    }


def _log_bundle(kind: str, model, meta: dict, evaluation: Evaluation, catalog: Catalog, profile=None):
    """Register the model as a bundle (weights, config, vocabulary, new-place head, a routine kind's users'
    profile; nothing pickled) with a pyfunc that answers visits; returns ``(model_uri, version, model_id)``."""
    vocab = {
        name: pd.read_parquet(catalog.vocabulary(name)) if catalog.vocabulary(name).is_file() else None
        for name in ("locations", "users")
    }
    example = None
    if vocab["locations"] is not None and catalog.staypoints.is_file():
        example = example_visits(pd.read_parquet(catalog.staypoints), vocab["locations"])
    with tempfile.TemporaryDirectory() as tmp:
        bundle = save_bundle(
            Path(tmp) / "bundle",
            kind,
            model,
            PreprocessConfig.model_validate(meta["config"]),
            head=evaluation.head,
            locations=vocab["locations"],
            users=vocab["users"],
            profile=profile,
        )
        return versions.log_model(bundle, example, kind, _requirements())


def _scoring(result: dict[str, Any]) -> dict[str, Any]:
    """:func:`nextloc.evaluate.evaluate`'s scorers for a fitted model: its own, or (routine kinds) the
    answers computed for every question of the split beforehand."""
    if "scoring" in result:
        return result["scoring"]
    return {
        "val_scores": model_scores(result["selection_model"] or result["model"]),
        "test_scores": model_scores(result["model"]),
    }


def _fit_routine(kind, seed, splits, vocab, meta, catalog: Catalog) -> dict[str, Any]:
    """Fit a routine kind (:mod:`nextloc.ranking`) on the dataset's staypoints and each split's questions."""
    data = RoutineData.build(
        pd.read_parquet(catalog.staypoints),
        pd.read_parquet(catalog.vocabulary("locations")),
        splits,
        vocab["total_loc_num"],
        PreprocessConfig.model_validate(meta["config"]).timezone,
    )
    model = data.fit(kind, seed)

    def rows_of(split: str):
        answers = torch.from_numpy(data.log_probabilities(model, split))
        return lambda batch: answers[batch.index.cpu()].to(batch.loc.device)

    val_scores, test_scores = rows_of("val"), rows_of("test")
    params = {f"{kind}.weight.{k}": v for k, v in getattr(model, "weights", {}).items()}
    if kind == "ranker":
        params.update({"ranker.seed": seed, "ranker.trees": model.best_iteration})
    return {
        "model": model,
        "routine_data": data,
        "selection_model": None,
        "history": [],
        "selected_epoch": None,
        "params": params,
        "n_params": 0,
        "timing": {},
        "log_prob": True,
        "scoring": {
            "val_scores": val_scores,
            "test_scores": test_scores,
            "head_val_scores": val_scores,
            "explore": (data.candidates["val"].explore, data.candidates["test"].explore),
        },
    }


def _fit_baseline(kind, splits, vocab) -> dict[str, Any]:
    baseline = registry.kind(kind).model_class(vocab["total_loc_num"]).fit(splits["train"])
    return {
        "model": BaselineModule(baseline),
        "selection_model": None,
        "history": [],
        "selected_epoch": None,
        "params": {},
        "n_params": 0,
        "timing": {},
        "log_prob": False,
    }


def _flat_metrics(result: dict[str, Any], evaluation: Evaluation) -> dict[str, float]:
    """Everything logged once per run: ``test_*``; ``val_*_at_selected``, the validation metrics of the model
    chosen on validation (at ``selected_epoch``, the epoch the recipe's monitor chose: not necessarily the
    epoch where each metric peaked); ``best_val_loss``, the lowest validation loss of any epoch; timing."""
    flat = {f"test_{k}": v for k, v in evaluation.test.items() if k != "n"}
    flat.update({(k if k.startswith("n_") else f"test_{k}"): float(v) for k, v in evaluation.dedup().items()})
    flat.update({selected_name(k): v for k, v in evaluation.val.items() if k != "n"})
    flat["test_target_in_history"] = evaluation.target_in_history
    if result["selected_epoch"] is not None:
        flat[SELECTED_EPOCH] = float(result["selected_epoch"])
        flat[selected_name("loss")] = result["history"][result["selected_epoch"] - 1]["val_loss"]
        flat["best_val_loss"] = min(r["val_loss"] for r in result["history"])
    flat.update({k: float(v) for k, v in result["timing"].items()})
    flat["n_params"] = float(result["n_params"])
    return {k: v for k, v in flat.items() if v == v}  # NaN (e.g. an undefined AUC) is not logged


def _log_artifacts(run_id: str, run_dir: Path, result, evaluation: Evaluation, kind: str, seed: int) -> None:
    if result["history"]:
        plot_training_curves(result["history"], run_dir / "training_curves.png", title=f"{kind} seed {seed}")
        tracking.log_file_artifact(run_id, run_dir / "training_curves.png")
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
    ):
        tracking.log_file_artifact(run_id, run_dir / name)


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
