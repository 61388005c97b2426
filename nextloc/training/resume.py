"""Resume files of :func:`nextloc.training.train.fit`: what a run is (its fingerprint), and its state after an epoch.

After every completed epoch the trainer writes the whole loop state atomically (:func:`save`): the model,
optimizer, scheduler and gradient scaler, the loop's bookkeeping (early-stopping counters and best weights,
history, timing), and every random number generator the loop draws from (the batch-shuffling generator,
torch's global CPU and CUDA generators, NumPy's and Python's global ones and the PCG64 dropout stream's).
A run that finds a file written for its own fingerprint (:func:`read`) continues after its epoch
(:func:`restore`); after a crash, even a SIGKILL, the weights, history and best epoch come out bit-identical
to an uninterrupted run on the same machine. Anything else (another run's file, a truncated or corrupt
one, another layout) is ignored with a warning and training starts from scratch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nextloc.models.batch import SampleTensors
from nextloc.models.dropout import PCG64Dropout
from nextloc.models.train_config import TrainConfig
from nextloc.storage import atomic_path
from nextloc.training.optim import EarlyStopping

logger = logging.getLogger(__name__)

RESUME_FORMAT = 3  # bump when the resume file layout changes (older files are then ignored)
_KEYS = frozenset({"format", "fingerprint", "progress", "model", "optimizer", "scheduler", "scaler", "rng"})


@dataclass
class TrainingObjects:
    """What a training run advances besides its bookkeeping; all of it goes into the resume file."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR | None
    scaler: torch.amp.GradScaler
    batches: torch.Generator  # shuffles the training batches
    dropout: PCG64Dropout | None  # the PCG64 dropout masks' source, where the recipe uses one


@dataclass
class Progress:
    """The loop's bookkeeping, saved with every resume state (modules and RNGs are saved beside it)."""

    stopping: EarlyStopping
    epoch: int = 0  # last completed epoch
    finished: bool = False  # the loop ended (max_epochs reached or early stopping exhausted)
    history: list[dict[str, float]] = field(default_factory=list)
    # timing: not covered by the identical-results guarantee
    elapsed: float = 0.0
    seconds_to_best: float = 0.0
    n_trained: int = 0
    train_loop_seconds: float = 0.0

    def state(self) -> dict[str, Any]:
        """Plain values for the resume file."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        stopping = self.stopping
        return {**values, "stopping": {f.name: getattr(stopping, f.name) for f in fields(stopping)}}

    @classmethod
    def from_state(cls, state: dict[str, Any], model: nn.Module) -> Progress:
        """Rebuild from :meth:`state`, the best weights moved to where ``model``'s live."""
        stopping = EarlyStopping(**state["stopping"])
        current = model.state_dict()
        stopping.best_state = {k: v.to(current[k].device) for k, v in stopping.best_state.items()}
        return cls(**{**state, "stopping": stopping})


_PROGRESS_KEYS = frozenset(f.name for f in fields(Progress))


def _config_json(config: TrainConfig) -> str:
    """The training config as canonical JSON (part of the fingerprint)."""
    return json.dumps(config.model_dump(mode="json"), sort_keys=True)


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The raw bytes of a tensor (any dtype, any device)."""
    return tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()


def fingerprint(model: nn.Module, train: SampleTensors, val: SampleTensors, config: TrainConfig) -> str:
    """What a resume file must have been written for: the same run, up to where it stopped.

    Covers the resume format, the whole training config, the device type, the model's class,
    configuration, structure (``repr``, which includes e.g. dropout rates), state-dict keys, shapes, dtypes
    and initial values (so the model must be built the same way, seed included), and every feature of the
    train and val samples.
    """
    digest = hashlib.blake2b(digest_size=16)

    def add(text: str) -> None:
        digest.update(text.encode() + b"\n")

    add(f"nextloc resume format {RESUME_FORMAT}")
    add(_config_json(config))
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


def rng_state(objects: TrainingObjects) -> dict[str, Any]:
    """Every random number generator the loop draws from (NumPy's as tensors, so the file loads weights-only)."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "batches": objects.batches.get_state(),
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
        "dropout": objects.dropout.state if objects.dropout is not None else None,
    }


def set_rng_state(rng: dict[str, Any], objects: TrainingObjects) -> None:
    """Restore what :func:`rng_state` captured."""
    objects.batches.set_state(rng["batches"])
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
    if objects.dropout is not None:
        objects.dropout.set_state(rng["dropout"])


def save(path: Path, fingerprint: str, objects: TrainingObjects, progress: Progress) -> None:
    """Write the loop state after an epoch atomically to ``path``."""
    state = {
        "format": RESUME_FORMAT,
        "fingerprint": fingerprint,
        "progress": progress.state(),
        "model": objects.model.state_dict(),
        "optimizer": objects.optimizer.state_dict(),
        "scheduler": objects.scheduler.state_dict() if objects.scheduler is not None else None,
        "scaler": objects.scaler.state_dict(),
        "rng": rng_state(objects),
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def read(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The resume state at ``path`` if it exists, is readable, has this format and layout and was written
    for ``fingerprint``; else None.

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
        or not _KEYS.issubset(state)
        or not isinstance(state["progress"], dict)
        or set(state["progress"]) != _PROGRESS_KEYS
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


def restore(state: dict[str, Any], objects: TrainingObjects) -> Progress:
    """Load a state from :func:`read` into the run's objects and generators; return its progress.

    Raises:
        Exception: whatever loading a damaged state raises (the objects may then be half loaded).
    """
    objects.model.load_state_dict(state["model"])
    objects.optimizer.load_state_dict(state["optimizer"])
    if (objects.scheduler is None) != (state["scheduler"] is None):
        raise ValueError("scheduler presence differs from the resume state")
    if objects.scheduler is not None:
        objects.scheduler.load_state_dict(state["scheduler"])
    objects.scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"], objects)
    return Progress.from_state(state["progress"], objects.model)
