"""Engine-free training: the reference recipes for MHSA/LSTM and for the pointer-generator.

``fit`` trains a model on device-resident samples and returns it with the best validation weights loaded
(the original MHSA code tested the *last* weights; that bug is not reproduced). Tracking is injected:
``log_metrics(metrics, step)`` is called once per epoch, so the caller decides where metrics go. The loop
is plain: per epoch, set the rate, train, validate, let :class:`EarlyStopping` decide, write the resume
state (:mod:`nextloc.training.resume`), report.

Recipes (reference-protocol.md section 2):

* ``mhsa`` (MHSA, LSTM): Adam 1e-3, wd 1e-6, batch 32, drop_last, clip 1.0; linear warmup over 2 epochs
  then linear decay to 0 at 50 epochs, stepped per batch until the first early stop; early stopping on
  the mean validation loss with delta 1e-3 and patience 3; each trigger reloads the best weights and
  multiplies the learning rate by 0.1; the third trigger ends training (at most 100 epochs).
* ``pointer``: AdamW 6.5e-4, betas (0.9, 0.98), eps 1e-9, wd 0.015, batch 128, clip 0.8, label smoothing
  0.03 on the log-probabilities; per-epoch LR: 5 warmup epochs then cosine to 1e-6 over 45 epochs;
  early stopping on validation loss (strict improvement), patience 5, at least 8 epochs, at most 50.
* ``pointer_plus`` (nextloc): the pointer recipe with a cosine over 15 epochs (patience 3); the epoch is
  chosen on validation *place* MRR and its weights are tested (fit on train, choose on val, test once).
* ``refit_on_train_val`` (a recipe option no kind uses; the flows refuse it, :mod:`nextloc.training.overrides`):
  the epoch count chosen on validation, then a fresh model trained on train + val for that many epochs
  with the rate annealed over them (more data than the reference budget).

Changes from the reference recipes, for speed on a CPU; each is used only where the 5-seed validation
means stay within 0.3 points of the reference recipe's (the numbers: BENCHMARKS.md, docs/models.md):

* Batches from length-sorted pools (``bucket``, ``bucket_pool``; :meth:`nextloc.models.batch.SampleTensors.batches`):
  pools of 8 batches for mhsa, 4 for the pointer, 50 for pointer_plus, so far fewer padded tokens per
  step; the LSTM keeps plain shuffled batches.
* PCG64 dropout masks on a CPU (``dropout_rng="pcg64"``; :mod:`nextloc.models.dropout`) for the pointer
  recipes and the LSTM; mhsa keeps ``F.dropout``.
* The LSTM runs one fused call over the padded batch (:mod:`nextloc.models.lstm`), not the packed loop.

``bucket=False`` and ``dropout_rng="torch"`` together give the reference recipe.

CUDA (when present): fp16 autocast with a gradient scaler, tensors already on the device; CPU otherwise
(fp32).

Resuming (``fit(..., resume_path=...)``, ``fit_model(..., checkpoint_dir=...)``): after every completed epoch
the whole loop state is written atomically, and a call that finds a state written for the same run
continues after its epoch with bit-identical results; anything else is ignored with a warning
(:mod:`nextloc.training.resume`). Timing fields are not part of that guarantee: see :class:`FitResult`.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nextloc.evaluation.tensor_metrics import MetricAccumulator
from nextloc.models.batch import SampleTensors, by_length
from nextloc.models.dropout import PCG64Dropout, drawing_from
from nextloc.models.ensemble import SeedEnsemble
from nextloc.models.train_config import TrainConfig as TrainConfig  # re-exported
from nextloc.training import optim, resume
from nextloc.training.overrides import check_kind_overrides as check_kind_overrides  # re-exported
from nextloc.training.resume import TrainingObjects

logger = logging.getLogger(__name__)

LogMetrics = Callable[[dict[str, float], int], None]

SELECTION_CHECKPOINT = "selection.pt"
REFIT_CHECKPOINT = "refit.pt"


@dataclass
class FitResult:
    """What training produced (the model holds the best weights).

    After a resume, ``model``, ``best_epoch``, ``best_val_loss``, ``epochs`` and ``history`` are identical
    to an uninterrupted run's. The timing fields are not: ``train_seconds`` is the wall time recorded up
    to the resumed epoch plus this call's (the partial epoch lost in the crash and the gap before the
    rerun are not counted), ``seconds_to_best`` is restored when the best epoch came before the crash, and
    ``train_samples_per_s`` is computed over the training batches of all epochs, whichever call ran them.
    """

    model: nn.Module
    best_epoch: int
    best_val_loss: float
    epochs: int
    history: list[dict[str, float]] = field(default_factory=list)
    train_seconds: float = 0.0
    seconds_to_best: float = 0.0
    train_samples_per_s: float = 0.0  # training batches only (validation excluded)
    resumed_from_epoch: int = 0  # epochs restored from a resume file (0: trained from scratch)


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` -> CUDA when present, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def seed_everything(seed: int, deterministic: bool = True) -> None:
    """Seed Python, NumPy and torch; optionally force deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        _use_deterministic_algorithms()


def _use_deterministic_algorithms() -> None:
    """``torch.use_deterministic_algorithms(True, warn_only=True)`` without importing ``torch._inductor``.

    torch's function also sets ``torch._inductor.config.deterministic``, which only ``torch.compile`` reads
    (nextloc does not compile), and importing that config takes about 0.9 s in every training process. It
    is set too when inductor is already loaded.
    """
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:
        inductor_config.deterministic = True


def fit(
    model: nn.Module,
    train: SampleTensors,
    val: SampleTensors,
    config: TrainConfig,
    *,
    log_prob_output: bool,
    log_metrics: LogMetrics | None = None,
    resume_path: Path | None = None,
) -> FitResult:
    """Train ``model`` with ``config``'s recipe; return it with the best validation weights loaded.

    Args:
        model: a ``nextloc.models`` module (already on the device of ``train``), freshly initialised.
        train: training samples on the device.
        val: validation samples on the same device.
        config: the recipe.
        log_prob_output: True if the model returns log-probabilities (pointer), False for logits.
        log_metrics: called as ``log_metrics({"train_loss": ..., "val_loss": ..., "val_acc@1": ...}, epoch)``
            for each epoch this call trains, after that epoch's resume state is written (epochs restored
            from a resume file are not reported again; their records are in ``FitResult.history``).
        resume_path: if given, the full training state is written there (atomically) after every epoch,
            and a valid state found there on entry is resumed (see :mod:`nextloc.training.resume`). The file is
            kept when training ends, so calling again with it returns the same result without training.

    Returns:
        A :class:`FitResult`.
    """
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    seed_everything(config.seed, config.deterministic)
    run = _training_objects(model, config, train)
    progress = resume.Progress(stopping=optim.EarlyStopping.for_config(config, model))
    fingerprint = resume.fingerprint(model, train, val, config) if resume_path is not None else ""
    if resume_path is not None:
        progress, run = _resumed(resume_path, fingerprint, run, progress, config, train)
    resumed_from_epoch = progress.epoch
    stopping = progress.stopping
    start = time.perf_counter() - progress.elapsed
    last_epoch = progress.epoch if progress.finished else config.max_epochs
    for epoch in range(progress.epoch + 1, last_epoch + 1):
        if config.recipe == "pointer":
            optim.set_lr(run.optimizer, optim.pointer_lr(epoch - 1, config))
        epoch_start = time.perf_counter()
        train_loss, count = _train_epoch(run, train, config, log_prob_output, stopping.schedule_active)
        progress.n_trained += count
        progress.train_loop_seconds += time.perf_counter() - epoch_start
        val_loss, val_metrics = evaluate_loss(model, val, config, log_prob_output)
        record = _epoch_record(epoch, train_loss, val_loss, val_metrics, run.optimizer)
        progress.history.append(record)
        score = val_loss if config.monitor == "val_loss" else -record[config.monitor]
        decision = stopping.update(epoch, score, val_loss, model)
        if decision == "improved":
            progress.seconds_to_best = time.perf_counter() - start
        elif decision == "drop":
            _drop_lr(run, stopping)
        progress.epoch = epoch
        progress.finished = decision == "stop" or epoch == config.max_epochs
        if resume_path is not None:  # before log_metrics: a crash from here on loses nothing of this epoch
            progress.elapsed = time.perf_counter() - start
            resume.save(resume_path, fingerprint, run, progress)
        if log_metrics is not None:
            log_metrics(record, epoch)
        if progress.finished:
            break
    if config.select_best:
        model.load_state_dict(stopping.best_state)
    return FitResult(
        model=model,
        best_epoch=stopping.best_epoch,
        best_val_loss=stopping.best_loss,
        epochs=progress.epoch,
        history=progress.history,
        train_seconds=time.perf_counter() - start,
        seconds_to_best=progress.seconds_to_best,
        train_samples_per_s=progress.n_trained / max(progress.train_loop_seconds, 1e-9),
        resumed_from_epoch=resumed_from_epoch,
    )


def _train_epoch(
    run: TrainingObjects,
    train: SampleTensors,
    config: TrainConfig,
    log_prob_output: bool,
    step_schedule: bool,
) -> tuple[float, int]:
    """One pass over the shuffled training batches; the mean training loss and the samples trained on.

    ``step_schedule``: step the per-step scheduler (mhsa recipe) after each optimiser step.
    """
    model, optimizer, scaler = run.model, run.optimizer, run.scaler
    device = train.device
    use_amp = config.amp and device.type == "cuda"
    model.train()
    total, count = 0.0, 0
    batches = train.batches(
        config.batch_size,
        shuffle=True,
        generator=run.batches,
        drop_last=config.drop_last,
        bucket=config.bucket,
        bucket_pool=config.bucket_pool,
    )
    with drawing_from(model, run.dropout):
        for batch in batches:
            with torch.autocast(device.type, dtype=torch.float16, enabled=use_amp):
                if hasattr(model, "training_loss"):
                    loss = model.training_loss(batch, config.label_smoothing)
                else:
                    loss = _loss(model(batch), batch.target, log_prob_output, config.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm, foreach=True)
            scaler.step(optimizer)
            scaler.update()
            if step_schedule and run.scheduler is not None:
                run.scheduler.step()
            total += loss.detach() * len(batch.target)
            count += len(batch.target)
    return float(total / max(count, 1)), count


def _epoch_record(
    epoch: int,
    train_loss: float,
    val_loss: float,
    val_metrics: dict[str, float],
    optimizer: torch.optim.Optimizer,
) -> dict[str, float]:
    """The epoch's history record (its rate: where the epoch's training left it), logged."""
    logger.info(
        "epoch %d: train_loss %.4f val_loss %.4f val_acc@1 %.2f",
        epoch,
        train_loss,
        val_loss,
        val_metrics["acc@1"],
    )
    return {
        "train_loss": train_loss,
        "val_loss": val_loss,
        "lr": optimizer.param_groups[0]["lr"],
        **{f"val_{k}": v for k, v in val_metrics.items() if k != "n"},
    }


def _drop_lr(run: TrainingObjects, stopping: optim.EarlyStopping) -> None:
    """An early stop of the mhsa recipe: back to the best weights, the rate x 0.1 (the schedule has stopped)."""
    run.model.load_state_dict(stopping.best_state)
    for group in run.optimizer.param_groups:
        group["lr"] *= 0.1
    logger.info(
        "early stop %d: best epoch %d, lr -> %.2e",
        stopping.drops,
        stopping.best_epoch,
        run.optimizer.param_groups[0]["lr"],
    )


def _resumed(
    path: Path,
    fingerprint: str,
    run: TrainingObjects,
    progress: resume.Progress,
    config: TrainConfig,
    train: SampleTensors,
) -> tuple[resume.Progress, TrainingObjects]:
    """The progress and objects to continue from: restored from ``path`` when it holds this run's state,
    else the fresh ones given (re-made when a restore failed half-way)."""
    state = resume.read(path, fingerprint)
    if state is None:
        return progress, run
    try:
        restored = resume.restore(state, run)
    except Exception as exc:  # a damaged state that passed the checks: never worth a crash
        logger.warning("cannot resume from %s (%s: %s); training from scratch", path, type(exc).__name__, exc)
        run.model.load_state_dict(progress.stopping.best_state)  # the initial weights
        seed_everything(config.seed, config.deterministic)
        return progress, _training_objects(run.model, config, train)
    logger.info(
        "resumed from %s after epoch %d%s",
        path,
        restored.epoch,
        " (training had ended)" if restored.finished else "",
    )
    return restored, run


def fit_model(
    build: Callable[[], nn.Module],
    train: SampleTensors,
    val: SampleTensors,
    config: TrainConfig,
    *,
    log_prob_output: bool,
    log_metrics: LogMetrics | None = None,
    checkpoint_dir: Path | None = None,
) -> tuple[FitResult, FitResult | None]:
    """``fit`` a fresh model; with ``refit_on_train_val``, then retrain a fresh one on train + val.

    The refit runs the selected number of epochs with the learning rate annealed over them and keeps its
    final weights (validation is part of its training data, so it selects nothing).

    Args:
        build: returns a freshly (and reproducibly: seed it) initialised model on the samples' device.
        train: training samples.
        val: validation samples.
        config: the recipe.
        log_prob_output: True if the model returns log-probabilities.
        log_metrics: per-epoch callback of the selection run (see :func:`fit`).
        checkpoint_dir: if given, the selection run resumes from / writes ``<dir>/selection.pt`` and the refit
            ``<dir>/refit.pt`` (see :func:`fit`'s ``resume_path``). The files are kept after success (a
            rerun then returns the same results without training); deleting them is the caller's call.

    Returns:
        ``(selection, refit)``: the selection run (its validation metrics are the honest ones) and the
        refit run, or ``None`` without ``refit_on_train_val``. The model to use is ``(refit or selection).model``.
    """
    selection = fit(
        build(),
        train,
        val,
        config,
        log_prob_output=log_prob_output,
        log_metrics=log_metrics,
        resume_path=checkpoint_dir / SELECTION_CHECKPOINT if checkpoint_dir is not None else None,
    )
    if not config.refit_on_train_val:
        return selection, None
    # Same epoch count, but the learning rate anneals over it (one epoch at the peak rate, then the cosine
    # compressed into the remaining epochs), so the refit ends on a low rate like a completed schedule.
    epochs = max(1, selection.best_epoch)
    final_config = config.model_copy(
        update={
            "max_epochs": epochs,
            "warmup_epochs": 1,
            "decay_epochs": max(epochs - 1, 1),
            "min_epochs": 0,
            "patience": 10**9,
            "select_best": False,
            "refit_on_train_val": False,
        }
    )
    logger.info("refit on train + val for %d epochs", final_config.max_epochs)
    refit = fit(
        build(),
        train.concat(val),
        val,
        final_config,
        log_prob_output=log_prob_output,
        resume_path=checkpoint_dir / REFIT_CHECKPOINT if checkpoint_dir is not None else None,
    )
    return selection, refit


def fit_seed_ensemble(
    build: Callable[[int], nn.Module],
    train: SampleTensors,
    val: SampleTensors,
    config: TrainConfig,
    size: int,
    *,
    log_prob_output: bool,
    log_metrics: LogMetrics | None = None,
    checkpoint_dir: Path | None = None,
) -> tuple[SeedEnsemble, list[FitResult]]:
    """Train ``size`` members with seeds ``config.seed * size + m`` (each fit on train, its epoch chosen on
    validation, exactly as a single model of that seed) and average them into a :class:`SeedEnsemble`.

    Args:
        build: ``build(seed)`` returns a freshly initialised member model seeded with ``seed``.
        train: training samples.
        val: validation samples.
        config: the members' recipe (``refit_on_train_val`` is not allowed: members stay on train).
        size: number of members.
        log_prob_output: whether the members return log-probabilities.
        log_metrics: per-epoch callback of the first member.
        checkpoint_dir: if given, member ``m`` resumes from / writes ``<dir>/member<m>/`` (see :func:`fit_model`).

    Returns:
        ``(ensemble, members)``: the ensemble (log-probability output) and each member's :class:`FitResult`.
    """
    if size < 1:
        raise ValueError(f"ensemble size {size} must be >= 1")
    if config.refit_on_train_val:
        raise ValueError("ensemble members are fit on train only (refit_on_train_val must be False)")
    members = []
    for m in range(size):
        seed = config.seed * size + m
        logger.info("ensemble member %d/%d (seed %d)", m + 1, size, seed)
        selection, _ = fit_model(
            lambda seed=seed: build(seed),
            train,
            val,
            config.model_copy(update={"seed": seed}),
            log_prob_output=log_prob_output,
            log_metrics=log_metrics if m == 0 else None,
            checkpoint_dir=checkpoint_dir / f"member{m}" if checkpoint_dir is not None else None,
        )
        members.append(selection)
    return SeedEnsemble([r.model for r in members], log_prob_output), members


@torch.no_grad()
def evaluate_loss(
    model: nn.Module, data: SampleTensors, config: TrainConfig, log_prob_output: bool
) -> tuple[float, dict[str, float]]:
    """Mean of batch-mean losses (the reference early-stopping criterion) and the metrics, one pass."""
    model.eval()
    acc = MetricAccumulator()
    losses = []
    use_amp = config.amp and data.device.type == "cuda"
    for batch in data.batches(config.eval_batch_size):
        with torch.autocast(data.device.type, dtype=torch.float16, enabled=use_amp):
            out = by_length(model, batch)  # length-sorted pieces: the same rows, little padding
        out = out.float()
        losses.append(_loss(out, batch.target, log_prob_output, config.label_smoothing))
        acc.update(out, batch.target, batch.index)
    return float(torch.stack(losses).mean()), acc.compute()


def _loss(
    out: torch.Tensor, target: torch.Tensor, log_prob_output: bool, label_smoothing: float
) -> torch.Tensor:
    # The pointer returns log-probabilities; cross_entropy re-applies log_softmax, which is the identity
    # on a normalised log-distribution, so this is the reference's NLL with label smoothing.
    return F.cross_entropy(out.float(), target, ignore_index=0, label_smoothing=label_smoothing)


def _training_objects(model: nn.Module, config: TrainConfig, train: SampleTensors) -> TrainingObjects:
    """Fresh optimizer, scheduler, gradient scaler, batch-shuffling generator and PCG64 dropout source (on a
    CPU with ``dropout_rng="pcg64"``, else None) for a run of ``model`` on ``train``."""
    device = train.device
    optimizer = optim.make_optimizer(model, config)
    return TrainingObjects(
        model=model,
        optimizer=optimizer,
        scheduler=optim.make_scheduler(optimizer, config, optim.steps_per_epoch(len(train), config)),
        scaler=torch.amp.GradScaler("cuda", enabled=config.amp and device.type == "cuda"),
        batches=torch.Generator().manual_seed(config.seed),
        dropout=PCG64Dropout(config.seed) if config.dropout_rng == "pcg64" and device.type == "cpu" else None,
    )
