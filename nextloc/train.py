"""Engine-free training: the reference recipes for MHSA/LSTM and for the pointer-generator.

``fit`` trains a model on device-resident samples and returns it with the best validation weights
loaded (the original MHSA code tested the *last* weights; that bug is not reproduced). Tracking is
injected: ``log_metrics(metrics, step)`` is called once per epoch, so the caller decides where metrics go.

Recipes (reference-protocol.md section 2):

* ``mhsa`` (MHSA, LSTM): Adam 1e-3, wd 1e-6, batch 32, drop_last, clip 1.0; linear warmup over 2 epochs
  then linear decay to 0 at 50 epochs, stepped per batch until the first early stop; early stopping on
  the mean validation loss with delta 1e-3 and patience 3; each trigger reloads the best weights and
  multiplies the learning rate by 0.1; the third trigger ends training (at most 100 epochs).
* ``pointer_plus`` (nextloc): the pointer recipe with a cosine over 15 epochs (patience 3); the epoch is
  chosen on validation *place* MRR and its weights are tested (fit on train, choose on val, test once);
  batches come from pools of 50 batches sorted by history length (``bucket_pool=50``).
* ``pointer_plus_refit``: the earlier nextloc recipe, its own row, never a headline: the epoch count is
  chosen on validation (reference) MRR, then a fresh model is trained on train + val for that many epochs
  with the rate annealed over them. It uses more data than the reference budget, and it learns to emit
  the unseen token ``1`` (validation has 591 such targets, train none).
* ``pointer``: AdamW 6.5e-4, betas (0.9, 0.98), eps 1e-9, wd 0.015, batch 128, clip 0.8, label smoothing
  0.03 on the log-probabilities; per-epoch LR: 5 warmup epochs then cosine to 1e-6 over 45 epochs;
  early stopping on validation loss (strict improvement), patience 5, at least 8 epochs, at most 50.

Two changes from the reference recipes, for speed (issue 13): the batches and, for the pointer recipes and
the LSTM, where dropout's masks come from. Each was chosen on validation over 5 seeds (test reported once).

Batches. The reference draws plain shuffled batches, and on GeoLife (history lengths 1-51, median 16) they
hold 2.4x as many padded tokens as real ones. Here the shuffled samples are cut into pools of a few batches,
each pool sorted by length and cut into batches, and the batches shuffled
(:meth:`nextloc.data.SampleTensors.batches`): MHSA draws from pools of 8 batches (1.17x the real tokens), the
pointer from pools of 4 (1.38x). Each pool size is the largest tried whose validation means (Acc@1, MRR,
place Acc@1) stay within 0.3 points of the plain batches' or above them, and whose validation loss is no
worse:

* mhsa, plain batches: 38.84 / 49.30 (validation Acc@1 / MRR); pools of 4: 39.24 / 49.66; **8: 39.57 /
  49.83**; 16: 37.91 / 48.65; 50: 38.60 / 48.85.
* pointer, plain batches: 45.90 / 59.77; **pools of 4: 46.34 / 60.04**; 8: 45.20 / 59.44.
* lstm, plain batches: 34.52 / 46.52; pools of 8: 33.95 / 45.84 (and a higher validation loss), so the
  LSTM keeps the reference's plain batches.

Dropout draws (``dropout_rng``). On a CPU ``F.dropout``'s ``bernoulli_`` is a serial Mersenne-Twister loop,
about a quarter of a pointer step; ``"pcg64"`` draws the masks from a NumPy PCG64 stream instead (about a
tenth of the cost, :mod:`nextloc.models.dropout`). Kept where the 5-seed validation means stay within 0.3
points of the reference recipe's (the issue's rule; validation Acc@1 / MRR / place Acc@1, loss):

* pointer (with its pools of 4): 46.03 / 59.85 / 41.92, loss 2.981, against plain batches and F.dropout's
  draws 45.90 / 59.77 / 41.54, 2.989: kept.
* pointer_plus: 44.45 / 53.68 (place MRR, its monitor, 53.66), loss 4.124, against its F.dropout draws
  44.35 / 53.63 (53.62), 4.116: kept (the loss is 0.008 higher, a third of its seeds' spread).
* lstm (with the unpacked LSTM, :mod:`nextloc.models.lstm`): 34.24 / 46.36, loss 4.492, against the
  reference's 34.52 / 46.52, 4.481: kept (Acc@1 0.29 lower). Then run in length chunks (``length_chunks``, now
  the LSTM's CPU default; its inter-layer masks are drawn per chunk): 34.28 / 46.33, loss 4.483: kept.
* mhsa (with its pools of 8): 37.25 / 48.10, loss 4.544, against 38.84 / 49.30, 4.596: Acc@1 1.6 points
  lower, so mhsa keeps F.dropout's draws (prefetched on a thread, the same bits).

The seeds spread by 1-3 points on validation, so these differences are mostly noise: the point is that
neither change costs anything measurable. ``bucket=False`` gives the reference's plain batches and
``dropout_rng="torch"`` F.dropout's draws: both together are the reference recipe, bit-identical to it
before these changes (the LSTM's states differ from the packed reference's in their last bits).

CUDA (when present): fp16 autocast with a gradient scaler, tensors already on the device, pinned host
memory and non-blocking copies for anything that crosses; CPU otherwise (fp32). On a CPU with a second
core, two kinds of work leave the training thread, and neither changes a bit of the results (weights,
history, resume files, generator states; ``tests/nextloc/test_train.py``): F.dropout's draws (mhsa, and any
recipe with ``dropout_rng="torch"``) are drawn ahead on a thread (:mod:`nextloc.models.dropout`,
``prefetch_dropout``), and each epoch is validated on a copy of the model while the next epoch trains
(``overlap_validation``).
When that validation changes the recipe's course (an early stop reloads the best weights and lowers the
rate, or training ends), the loop restores its state at the end of the validated epoch, applies the
decision and trains the next epoch again.

Resuming (``fit(..., resume_path=...)``, ``fit_model(..., checkpoint_dir=...)``): after every completed epoch
the whole loop state is written atomically (model, optimizer, scheduler, gradient scaler, EMA, best weights,
early-stopping counters, history, the batch-shuffling generator, the global torch/CUDA/NumPy/Python RNG
states and the PCG64 dropout stream's). A call that finds a resume file written for the same training config,
the same identically initialised model, the same device type and the same samples continues after its
epoch; after a crash (even SIGKILL) the weights, history and best epoch come out bit-identical to an
uninterrupted run on the same machine. A file from anything else, or one that cannot be read (truncated,
corrupt), is ignored with a warning and training starts from scratch. Timing fields are not part of that
guarantee: see :class:`FitResult`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nextloc.data import SampleTensors, by_length
from nextloc.metrics import MetricAccumulator
from nextloc.models import dropout as dropout_draws
from nextloc.models.dropout import pcg64_dropout, prefetched_dropout, streams_dropout
from nextloc.models.ensemble import SeedEnsemble
from nextloc.overrides import check_kind_overrides as check_kind_overrides  # re-exported
from nextloc.storage import atomic_path
from nextloc.train_config import TrainConfig as TrainConfig  # re-exported

logger = logging.getLogger(__name__)

LogMetrics = Callable[[dict[str, float], int], None]

RESUME_FORMAT = 2  # bump when the resume file layout changes (older files are then ignored)
SELECTION_CHECKPOINT = "selection.pt"
REFIT_CHECKPOINT = "refit.pt"
_RESUME_KEYS = frozenset(
    {"format", "fingerprint", "progress", "model", "optimizer", "scheduler", "scaler", "ema", "rng"}
)


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


@dataclass
class _Progress:
    """The loop's bookkeeping, saved with every resume state (modules and RNGs are saved beside it)."""

    best_state: dict[str, torch.Tensor]
    epoch: int = 0  # last completed epoch
    finished: bool = False  # the loop ended (max_epochs reached or early stopping exhausted)
    best_score: float = math.inf
    best_loss: float = math.inf
    best_epoch: int = 0
    bad_epochs: int = 0
    drops: int = 0
    schedule_active: bool = True
    history: list[dict[str, float]] = field(default_factory=list)
    # timing: not covered by the identical-results guarantee
    elapsed: float = 0.0
    seconds_to_best: float = 0.0
    n_trained: int = 0
    train_loop_seconds: float = 0.0


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` -> CUDA when present, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def seed_everything(seed: int, deterministic: bool = True) -> None:
    """Seed Python, NumPy, torch and the PCG64 dropout stream; optionally force deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    dropout_draws.manual_seed(seed)
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


def fit(  # noqa: C901  (the one function over the limit: issue 26 rewrites this loop)
    model: nn.Module,
    train: SampleTensors,
    val: SampleTensors,
    config: TrainConfig,
    *,
    log_prob_output: bool,
    log_metrics: LogMetrics | None = None,
    checkpoint_path: Path | None = None,
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
        checkpoint_path: if given, the best weights are also written there (atomically) after each improvement.
        resume_path: if given, the full training state is written there (atomically) after every epoch,
            and a valid state found there on entry is resumed (see the module docstring). The file is
            kept when training ends, so calling again with it returns the same result without training.

    Returns:
        A :class:`FitResult`.
    """
    device = train.device
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    seed_everything(config.seed, config.deterministic)
    use_amp = config.amp and device.type == "cuda"
    steps_per_epoch = _steps_per_epoch(len(train), config)
    pcg64 = config.dropout_rng == "pcg64" and device.type == "cpu"
    prefetch = (
        config.dropout_rng == "torch"
        and config.prefetch_dropout
        and device.type == "cpu"
        and streams_dropout(model)
    )
    gen, scaler, optimizer, scheduler, ema = _training_objects(model, config, steps_per_epoch, use_amp)
    progress = _Progress(best_state=copy.deepcopy(model.state_dict()))

    fingerprint = ""
    if resume_path is not None:
        fingerprint = _resume_fingerprint(model, train, val, config)
        state = _read_resume(resume_path, fingerprint)
        if state is not None:
            try:
                progress = _restore(state, model, optimizer, scheduler, scaler, ema, gen)
            except Exception as exc:  # a damaged state that passed the checks: never worth a crash
                logger.warning(
                    "cannot resume from %s (%s: %s); training from scratch",
                    resume_path,
                    type(exc).__name__,
                    exc,
                )
                model.load_state_dict(progress.best_state)  # the initial weights
                seed_everything(config.seed, config.deterministic)
                gen, scaler, optimizer, scheduler, ema = _training_objects(
                    model, config, steps_per_epoch, use_amp
                )
            else:
                logger.info(
                    "resumed from %s after epoch %d%s",
                    resume_path,
                    progress.epoch,
                    " (training had ended)" if progress.finished else "",
                )
    resumed_from_epoch = progress.epoch
    start = time.perf_counter() - progress.elapsed
    last_epoch = progress.epoch if progress.finished else config.max_epochs
    overlap = config.overlap_validation and device.type == "cpu" and (os.cpu_count() or 1) > 1
    validator = ThreadPoolExecutor(1, thread_name_prefix="nextloc-validation") if overlap else None

    def conclude(epoch: int, train_loss: float, evaluated_state: dict, scores, snapshot) -> bool:
        """Record epoch ``epoch``'s validation, apply the recipe's decision, write the resume state and report
        the epoch. ``snapshot`` (the loop state at the end of the epoch's training) is given when the next
        epoch has been training meanwhile: a decision that changes the state it trained from (an early stop
        with its reloaded weights and lower rate, or the end) first restores the snapshot. Returns whether
        the loop state the next epoch started from still holds."""
        nonlocal progress
        val_loss, val_metrics = scores
        record = {
            "train_loss": train_loss,
            "val_loss": val_loss,
            "lr": (snapshot["optimizer"]["param_groups"] if snapshot else optimizer.param_groups)[0]["lr"],
            **{f"val_{k}": v for k, v in val_metrics.items() if k != "n"},
        }
        logger.info(
            "epoch %d: train_loss %.4f val_loss %.4f val_acc@1 %.2f",
            epoch,
            train_loss,
            val_loss,
            val_metrics["acc@1"],
        )
        score = val_loss if config.monitor == "val_loss" else -record[config.monitor]
        improved = score < progress.best_score - config.es_delta
        ends_or_drops = (
            not improved and progress.bad_epochs + 1 >= config.patience and epoch >= config.min_epochs
        )
        holds = not ends_or_drops and epoch != config.max_epochs
        if snapshot is not None and not holds:
            progress = _restore(snapshot, model, optimizer, scheduler, scaler, ema, gen)
        progress.history.append(record)
        stop = False
        if improved:
            progress.best_score, progress.best_loss, progress.best_epoch = score, val_loss, epoch
            progress.bad_epochs = 0
            if config.select_best:
                progress.best_state = copy.deepcopy(evaluated_state)
            progress.seconds_to_best = time.perf_counter() - start
            if checkpoint_path is not None:
                _save_checkpoint(checkpoint_path, progress.best_state, epoch, progress.best_loss, config)
        else:
            progress.bad_epochs += 1
            if ends_or_drops:
                if progress.drops >= config.lr_drops:
                    stop = True
                else:
                    # mhsa recipe: reload the best weights, lr x 0.1, the warmup/decay schedule stops for good
                    progress.drops += 1
                    progress.bad_epochs = 0
                    progress.schedule_active = False
                    model.load_state_dict(progress.best_state)
                    for group in optimizer.param_groups:
                        group["lr"] *= 0.1
                    logger.info(
                        "early stop %d: best epoch %d, lr -> %.2e",
                        progress.drops,
                        progress.best_epoch,
                        optimizer.param_groups[0]["lr"],
                    )
        progress.epoch = epoch
        progress.finished = stop or epoch == config.max_epochs
        if resume_path is not None:
            # written before log_metrics: a crash from here on loses nothing of this epoch
            progress.elapsed = time.perf_counter() - start
            # the live objects are ahead when the next epoch goes on: then the epoch's own state is the snapshot
            live = snapshot is None or not holds
            state = _loop_state(progress, model, optimizer, scheduler, scaler, ema, gen) if live else snapshot
            _atomic_save({**state, "progress": _fields(progress), "fingerprint": fingerprint}, resume_path)
        if log_metrics is not None:
            log_metrics(record, epoch)
        return holds

    pending = None  # (epoch, train loss, evaluated weights, validation future, snapshot) running beside
    try:
        epoch = progress.epoch + 1
        while epoch <= last_epoch:
            if config.recipe == "pointer":
                _set_lr(optimizer, _pointer_lr(epoch - 1, config))
            model.train()
            total, count = 0.0, 0
            epoch_start = time.perf_counter()
            batches = iter(
                train.batches(
                    config.batch_size,
                    shuffle=True,
                    generator=gen,
                    drop_last=config.drop_last,
                    bucket=config.bucket,
                    bucket_pool=config.bucket_pool,
                )
            )
            holds = True
            while True:
                paused = False
                with pcg64_dropout(pcg64), prefetched_dropout(prefetch):
                    for batch in batches:
                        with torch.autocast(device.type, dtype=torch.float16, enabled=use_amp):
                            if hasattr(model, "training_loss"):
                                loss = model.training_loss(batch, config.label_smoothing)
                            else:
                                loss = _loss(
                                    model(batch), batch.target, log_prob_output, config.label_smoothing
                                )
                        optimizer.zero_grad(set_to_none=True)
                        scaler.scale(loss).backward()
                        scaler.unscale_(optimizer)
                        nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm, foreach=True)
                        scaler.step(optimizer)
                        scaler.update()
                        if scheduler is not None and progress.schedule_active:
                            scheduler.step()
                        if ema is not None:
                            ema.update_parameters(model)
                        total += loss.detach() * len(batch.target)
                        count += len(batch.target)
                        if pending is not None and pending[3].done():
                            paused = True  # conclude the previous epoch between two steps of this one
                            break
                if not paused:
                    break
                holds = conclude(pending[0], pending[1], pending[2], pending[3].result(), pending[4])
                pending = None
                if not holds:
                    break
            if holds and pending is not None:  # this epoch's batches are done before its predecessor's check
                holds = conclude(pending[0], pending[1], pending[2], pending[3].result(), pending[4])
                pending = None
            if not holds:  # restored to the end of the previous epoch, its decision applied
                if progress.finished:
                    break
                continue  # train this epoch again, from that state
            progress.n_trained += count
            progress.train_loop_seconds += time.perf_counter() - epoch_start
            evaluated = ema.module if ema is not None else model
            train_loss = float(total / max(count, 1))
            if validator is not None and epoch < last_epoch:
                # validate on a copy beside the next epoch's training (a CPU core that would idle otherwise)
                frozen = copy.deepcopy(evaluated)
                snapshot = copy.deepcopy(_loop_state(progress, model, optimizer, scheduler, scaler, ema, gen))
                future = validator.submit(evaluate_loss, frozen, val, config, log_prob_output)
                pending = (epoch, train_loss, frozen.state_dict(), future, snapshot)
                epoch += 1
                continue
            scores = evaluate_loss(evaluated, val, config, log_prob_output)
            conclude(epoch, train_loss, evaluated.state_dict(), scores, None)
            if progress.finished:
                break
            epoch += 1
    finally:
        if validator is not None:
            validator.shutdown(wait=True, cancel_futures=True)

    if config.select_best:
        model.load_state_dict(progress.best_state)
    elif ema is not None:
        model.load_state_dict(ema.module.state_dict())
    elapsed = time.perf_counter() - start
    return FitResult(
        model=model,
        best_epoch=progress.best_epoch,
        best_val_loss=progress.best_loss,
        epochs=progress.epoch,
        history=progress.history,
        train_seconds=elapsed,
        seconds_to_best=progress.seconds_to_best,
        train_samples_per_s=progress.n_trained / max(progress.train_loop_seconds, 1e-9),
        resumed_from_epoch=resumed_from_epoch,
    )


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
    final_config = replace(
        config,
        max_epochs=epochs,
        warmup_epochs=1,
        decay_epochs=max(epochs - 1, 1),
        min_epochs=0,
        patience=10**9,
        select_best=False,
        refit_on_train_val=False,
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
            replace(config, seed=seed),
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


def predict_scores(model: nn.Module, data: SampleTensors, batch_size: int = 512) -> MetricAccumulator:
    """Score every sample of a split with ``model`` and accumulate the metrics (see :mod:`nextloc.evaluate`)."""
    from nextloc.evaluate import model_scores, score_split

    return score_split(model_scores(model), data, batch_size).accumulator


def _loss(
    out: torch.Tensor, target: torch.Tensor, log_prob_output: bool, label_smoothing: float
) -> torch.Tensor:
    # The pointer returns log-probabilities; cross_entropy re-applies log_softmax, which is the identity
    # on a normalised log-distribution, so this is the reference's NLL with label smoothing.
    return F.cross_entropy(out.float(), target, ignore_index=0, label_smoothing=label_smoothing)


def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer_cls = torch.optim.AdamW if config.recipe == "pointer" else torch.optim.Adam
    return optimizer_cls(
        params,
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        weight_decay=config.weight_decay,
        foreach=True,
    )


def _steps_per_epoch(n: int, config: TrainConfig) -> int:
    return n // config.batch_size if config.drop_last else math.ceil(n / config.batch_size)


def _scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig, steps_per_epoch: int):
    """mhsa: per-step linear warmup then linear decay to 0 (transformers' get_linear_schedule_with_warmup)."""
    if config.recipe != "mhsa":
        return None
    warmup = config.warmup_epochs * steps_per_epoch
    total = config.decay_epochs * steps_per_epoch

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _pointer_lr(epoch: int, config: TrainConfig) -> float:
    """Per-epoch warmup then cosine (epoch counted from 0)."""
    if epoch < config.warmup_epochs:
        return config.lr * (epoch + 1) / config.warmup_epochs
    progress = (epoch - config.warmup_epochs) / max(1, config.decay_epochs)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * progress))


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _training_objects(
    model: nn.Module, config: TrainConfig, steps_per_epoch: int, use_amp: bool
) -> tuple[
    torch.Generator,
    torch.amp.GradScaler,
    torch.optim.Optimizer,
    torch.optim.lr_scheduler.LambdaLR | None,
    torch.optim.swa_utils.AveragedModel | None,
]:
    """Fresh batch-shuffling generator, gradient scaler, optimizer, scheduler and EMA (or None) for a run."""
    gen = torch.Generator().manual_seed(config.seed)
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    optimizer = _optimizer(model, config)
    scheduler = _scheduler(optimizer, config, steps_per_epoch)
    ema = (
        torch.optim.swa_utils.AveragedModel(
            model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(config.ema_decay)
        )
        if config.ema_decay > 0
        else None
    )
    return gen, scaler, optimizer, scheduler, ema


def _save_checkpoint(path: Path, state: dict, epoch: int, val_loss: float, config: TrainConfig) -> None:
    _atomic_save({"model": state, "epoch": epoch, "val_loss": val_loss, "config": asdict(config)}, path)


def _atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` through :func:`nextloc.storage.atomic_path`: never a partial file at ``path``."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The raw bytes of a tensor (any dtype, any device)."""
    return tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()


def _resume_fingerprint(
    model: nn.Module, train: SampleTensors, val: SampleTensors, config: TrainConfig
) -> str:
    """What a resume file must have been written for: the same run, up to where it stopped.

    Covers the whole training config, the device type, the model's class, configuration, structure
    (``repr``, which includes e.g. dropout rates), state-dict keys, shapes, dtypes and initial values (so
    the model must be built the same way, seed included), and every feature of the train and val samples.
    """
    digest = hashlib.blake2b(digest_size=16)

    def add(text: str) -> None:
        digest.update(text.encode() + b"\n")

    add(f"nextloc resume format {RESUME_FORMAT}")
    add(json.dumps(asdict(config), sort_keys=True))
    add(f"device {train.device.type}")
    add(f"{type(model).__module__}.{type(model).__qualname__}")
    model_config = getattr(model, "config", None)
    if is_dataclass(model_config) and not isinstance(model_config, type):
        add(json.dumps(asdict(model_config), sort_keys=True, default=str))
    add(repr(model))
    for name, tensor in model.state_dict().items():
        add(f"{name} {tuple(tensor.shape)} {tensor.dtype}")
        digest.update(_tensor_bytes(tensor))
    for split in (train, val):
        add(f"samples {len(split)}")
        if len(split):
            batch = split.batch(torch.arange(len(split), device=split.device))
            for f in fields(batch):
                digest.update(_tensor_bytes(getattr(batch, f.name)))
    return digest.hexdigest()


def _rng_state(gen: torch.Generator) -> dict[str, Any]:
    """Every random number generator the loop draws from (NumPy's as tensors, so the file loads weights-only)."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "batches": gen.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": random.getstate(),
        "dropout": dropout_draws.get_state(),
    }


def _set_rng_state(rng: dict[str, Any], gen: torch.Generator) -> None:
    """Restore what :func:`_rng_state` captured."""
    gen.set_state(rng["batches"])
    torch.set_rng_state(rng["torch"])
    if torch.cuda.is_available():
        if len(rng["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(rng["cuda"])
        else:
            logger.warning(
                "CUDA device count changed since the resume state was written; CUDA RNG not restored"
            )
    state = rng["numpy"]
    np.random.set_state(
        (
            state["name"],
            state["keys"].numpy().astype(np.uint32),
            state["pos"],
            state["has_gauss"],
            state["cached_gaussian"],
        )
    )
    version, internal, gauss_next = rng["python"]
    random.setstate((version, tuple(internal), gauss_next))
    dropout_draws.set_state(rng["dropout"])


def _loop_state(
    progress: _Progress,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR | None,
    scaler: torch.amp.GradScaler,
    ema: torch.optim.swa_utils.AveragedModel | None,
    gen: torch.Generator,
) -> dict[str, Any]:
    """Everything the loop needs to continue after ``progress.epoch`` (live tensors: copy to keep it)."""
    return {
        "format": RESUME_FORMAT,
        "progress": _fields(progress),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict(),
        "ema": ema.state_dict() if ema is not None else None,
        "rng": _rng_state(gen),
    }


def _fields(progress: _Progress) -> dict[str, Any]:
    return {f.name: getattr(progress, f.name) for f in fields(progress)}


def _read_resume(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The resume state at ``path`` if it exists, is readable and was written for ``fingerprint``; else None.

    Anything unusable is ignored with a warning (the caller then trains from scratch), never raised.
    """
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated or corrupt: zip, unpickling, EOF and I/O errors alike
        logger.warning(
            "ignoring unreadable resume file %s (%s: %s); training from scratch",
            path,
            type(exc).__name__,
            exc,
        )
        return None
    if (
        not isinstance(state, dict)
        or state.get("format") != RESUME_FORMAT
        or not _RESUME_KEYS.issubset(state)
        or not isinstance(state["progress"], dict)
        or set(state["progress"]) != {f.name for f in fields(_Progress)}
    ):
        logger.warning(
            "ignoring %s: not a resume file of format %d; training from scratch", path, RESUME_FORMAT
        )
        return None
    if state["fingerprint"] != fingerprint:
        logger.warning(
            "ignoring resume file %s: written for another training config, model, device or data; "
            "training from scratch",
            path,
        )
        return None
    return state


def _restore(
    state: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR | None,
    scaler: torch.amp.GradScaler,
    ema: torch.optim.swa_utils.AveragedModel | None,
    gen: torch.Generator,
) -> _Progress:
    """Load a resume state (from :func:`_read_resume`) into the run's objects; return its progress."""
    current = model.state_dict()
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if (scheduler is None) != (state["scheduler"] is None) or (ema is None) != (state["ema"] is None):
        raise ValueError("scheduler/EMA presence differs from the resume state")
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    if ema is not None:
        ema.load_state_dict(state["ema"])
    progress = _Progress(**state["progress"])
    # the best weights live where the model does (they were mapped to the CPU for loading)
    progress.best_state = {k: v.to(current[k].device) for k, v in progress.best_state.items()}
    _set_rng_state(state["rng"], gen)
    return progress
