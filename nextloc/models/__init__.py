"""Next-location models and their registry.

Every model takes a frozen config dataclass, consumes a :class:`nextloc.data.Batch` and returns
``(B, total_loc_num)`` scores over the whole location vocabulary (ids 0 and 1 included, nothing masked):
logits for ``"mhsa"`` and ``"lstm"``, log-probabilities for ``"pointer"`` (see :data:`OUTPUT_IS_LOG_PROB`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

from torch import nn

from nextloc.models.ensemble import SeedEnsemble
from nextloc.models.lstm import LSTMConfig, LSTMModel
from nextloc.models.mhsa import MHSA, MHSAConfig
from nextloc.models.pointer import PointerConfig, PointerGenerator

MODEL_REGISTRY: dict[str, tuple[type, type[nn.Module]]] = {
    "mhsa": (MHSAConfig, MHSA),
    "mhsa_diagonal": (MHSAConfig, MHSA),
    "pointer": (PointerConfig, PointerGenerator),
    "pointer_plus": (PointerConfig, PointerGenerator),
    "pointer_plus_refit": (PointerConfig, PointerGenerator),
    "lstm": (LSTMConfig, LSTMModel),
}

# Defaults that differ from the config dataclass's reference values, per kind. ``mhsa_diagonal`` is the
# reference MHSA with the diagonal-masked self-attention ablation (its own row, trained as ``mhsa``).
# ``pointer`` is the reference Pointer V45; ``pointer_plus`` is nextloc's improved variant (causal encoder; trained with the
# ``pointer_plus`` recipe, see :mod:`nextloc.train`); ``pointer_plus_refit`` is the same network refit on
# train + val (its own row, outside the reference data budget).
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "mhsa_diagonal": {"diagonal_mask": True},
    # chosen on validation place MRR (5 seeds each): no copying of the unseen token, and unknown-place
    # augmentation so that the 1s of later histories mean something to the model
    "pointer_plus": {"causal": True, "mask_unknown_copy": True, "unknown_dropout": 0.1},
    "pointer_plus_refit": {"causal": True},
}

# Seed ensembles: kind -> (member kind, number of members). Seed ``s`` of an ensemble trains the member kind
# with seeds ``s * size .. s * size + size - 1`` (so seed 0 averages the member kind's seeds 0..size-1).
ENSEMBLES: dict[str, tuple[str, int]] = {"pointer_plus_ensemble": ("pointer_plus", 5)}

# Whether ``forward`` returns log-probabilities (True) or unnormalised logits (False).
OUTPUT_IS_LOG_PROB: dict[str, bool] = {
    "mhsa": False,
    "mhsa_diagonal": False,
    "pointer": True,
    "pointer_plus": True,
    "pointer_plus_refit": True,
    "pointer_plus_ensemble": True,
    "lstm": False,
}


def build_model(kind: str, total_loc_num: int, total_user_num: int, **overrides: Any) -> nn.Module:
    """Build a registered model with its reference defaults plus ``overrides``.

    Args:
        kind: ``"mhsa"``, ``"pointer"`` or ``"lstm"``.
        total_loc_num: location vocabulary size (output width).
        total_user_num: user vocabulary size.
        **overrides: config fields to change, e.g. ``d_model=64`` or ``diagonal_mask=True``.

    Returns:
        The model, freshly initialised.

    Raises:
        ValueError: unknown ``kind`` or an override that is not a field of the kind's config.
    """
    check_model_overrides(kind, overrides)
    config_cls, model_cls = MODEL_REGISTRY[kind]
    params = {**MODEL_PRESETS.get(kind, {}), **overrides}
    config = config_cls(total_loc_num=total_loc_num, total_user_num=total_user_num, **params)
    return model_cls(config)


def check_model_overrides(kind: str, overrides: Mapping[str, Any]) -> None:
    """Raise what :func:`build_model` would for ``kind`` and ``overrides``, without building anything.

    Raises:
        ValueError: unknown ``kind`` or an override that is not a field of the kind's config.
    """
    if kind not in MODEL_REGISTRY:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {sorted(MODEL_REGISTRY)}")
    config_cls, _ = MODEL_REGISTRY[kind]
    allowed = {f.name for f in fields(config_cls)} - {"total_loc_num", "total_user_num"}
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise ValueError(f"unknown {kind!r} config key(s) {unknown}; allowed: {sorted(allowed)}")


def model_config(model: nn.Module) -> dict[str, Any]:
    """A model's full config as plain data: ``asdict(model.config)``, or for a :class:`SeedEnsemble` its
    members' configs. :func:`model_from_config` rebuilds the model from it."""
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
    if kind in ENSEMBLES:
        member_kind = ENSEMBLES[kind][0]
        if not isinstance(config.get("members"), list) or not config["members"]:
            raise ValueError(f"model config of ensemble kind {kind!r} needs a non-empty 'members' list")
        members = [model_from_config(member_kind, member) for member in config["members"]]
        return SeedEnsemble(members, bool(config.get("log_prob_output", OUTPUT_IS_LOG_PROB[member_kind])))
    if kind not in MODEL_REGISTRY:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {sorted(MODEL_REGISTRY)}")
    config_cls, model_cls = MODEL_REGISTRY[kind]
    unknown = sorted(set(config) - {f.name for f in fields(config_cls)})
    if unknown:
        raise ValueError(f"model config of kind {kind!r} has unknown key(s) {unknown}")
    return model_cls(config_cls(**config))


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (``requires_grad``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = [
    "ENSEMBLES",
    "MHSA",
    "MODEL_PRESETS",
    "MODEL_REGISTRY",
    "OUTPUT_IS_LOG_PROB",
    "LSTMConfig",
    "LSTMModel",
    "MHSAConfig",
    "PointerConfig",
    "PointerGenerator",
    "SeedEnsemble",
    "build_model",
    "count_parameters",
    "model_config",
    "model_from_config",
]
