"""Per-kind model and training overrides, typed, and the one check they pass before any work.

``model_overrides`` sets keys of a neural kind's config dataclass (``{"mhsa": {"d_model": 64}}``),
``train_overrides`` keys of its :class:`~nextloc.models.train_config.TrainConfig` (``{"mhsa": {"max_epochs": 2}}``);
a seed ensemble takes its member kind's keys. :class:`ModelOverrides` and :class:`TrainOverrides` have one
optional field per neural kind of the registry, each a model of that kind's settings, so the flows that take
them show a form per kind and reject a bad kind, key or value when their parameters are validated;
:func:`check_kind_overrides` is the check behind them (the values a config rejects as a whole, e.g. a width
not divisible by the heads). Errors name the kind, the key and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_type_hints

from pydantic import BaseModel, Field, ValidationError, create_model, model_validator

from nextloc.config import _NamesUnknownKeys
from nextloc.models import check_model_overrides, model_settings
from nextloc.models.registry import KINDS, kind, neural_kinds, training_recipe
from nextloc.models.train_config import TrainConfig, explain


class _Settings(_NamesUnknownKeys):
    """Some keys of a config: each field defaults to unset (not validated), an unknown key is named with the
    allowed ones."""

    def as_dict(self) -> dict[str, Any]:
        """The keys that were set, as plain values."""
        return self.model_dump(exclude_unset=True)


def _settings_of(name: str, label: str, hints: Mapping[str, Any], keys: tuple[str, ...]) -> type[_Settings]:
    base = type(f"_{name}Base", (_Settings,), {"option_label": label, "__annotations__": {}})
    return create_model(name, __base__=base, **{k: (hints[k], Field(None)) for k in keys})  # type: ignore[call-overload]


TrainSettings = _settings_of(
    "TrainSettings", "training option", get_type_hints(TrainConfig), tuple(TrainConfig.model_fields)
)
# per kind trained (an ensemble takes its member's): the allowed keys are the config's, the errors name the kind
_MODEL_SETTINGS: dict[str, type[_Settings]] = {
    k.name: _settings_of(
        "".join(part.title() for part in k.name.split("_")) + "ModelSettings",
        f"{k.name!r} config key",
        get_type_hints(k.config),
        model_settings(k.name),
    )
    for k in KINDS.values()
    if k.family == "neural"
}


class _PerKind(_NamesUnknownKeys):
    """One optional field per neural kind; an unknown kind is named with the neural kinds."""

    @classmethod
    def unknown_keys_message(cls, unknown: list[str]) -> str:
        return f"model_overrides/train_overrides name unknown models {unknown}; expected {neural_kinds()}"

    def by_kind(self) -> dict[str, dict[str, Any]]:
        """``kind -> the keys set`` for every kind given (``{}`` for a kind given without keys)."""
        given = [k for k in type(self).model_fields if k in self.model_fields_set]  # registry order
        return {k: getattr(self, k).as_dict() for k in given if getattr(self, k) is not None}


class _ModelOverridesBase(_PerKind):
    @model_validator(mode="after")
    def _check_configs(self) -> _ModelOverridesBase:
        for name, keys in self.by_kind().items():
            check_kind_overrides(name, keys, {})
        return self


class _TrainOverridesBase(_PerKind):
    @model_validator(mode="after")
    def _check_recipes(self) -> _TrainOverridesBase:
        for name, keys in self.by_kind().items():
            check_kind_overrides(name, {}, keys)
        return self


def _per_kind(name: str, base: type[_PerKind], settings: Mapping[str, type[_Settings]]) -> type[_PerKind]:
    return create_model(name, __base__=base, **{k: (s | None, None) for k, s in settings.items()})  # type: ignore[call-overload]


ModelOverrides = _per_kind(
    "ModelOverrides",
    _ModelOverridesBase,
    {k: _MODEL_SETTINGS[kind(k).trained.name] for k in neural_kinds()},
)
TrainOverrides = _per_kind(
    "TrainOverrides", _TrainOverridesBase, dict.fromkeys(neural_kinds(), TrainSettings)
)


# why the pipeline trains no network on train + val (the library's fit_model still can, for benchmarks)
REFIT_REFUSED = (
    "a network refit on train + val would have its new-place head fit on validation answers it trained on "
    "(the removed pointer_plus_refit)"
)


def check_kind_overrides(kind_name: str, model: Mapping[str, Any], train: Mapping[str, Any]) -> None:
    """Raise what training ``kind_name`` (a network or a seed ensemble) with these overrides would, building
    nothing: a key that is not a field of the kind's model config, a value the config rejects, a training
    option :func:`~nextloc.models.registry.training_recipe` rejects (its name or value), or a refit on
    train + val (:data:`REFIT_REFUSED`).

    Raises:
        ValueError: naming the kind, the key and what is allowed.
    """
    entry = kind(kind_name)
    if not entry.is_neural:
        raise ValueError(_PerKind.unknown_keys_message([kind_name]))
    if train.get("refit_on_train_val"):
        raise ValueError(f"{kind_name}: training option refit_on_train_val=True is refused: {REFIT_REFUSED}")
    try:
        check_model_overrides(entry.trained.name, model)
        training_recipe(entry.trained.name, **train)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{kind_name}: {err}") from err


def resolve_overrides(
    model_overrides: Mapping[str, Any] | BaseModel | None,
    train_overrides: Mapping[str, Any] | BaseModel | None,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Check per-kind overrides (plain mappings or the typed models) and return them as plain
    ``kind -> {key: value}`` dicts, the form the training tasks take.

    Raises:
        ValueError: one line per problem, naming the kind, the key and what is allowed.
    """
    out = []
    for given, model in ((model_overrides, ModelOverrides), (train_overrides, TrainOverrides)):
        try:
            typed = model.model_validate(given if given is not None else {})
        except ValidationError as err:
            raise ValueError(explain(err, model)) from None
        out.append(typed.by_kind())
    return out[0], out[1]
