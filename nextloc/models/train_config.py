"""The optimisation recipe of a training run: :class:`TrainConfig`.

Typed like the preprocessing configs (:mod:`nextloc.config`): frozen, ``extra="forbid"``, so a misspelt key or a
value outside a fixed set fails when the config is made, before any work, naming the key and what it allows.
Each neural model kind's recipe is its entry in the kind registry (:mod:`nextloc.models.registry`);
:func:`nextloc.models.registry.training_recipe` looks it up and applies overrides.
"""

from __future__ import annotations

from typing import ClassVar, Literal, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, model_validator

from nextloc.config import _NamesUnknownKeys

Recipe = Literal["mhsa", "pointer"]
Monitor = Literal["val_loss", "val_acc@1", "val_mrr", "val_place_acc@1", "val_place_mrr"]
DropoutRng = Literal["torch", "pcg64"]


class TrainConfig(_NamesUnknownKeys):
    """Optimisation recipe; ``training_recipe("pointer")`` (:mod:`nextloc.models.registry`) gives the pointer's values.

    ``recipe`` names the loop's schedule family (``mhsa``: per-batch warmup and linear decay, Adam;
    ``pointer``: per-epoch warmup and cosine, AdamW). ``mhsa`` and ``pointer`` differ from the reference
    recipes only in their batches: ``training_recipe(kind, bucket=False)`` gives the reference's plain shuffled
    batches.
    """

    option_label: ClassVar[str] = "training option"

    recipe: Recipe = "mhsa"
    batch_size: int = 32
    eval_batch_size: int = 512
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-6
    label_smoothing: float = 0.0
    clip_norm: float = 1.0
    max_epochs: int = 100
    warmup_epochs: int = 2
    decay_epochs: int = 50
    min_lr: float = 1e-6
    patience: int = 3
    min_epochs: int = 0
    es_delta: float = 1e-3
    lr_drops: int = 2
    monitor: Monitor = "val_loss"
    select_best: bool = True
    refit_on_train_val: bool = False
    drop_last: bool = True
    bucket: bool = False
    bucket_pool: int = Field(50, description="Batches per length-sorted pool when ``bucket`` (>= 1).")
    amp: bool = True
    seed: int = 0
    deterministic: bool = True
    num_threads: int | None = None
    dropout_rng: DropoutRng = Field(
        "torch",
        description="CPU: where dropout's masks come from (nextloc.models.dropout): 'torch', F.dropout's draws "
        "from torch's global generator (the reference's bits); 'pcg64', a NumPy PCG64 stream of its own "
        "(about a tenth of the cost, other masks). CUDA: F.dropout either way.",
    )

    @model_validator(mode="after")
    def _check_pool(self) -> TrainConfig:
        if self.bucket_pool < 1:
            raise ValueError(f"bucket_pool must be >= 1 batch, got {self.bucket_pool}")
        return self


def explain(err: ValidationError, model: type[BaseModel]) -> str:
    """``err`` as one line per problem, prefixed by the path to the model that rejected it (``mhsa: ``):
    ``<label> <key>=<value>: expected one of [...]`` for a value outside a fixed set, the validator's own
    words otherwise. ``<label>`` is the rejecting model's ``option_label``."""
    lines = []
    for problem in err.errors():
        loc = [str(part) for part in problem["loc"]]
        owner, depth = model, 0
        while depth < len(loc) and (inner := _model_of(owner, loc[depth])) is not None:
            owner, depth = inner, depth + 1
        prefix = f"{'.'.join(loc[:depth])}: " if depth else ""
        key = ".".join(loc[depth:])
        field = owner.model_fields.get(key)
        choices = get_args(field.annotation) if field and get_origin(field.annotation) is Literal else ()
        message = str(problem["msg"]).removeprefix("Value error, ")
        label = getattr(owner, "option_label", "option")
        if not key:
            lines.append(prefix + message)
        elif choices:
            lines.append(f"{prefix}{label} {key}={problem['input']!r}: expected one of {list(choices)}")
        else:
            lines.append(f"{prefix}{label} {key}={problem['input']!r}: {message}")
    return "; ".join(lines)


def _model_of(owner: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The model class field ``name`` of ``owner`` holds (``X`` or ``X | None``), if any."""
    field = owner.model_fields.get(name)
    for candidate in (field.annotation, *get_args(field.annotation)) if field else ():
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None
