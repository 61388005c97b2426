"""The recipes' optimiser, learning-rate schedules and early stopping (:mod:`nextloc.training.train` runs them).

* Optimiser: Adam (mhsa recipe) or AdamW (pointer recipe) over the trainable parameters, foreach kernels.
* Schedule, mhsa recipe: per optimiser step, linear warmup then linear decay to 0 (transformers'
  ``get_linear_schedule_with_warmup``), stepped until the first early stop.
* Schedule, pointer recipe: per epoch, linear warmup then a cosine down to ``min_lr``.
* Early stopping: :class:`EarlyStopping`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from nextloc.models.train_config import TrainConfig


@dataclass
class EarlyStopping:
    """The recipe's early stop: it owns the best score, loss, epoch and weights and the patience counters.

    An epoch improves when its score (lower is better) is below ``best_score - delta``. After ``patience``
    epochs without improvement (from epoch ``min_epochs`` on), training stops when ``lr_drops`` drops have
    been spent; otherwise it is a drop (mhsa recipe): the caller reloads :attr:`best_state` and multiplies
    the rate by 0.1, and the per-step schedule stops for good (:attr:`schedule_active`).
    """

    patience: int
    min_epochs: int
    delta: float
    lr_drops: int
    keep_best: (
        bool  # copy the weights of each improving epoch into best_state (else it keeps the initial ones)
    )
    best_state: dict[str, torch.Tensor]
    best_score: float = math.inf
    best_loss: float = math.inf
    best_epoch: int = 0
    bad_epochs: int = 0
    drops: int = 0

    @classmethod
    def for_config(cls, config: TrainConfig, model: nn.Module) -> EarlyStopping:
        """The recipe's rules, with ``model``'s current weights (copied) as the best so far."""
        return cls(
            patience=config.patience,
            min_epochs=config.min_epochs,
            delta=config.es_delta,
            lr_drops=config.lr_drops,
            keep_best=config.select_best,
            best_state=copy.deepcopy(model.state_dict()),
        )

    @property
    def schedule_active(self) -> bool:
        """Whether the per-step schedule still runs: until the first drop."""
        return self.drops == 0

    def update(
        self, epoch: int, score: float, loss: float, model: nn.Module
    ) -> Literal["improved", "worse", "drop", "stop"]:
        """Record epoch ``epoch``'s validation ``score`` and ``loss`` (``model`` holds its weights); decide."""
        if score < self.best_score - self.delta:
            self.best_score, self.best_loss, self.best_epoch = score, loss, epoch
            self.bad_epochs = 0
            if self.keep_best:
                self.best_state = copy.deepcopy(model.state_dict())
            return "improved"
        self.bad_epochs += 1
        if self.bad_epochs < self.patience or epoch < self.min_epochs:
            return "worse"
        if self.drops >= self.lr_drops:
            return "stop"
        self.drops += 1
        self.bad_epochs = 0
        return "drop"


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """The recipe's optimiser over ``model``'s trainable parameters."""
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


def steps_per_epoch(n: int, config: TrainConfig) -> int:
    """Optimiser steps in an epoch over ``n`` training samples."""
    return n // config.batch_size if config.drop_last else math.ceil(n / config.batch_size)


def make_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, steps: int
) -> torch.optim.lr_scheduler.LambdaLR | None:
    """mhsa: per-step linear warmup then linear decay to 0 (transformers' get_linear_schedule_with_warmup),
    with ``steps`` optimiser steps an epoch; None for the pointer recipe (its rate is set per epoch)."""
    if config.recipe != "mhsa":
        return None
    warmup = config.warmup_epochs * steps
    total = config.decay_epochs * steps

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def pointer_lr(epoch: int, config: TrainConfig) -> float:
    """Per-epoch warmup then cosine (epoch counted from 0)."""
    if epoch < config.warmup_epochs:
        return config.lr * (epoch + 1) / config.warmup_epochs
    progress = (epoch - config.warmup_epochs) / max(1, config.decay_epochs)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's rate."""
    for group in optimizer.param_groups:
        group["lr"] = lr
