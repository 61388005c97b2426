"""Next-location models, built from their entries in the kind registry (:mod:`nextloc.models.registry`).

Every model takes a frozen config dataclass, consumes a :class:`nextloc.models.batch.Batch` and returns
``(B, total_loc_num)`` scores over the whole location vocabulary (ids 0 and 1 included, nothing masked):
logits or log-probabilities, as its entry's ``log_prob_output`` says.

This package imports no torch: the registry names the networks by ``"module:Class"``
(:attr:`~nextloc.models.registry.Kind.model_class` imports one when a model is built) and the configs live
in :mod:`nextloc.models.configs`. The networks themselves are :mod:`nextloc.models.mhsa`,
:mod:`nextloc.models.lstm`, :mod:`nextloc.models.pointer` and :mod:`nextloc.models.ensemble`. What they read
is :mod:`nextloc.models.batch` (a split's samples as device tensors, a :class:`~nextloc.models.batch.Batch` per
step); each kind's training recipe is a :class:`~nextloc.models.train_config.TrainConfig`. A registered model reads
packed histories (:mod:`nextloc.models.packed`, the format's one home) through
:class:`~nextloc.models.scorer.PackedScorer` (:mod:`nextloc.models.scorer`: its weights in a bundle).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any

from nextloc.models import registry
from nextloc.models.configs import LSTMConfig, MHSAConfig, PointerConfig
from nextloc.models.registry import KINDS, Kind, kinds, neural_kinds

if TYPE_CHECKING:
    from torch import nn

_VOCABULARY = frozenset({"total_loc_num", "total_user_num"})


def build_model(kind: str, total_loc_num: int, total_user_num: int, **overrides: Any) -> nn.Module:
    """Build a neural kind with its presets plus ``overrides``.

    Args:
        kind: a kind of family ``neural`` (e.g. ``"mhsa"``, ``"pointer"``, ``"lstm"``).
        total_loc_num: location vocabulary size (output width).
        total_user_num: user vocabulary size.
        **overrides: config fields to change, e.g. ``d_model=64`` or ``diagonal_mask=True``.

    Returns:
        The model, freshly initialised.

    Raises:
        ValueError: unknown ``kind`` or an override that is not a field of the kind's config.
    """
    entry = _network(kind)
    check_model_overrides(kind, overrides)
    params = {**entry.presets, **overrides}  # an override wins over the kind's preset
    config = entry.config(total_loc_num=total_loc_num, total_user_num=total_user_num, **params)
    return entry.model_class(config)


def model_settings(kind: str) -> tuple[str, ...]:
    """The config keys a neural kind's model overrides may set (its config's fields but the vocabulary sizes)."""
    config = _network(kind).config
    return tuple(f.name for f in fields(config) if f.name not in _VOCABULARY)


def check_model_overrides(kind: str, overrides: Mapping[str, Any]) -> None:
    """Raise what :func:`build_model` would for ``kind`` and ``overrides``, building no network: an
    unknown key (named with the allowed ones), or a value the kind's config rejects.

    Raises:
        ValueError: naming the key.
    """
    entry = _network(kind)
    allowed = model_settings(kind)
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {kind!r} config key(s) {unknown}; allowed: {sorted(allowed)}")
    entry.config(total_loc_num=2, total_user_num=2, **{**entry.presets, **overrides})


def _network(kind: str) -> Kind:
    entry = registry.kind(kind)
    if entry.family != "neural":
        raise ValueError(
            f"{kind!r} is not a network (family {entry.family}); expected one of {list(kinds('neural'))}"
        )
    return entry


def model_config(model: nn.Module) -> dict[str, Any]:
    """A model's full config as plain data: ``asdict(model.config)``, or for a :class:`SeedEnsemble` its
    members' configs. :func:`model_from_config` rebuilds the model from it."""
    from nextloc.models.ensemble import SeedEnsemble  # torch: imported already, as ``model`` is a module

    if isinstance(model, SeedEnsemble):
        return {
            "members": [asdict(member.config) for member in model.members],
            "log_prob_output": model.log_prob_output,
        }
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"a {type(model).__name__} has no config dataclass")
    return asdict(config)


def model_from_config(kind: str, config: dict[str, Any]) -> nn.Module:
    """Rebuild a model from its full config (:func:`model_config`), freshly initialised.

    The inverse of storing ``model_config(model)`` beside a model's weights: load the weights into the result.

    Raises:
        ValueError: unknown ``kind`` or a config key the kind's config does not have.
    """
    entry = registry.kind(kind)
    if entry.family == "ensemble":
        member = entry.trained
        if not isinstance(config.get("members"), list) or not config["members"]:
            raise ValueError(f"model config of ensemble kind {kind!r} needs a non-empty 'members' list")
        members = [model_from_config(member.name, m) for m in config["members"]]
        return entry.model_class(members, bool(config.get("log_prob_output", member.log_prob_output)))
    entry = _network(kind)
    unknown = sorted(set(config) - {f.name for f in fields(entry.config)})
    if unknown:
        raise ValueError(f"model config of kind {kind!r} has unknown key(s) {unknown}")
    return entry.model_class(entry.config(**config))


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (``requires_grad``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = [
    "KINDS",
    "Kind",
    "LSTMConfig",
    "MHSAConfig",
    "PointerConfig",
    "build_model",
    "check_model_overrides",
    "count_parameters",
    "registry",
    "kinds",
    "model_config",
    "model_from_config",
    "model_settings",
    "neural_kinds",
]
