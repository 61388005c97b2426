"""One model kind fitted for one seed, whatever its family, and the scorers it is evaluated with.

The family dispatch of the train task (``tasks/train.py``, which keeps the caching, the files and MLflow):
a network or a seed ensemble of them is trained by :func:`nextloc.training.train.fit_model` /
:func:`nextloc.training.train.fit_seed_ensemble` (resuming from, and writing, a checkpoint folder); a routine kind
(:mod:`nextloc.routine.ranking`) is fitted on the dataset's staypoints and each split's questions; a baseline
(:mod:`nextloc.models.baselines`) counts the training samples. Each gives one :class:`FittedKind`.

This module imports torch; the train task imports it only when a model trains (a cached run does not).
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from nextloc.config import PreprocessConfig
from nextloc.evaluation.evaluate import Evaluation, ScoreFn, evaluate, model_scores, retest, routine_scores
from nextloc.models import build_model, count_parameters, model_settings, registry
from nextloc.models.baselines import BaselineModule
from nextloc.models.batch import SampleTensors
from nextloc.models.registry import training_recipe
from nextloc.preprocessing.sequences import SPLITS
from nextloc.routine.data import MIN_PAST_VISITS, RoutineData, read_located, read_staypoints
from nextloc.routine.ranking import RoutineRanker
from nextloc.training.train import fit_model, fit_seed_ensemble, resolve_device

# the metrics the head's reading changes: the DBSCAN effect's row (Scorers.past_places_explore)
PAST_PLACES_KEYS = ("acc@1", "mrr", "new_place_auc", "new_place_brier")
ROUTINE_TRAIN_COLUMNS = ("staypoint_id",)  # what a routine kind reads of train's samples (with the ids)


@dataclass(frozen=True)
class Scorers:
    """What :func:`nextloc.evaluation.evaluate.evaluate` scores a fitted kind with (its arguments of the same names)."""

    val_scores: ScoreFn
    test_scores: ScoreFn
    head_val_scores: ScoreFn | None = None
    explore: tuple[np.ndarray, np.ndarray] | None = None
    joint: bool = False  # score one distribution over the places and "a new place" (routine kinds)
    windows: tuple[np.ndarray, np.ndarray] | None = None  # val's and test's windows anchored at now
    # the explore features with the share over the unseen places that have at least MIN_PAST_VISITS visits
    # before now: evaluated beside the headline as Evaluation.past_places (docs/protocol.md)
    past_places_explore: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(frozen=True)
class FittedKind:
    """A kind fitted for one seed.

    Attributes:
        model: what is tested and registered (a network, a seed ensemble, a baseline's module, a routine model).
        params: what the run logs as parameters (the model's and the recipe's config, a routine's weights, ...).
        history: the selected training's epochs (networks; empty otherwise).
        selected_epoch: the epoch chosen on validation (networks; None otherwise).
        selection_model: the model chosen on validation when ``model`` is a refit on train + val, else None.
        n_params: trainable parameters of ``model``.
        timing: training seconds, samples per second, the epoch a crashed attempt was resumed from.
        routine_data: a routine kind's data (its users' tally goes into the bundle).
        scorers: a routine kind's answers, computed for every question of val and test beforehand;
            None: ``model`` (and ``selection_model``) score the samples themselves.
    """

    model: Any
    params: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)
    selected_epoch: int | None = None
    selection_model: Any = None
    n_params: int = 0
    timing: dict[str, float] = field(default_factory=dict)
    routine_data: RoutineData | None = None
    scorers: Scorers | None = None

    def tally_parts(self) -> Iterator[pd.DataFrame] | None:
        """A routine kind's users' tally (kept in its bundle) index by index, else None."""
        if self.routine_data is None:
            return None
        data = self.routine_data
        return itertools.chain(data.routine.tally_parts(), data.unseen_places.tally_parts())

    def bundled(self) -> FittedKind:
        """This fit without a routine kind's data: once its tally is in the bundle, nothing reads it."""
        return replace(self, routine_data=None)

    def answered(self) -> FittedKind:
        """This fit without what only its evaluation reads (its scorers, a routine kind's questions): what is
        recorded (the model, its tally, ...) stays."""
        data = None if self.routine_data is None else self.routine_data.index_only()
        return replace(self, scorers=None, routine_data=data)

    def evaluate(self, splits: Mapping[str, SampleTensors]) -> Evaluation:
        """Validation and test metrics: the model chosen on validation gives the validation metrics, the
        tested one (maybe a refit on train + val) the test metrics (:func:`nextloc.evaluation.evaluate.evaluate`)."""
        scorers = self.scorers or Scorers(
            val_scores=model_scores(self.selection_model or self.model),
            test_scores=model_scores(self.model),
        )

        def with_explore(explore: tuple[np.ndarray, np.ndarray] | None) -> Evaluation:
            return evaluate(
                val_scores=scorers.val_scores,
                test_scores=scorers.test_scores,
                val=splits["val"],
                test=splits["test"],
                head_val_scores=scorers.head_val_scores,
                explore=explore,
                joint=scorers.joint,
                windows=scorers.windows,
            )

        evaluation = with_explore(scorers.explore)
        if scorers.past_places_explore is None:
            return evaluation
        window = None if scorers.windows is None else scorers.windows[1]
        past = retest(
            evaluation,
            scorers.test_scores,
            splits["test"],
            scorers.past_places_explore,
            joint=scorers.joint,
            window=window,
        )
        return replace(evaluation, past_places={k: past[k] for k in PAST_PLACES_KEYS if k in past})


def training_device(device: str, threads: int | None) -> torch.device:
    """The device to train on (``auto``: CUDA when present); on a CPU, ``threads`` intra-op threads if given."""
    dev = resolve_device(device)
    if dev.type == "cpu" and threads is not None:
        torch.set_num_threads(threads)
    return dev


def load_splits(
    paths: Mapping[str, Path], device: torch.device, kind: str | None = None
) -> dict[str, SampleTensors]:
    """Each split's samples (``samples_<split>.parquet``) as tensors on ``device``; for a routine ``kind``,
    train's ids and targets only (:data:`ROUTINE_TRAIN_COLUMNS`: its histories are most of the split's
    memory, and the routine reads the staypoints instead)."""
    routine = kind is not None and registry.kind(kind).family == "routine"
    columns = {"train": ROUTINE_TRAIN_COLUMNS} if routine else {}
    return {s: SampleTensors.from_parquet(Path(paths[s]), device, columns.get(s)) for s in SPLITS}


def fit_kind(
    kind: str,
    seed: int,
    splits: Mapping[str, SampleTensors],
    meta: Mapping[str, Any],
    *,
    model_overrides: Mapping[str, Any],
    train_overrides: Mapping[str, Any],
    device: torch.device,
    checkpoint_dir: Path,
    staypoints: Path,
    locations: Path,
    located: Path | None = None,
) -> FittedKind:
    """Fit ``kind`` with ``seed`` on ``splits`` (a dataset's ``metadata.json`` is ``meta``).

    Args:
        model_overrides: a neural kind's config keys (:mod:`nextloc.training.overrides`).
        train_overrides: a neural kind's recipe keys.
        device: where a network trains.
        checkpoint_dir: a network's resume state, read and written while it trains.
        staypoints: the dataset's final staypoints (a routine kind reads them).
        locations: the dataset's location vocabulary (a routine kind reads it).
        located: the dataset's located staypoints (a routine kind's centres as of now; None or a missing
            file: the final staypoints' coordinates).
    """
    entry, vocab = registry.kind(kind), {k: meta[k] for k in ("total_loc_num", "total_user_num")}
    if entry.is_neural:
        overrides = (model_overrides, train_overrides)
        return _train_neural(kind, seed, splits, vocab, meta, *overrides, device, checkpoint_dir)
    if entry.family == "routine":
        return _fit_routine(kind, seed, splits, vocab, meta, (staypoints, locations, located))
    return _fit_baseline(kind, splits, vocab)


def _train_neural(
    kind, seed, splits, vocab, meta, model_overrides, train_overrides, dev, checkpoint_dir: Path
) -> FittedKind:
    """Train a neural ``kind`` (a seed ensemble: its members), resuming from (and writing) ``checkpoint_dir``."""
    entry = registry.kind(kind)
    member_kind, size = entry.trained.name, entry.size
    overrides = dict(model_overrides)
    if "max_seq_len" in model_settings(member_kind):  # the longest history of this dataset
        overrides.setdefault("max_seq_len", int(meta["max_hist_len"]) + 10)

    def build(model_seed: int = seed) -> torch.nn.Module:
        torch.manual_seed(model_seed)
        return build_model(member_kind, vocab["total_loc_num"], vocab["total_user_num"], **overrides).to(dev)

    cfg = training_recipe(member_kind, seed=seed, **train_overrides)
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
    return FittedKind(
        model=model,
        params=params,
        history=selection.history,
        selected_epoch=selection.best_epoch,
        selection_model=selection.model if refit else None,
        n_params=count_parameters(model),
        timing=timing,
    )


def _fit_routine(kind, seed, splits, vocab, meta, files: tuple[Path, Path, Path | None]) -> FittedKind:
    """Fit a routine kind (:mod:`nextloc.routine.ranking`) on the dataset's staypoints and each split's
    questions (``files``: the final staypoints, the location vocabulary, the located staypoints)."""
    config = PreprocessConfig.model_validate(meta["config"])
    staypoints, locations, located = files
    started = time.perf_counter()
    # a ranker's candidate rows go to disk as they are built: LightGBM and the ranker read them from there
    # (the folder goes with the data's last copy that holds it: RoutineData.index_only)
    spill = tempfile.TemporaryDirectory(prefix="nextloc-ranker-") if kind == "ranker" else None
    # the routine rule's weights are chosen on validation: train's questions are never asked of it
    asked = {s: data for s, data in splits.items() if s != "train" or kind != "routine"}
    data = RoutineData.build(
        read_staypoints(staypoints),
        pd.read_parquet(locations),
        asked,
        vocab["total_loc_num"],
        config.timezone,
        config.samples.previous_days,
        read_located(located),
        spill=spill,
    )
    built = time.perf_counter() - started
    selection = data.fit("ranker" if kind == "ranker_refit" else kind, seed)
    selection_val = selection.scores(data.candidates["val"])
    head_val, val_unseen, model = selection_val, None, selection
    if kind == "ranker_refit":  # its head reads validation's cross-fitted answers (RoutineData.refit)
        model, (head_val, val_unseen) = data.refit(selection)

    def explore(min_past_visits: int = 0) -> tuple[np.ndarray, np.ndarray]:
        val = data.explore(model, "val", val_unseen, min_past_visits)
        return val, data.explore(model, "test", min_past_visits=min_past_visits)

    # validation is the selection's (a refit has trained on it), test the model's
    val_scores = routine_scores(data, selection, "val", selection_val)
    test_scores = routine_scores(data, model, "test", model.scores(data.candidates["test"]))
    params = {f"{kind}.weight.{k}": v for k, v in getattr(model, "weights", {}).items()}
    if isinstance(model, RoutineRanker):  # its trees (the rule has weights)
        params.update({f"{kind}.seed": seed, f"{kind}.trees": model.best_iteration})
    scorers = Scorers(
        val_scores=val_scores,
        test_scores=test_scores,
        # the head reads the tested model's validation answers: the selection's own, unless refit
        head_val_scores=val_scores if model is selection else routine_scores(data, model, "val", head_val),
        explore=explore(),
        joint=True,
        windows=(data.windows["val"], data.windows["test"]),
        past_places_explore=explore(MIN_PAST_VISITS),
    )
    return FittedKind(
        model=model,
        params=params,
        selection_model=selection if model is not selection else None,
        timing={"build_seconds": built},
        routine_data=data,
        scorers=scorers,
    )


def _fit_baseline(kind, splits, vocab) -> FittedKind:
    baseline = registry.kind(kind).model_class(vocab["total_loc_num"]).fit(splits["train"])
    return FittedKind(model=BaselineModule(baseline), params={})
