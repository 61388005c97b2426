"""The registry of model kinds: one frozen :class:`Kind` entry per kind, and nothing declared elsewhere.

A kind's entry says everything the rest of nextloc asks about it: its family (``neural``: a network trained
by :func:`nextloc.training.train.fit`; ``ensemble``: seeds of a neural member kind averaged; ``baseline``: counts
fitted on train, :mod:`nextloc.models.baselines`; ``routine``: the user's routine ranked, :mod:`nextloc.routine.ranking`),
its classes, presets, training recipe, output type and a one-line description. Every list of kinds (the
flows' choices, the neural kinds the overrides may name, the help text) is derived from :data:`KINDS`.

Adding a kind is its module plus one entry in :data:`KINDS`.

The entries name their model classes as ``"module:Class"`` strings, imported on first use
(:attr:`Kind.model_class`): reading the registry (every flow, ``nextloc run``'s cached path) imports neither
torch nor LightGBM. The config dataclasses are torch-free (:mod:`nextloc.models.configs`) and held as classes:
the typed overrides read their fields.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from pydantic import ValidationError

from nextloc.models.configs import LSTMConfig, MHSAConfig, PointerConfig
from nextloc.models.train_config import TrainConfig, explain

Family = Literal["neural", "ensemble", "baseline", "routine"]
FAMILIES: tuple[Family, ...] = ("neural", "ensemble", "baseline", "routine")


@dataclass(frozen=True, kw_only=True)
class Kind:
    """One model kind.

    Args:
        name: the kind's name (``--model``, MLflow's registered model, ``results/<name>/``).
        family: ``neural``, ``ensemble``, ``baseline`` or ``routine`` (see the module docstring).
        description: one line for help text.
        log_prob_output: whether the model's scores are log-probabilities (True) or logits (False).
        model: the model class as ``"module:Class"``, imported on first use (:attr:`model_class`). Neural: an
            ``nn.Module`` taking ``config``; ensemble: the module averaging the members; baseline: a class
            with ``fit``/``scores``/``state``/``from_state``; routine: :mod:`nextloc.routine.ranking`'s.
        config: neural: the frozen config dataclass ``model`` takes (:mod:`nextloc.models.configs`).
        presets: neural: config values that differ from ``config``'s defaults.
        recipe: neural: the training recipe (:func:`training_recipe` starts from it).
        member: ensemble: the neural kind trained for each member.
        size: ensemble: the number of members. Seed ``s`` trains the member kind with seeds
            ``s * size .. s * size + size - 1``.
    """

    name: str
    family: Family
    description: str
    log_prob_output: bool
    model: str
    config: type | None = None
    presets: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    recipe: TrainConfig | None = None
    member: str | None = None
    size: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "presets", MappingProxyType(dict(self.presets)))
        if self.model.count(":") != 1:
            raise ValueError(f"{self.family} kind {self.name!r} needs a model class as 'module:Class'")
        if self.family == "neural" and (self.config is None or self.recipe is None):
            raise ValueError(f"neural kind {self.name!r} needs a config and a recipe")
        if self.family == "ensemble" and (self.member is None or self.size < 2):
            raise ValueError(f"ensemble kind {self.name!r} needs a member kind and a size >= 2")

    @property
    def model_class(self) -> type:
        """The model class, imported now (the network and baseline modules import torch)."""
        module, name = self.model.split(":")
        return getattr(importlib.import_module(module), name)

    @property
    def trained(self) -> Kind:
        """The kind whose network, config and recipe training uses: the member of an ensemble, else itself."""
        return kind(self.member) if self.member else self

    @property
    def is_neural(self) -> bool:
        """A network (or an ensemble of them): takes model and training overrides."""
        return self.family in ("neural", "ensemble")


def _recipe(base: TrainConfig | None = None, **changes: Any) -> TrainConfig:
    return TrainConfig.model_validate({**(base or TrainConfig()).model_dump(), **changes})


# The reference recipes (reference-protocol.md section 2) with the batches and dropout draws chosen on
# validation (nextloc.training.train's docstring has the numbers).
MHSA_RECIPE = _recipe(recipe="mhsa", bucket=True, bucket_pool=8)
LSTM_RECIPE = _recipe(recipe="mhsa", dropout_rng="pcg64")
POINTER_RECIPE = _recipe(
    recipe="pointer",
    batch_size=128,
    lr=6.5e-4,
    betas=(0.9, 0.98),
    eps=1e-9,
    weight_decay=0.015,
    label_smoothing=0.03,
    clip_norm=0.8,
    max_epochs=50,
    warmup_epochs=5,
    decay_epochs=45,
    patience=5,
    min_epochs=8,
    es_delta=0.0,
    lr_drops=0,
    drop_last=False,
    bucket=True,
    bucket_pool=4,
    dropout_rng="pcg64",
)
# nextloc's schedule: a cosine that anneals within 15 epochs; the epoch is chosen on validation place MRR
# (the product's metric) and the model stays trained on train (the reference data budget).
POINTER_PLUS_RECIPE = _recipe(
    POINTER_RECIPE,
    monitor="val_place_mrr",
    warmup_epochs=3,
    decay_epochs=15,
    max_epochs=20,
    patience=3,
    min_epochs=0,
    bucket_pool=50,
)

_ENTRIES = (
    Kind(
        name="mhsa",
        family="neural",
        description="MHSA, the reference transformer",
        log_prob_output=False,
        model="nextloc.models.mhsa:MHSA",
        config=MHSAConfig,
        recipe=MHSA_RECIPE,
    ),
    Kind(
        name="mhsa_diagonal",
        family="neural",
        description="MHSA with diagonal-masked self-attention (ablation)",
        log_prob_output=False,
        model="nextloc.models.mhsa:MHSA",
        config=MHSAConfig,
        presets={"diagonal_mask": True},
        recipe=MHSA_RECIPE,
    ),
    Kind(
        name="pointer",
        family="neural",
        description="the reference pointer-generator (Pointer V45)",
        log_prob_output=True,
        model="nextloc.models.pointer:PointerGenerator",
        config=PointerConfig,
        recipe=POINTER_RECIPE,
    ),
    Kind(
        name="pointer_plus",
        family="neural",
        description="nextloc's pointer: causal encoder, chosen on place MRR",
        log_prob_output=True,
        model="nextloc.models.pointer:PointerGenerator",
        config=PointerConfig,
        # chosen on validation place MRR (5 seeds each): no copying of the unseen token, and unknown-place
        # augmentation so that the 1s of later histories mean something to the model
        presets={"causal": True, "mask_unknown_copy": True, "unknown_dropout": 0.1},
        recipe=POINTER_PLUS_RECIPE,
    ),
    Kind(
        name="pointer_plus_ensemble",
        family="ensemble",
        description="five pointer_plus seeds, probabilities averaged",
        log_prob_output=True,
        model="nextloc.models.ensemble:SeedEnsemble",
        member="pointer_plus",
        size=5,
    ),
    Kind(
        name="lstm",
        family="neural",
        description="the reference LSTM",
        log_prob_output=False,
        model="nextloc.models.lstm:LSTMModel",
        config=LSTMConfig,
        recipe=LSTM_RECIPE,
    ),
    Kind(
        name="markov",
        family="baseline",
        description="first-order Markov chain (per user, then global)",
        log_prob_output=False,
        model="nextloc.models.baselines:MarkovBaseline",
    ),
    Kind(
        name="most_frequent",
        family="baseline",
        description="the most visited place of the history",
        log_prob_output=False,
        model="nextloc.models.baselines:MostFrequentBaseline",
    ),
    Kind(
        name="last_location",
        family="baseline",
        description="the last place of the history",
        log_prob_output=False,
        model="nextloc.models.baselines:LastLocationBaseline",
    ),
    Kind(
        name="routine",
        family="routine",
        description="weighted routine features (weights chosen on val)",
        log_prob_output=True,
        model="nextloc.routine.ranking:RoutineRule",
    ),
    Kind(
        name="ranker",
        family="routine",
        description="LightGBM LambdaRank over routine features",
        log_prob_output=True,
        model="nextloc.routine.ranking:RoutineRanker",
    ),
    Kind(
        name="ranker_refit",
        family="routine",
        description="the ranker's trees refit on train + val (outside the reference data budget)",
        log_prob_output=True,
        model="nextloc.routine.ranking:RoutineRanker",
    ),
)

KINDS: Mapping[str, Kind] = MappingProxyType({entry.name: entry for entry in _ENTRIES})

#: What is trained when no kinds are named (``make run``, ``nextloc run`` and ``train``, the flows), in order.
DEFAULT_KINDS: tuple[str, ...] = ("markov", "mhsa", "pointer_plus", "ranker")

#: Kinds that existed and were removed, and why: naming one (``--model``, a registered bundle) says so.
REMOVED_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "pointer_plus_refit": "its new-place head was fit on validation answers of a network refit on them "
        "(cross-fitting a network K times costs K trainings); train pointer_plus instead",
    }
)


def kind(name: str) -> Kind:
    """The registry entry of ``name``.

    Raises:
        ValueError: ``name`` is not a registered kind (the message lists them), or a removed one (the message
            says why, in one line).
    """
    try:
        return KINDS[name]
    except KeyError:
        if name in REMOVED_KINDS:
            raise ValueError(f"model kind {name!r} was removed: {REMOVED_KINDS[name]}") from None
        raise ValueError(f"unknown model kind {name!r}; expected one of {list(KINDS)}") from None


def kinds(*families: Family) -> tuple[str, ...]:
    """The kinds of ``families`` (all kinds when none is given), in registry order."""
    return tuple(k.name for k in KINDS.values() if not families or k.family in families)


def neural_kinds() -> tuple[str, ...]:
    """The kinds that take model and training overrides: networks and their seed ensembles."""
    return kinds("neural", "ensemble")


def recipe_of(name: str) -> TrainConfig:
    """The training recipe of neural kind ``name`` (an ensemble trains its member kind's).

    Raises:
        ValueError: ``name`` is not a neural kind (the message lists the recipes).
    """
    entry = KINDS.get(name)
    if entry is None or entry.family != "neural":
        raise ValueError(f"unknown recipe {name!r}; expected one of {list(kinds('neural'))}")
    assert entry.recipe is not None  # checked by Kind
    return entry.recipe


def training_recipe(name: str, /, **overrides: Any) -> TrainConfig:
    """The training recipe of neural kind ``name`` (:func:`recipe_of`) with ``overrides`` applied.

    Raises:
        ValueError: an unknown kind, or an override :class:`TrainConfig` rejects; one line per problem,
            naming the option and the values it allows (:func:`nextloc.models.train_config.explain`).
    """
    try:
        return TrainConfig.model_validate({**recipe_of(name).model_dump(), **overrides})
    except ValidationError as err:
        raise ValueError(explain(err, TrainConfig)) from None
