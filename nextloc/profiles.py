"""Dataset profiles: ``configs/datasets/<name>.yaml`` names the input, the protocol and the model presets.

A profile has four sections: ``input`` (an :class:`~nextloc.io.inputs.InputSpec` plus ``raw_dir``),
``preprocess`` (partial :class:`~nextloc.config.PreprocessConfig`: only the keys that differ from the
reference GeoLife protocol), ``models`` and ``train`` (per model kind, config and training overrides).
Its outputs go under ``data/<name>/``. Unknown keys are rejected, naming the key.

The profiles live in ``configs/datasets/`` (``$NEXTLOC_DATASETS_DIR`` points elsewhere). One resolution
path turns a profile into the parameters of the flows: :meth:`DatasetProfile.inputs` (where and how to
read, where to write), :meth:`DatasetProfile.config` (the protocol) and :meth:`DatasetProfile.presets`
(per-model settings); ``flows.pipeline.profile_parameters`` assembles them for ``nextloc run --dataset``
and for the deployment ``preprocess-train/<name>``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from nextloc.config import PreprocessConfig, flatten, flatten_keys, load_config, read_config_file
from nextloc.io.inputs import InputSpec

PROFILE_DIR = Path(__file__).resolve().parents[1] / "configs" / "datasets"
PROFILE_DIR_ENV = "NEXTLOC_DATASETS_DIR"


def profile_dir() -> Path:
    """The folder of the profiles: ``$NEXTLOC_DATASETS_DIR`` if set, else ``configs/datasets``."""
    return Path(os.environ.get(PROFILE_DIR_ENV) or PROFILE_DIR)


class ProfileInput(InputSpec):
    """The input of a profile: its kind, columns, timezone and where it is (``None``: found as for GeoLife)."""

    raw_dir: str | None = None


class DatasetProfile(BaseModel):
    """One dataset profile."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    input: ProfileInput = ProfileInput()
    preprocess: dict[str, Any] = Field(default_factory=dict)
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)
    train: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @property
    def data_dir(self) -> str:
        """Where the profile's outputs go."""
        return f"data/{self.name}"

    def inputs(
        self,
        raw_dir: str | Path | None = None,
        data_dir: str | Path | None = None,
        input_format: str | None = None,
        columns: dict[str, str] | None = None,
        input_timezone: str | None = None,
    ) -> dict[str, Any]:
        """The input parameters of the flows; each argument given wins over the profile.

        Returns:
            ``raw_dir`` (``None``: found as for GeoLife) and ``data_dir``; for an input other than the GeoLife
            defaults also ``input_format``, ``columns`` and ``input_timezone`` (so a GeoLife input passes the
            flows the same parameters as before profiles existed).

        Raises:
            pydantic.ValidationError: on an unknown format, column or timezone (it names the field).
        """
        spec = InputSpec(
            format=input_format or self.input.format,
            columns=dict(self.input.columns) if columns is None else columns,
            timezone=input_timezone or self.input.timezone,
        )
        raw = raw_dir or self.input.raw_dir
        out: dict[str, Any] = {
            "raw_dir": str(raw) if raw else None,
            "data_dir": str(data_dir or self.data_dir),
        }
        if spec != InputSpec():
            out.update(input_format=spec.format, columns=dict(spec.columns), input_timezone=spec.timezone)
        return out

    def presets(
        self,
        kinds: list[str],
        model_set: dict[str, Any] | None = None,
        train_set: dict[str, Any] | None = None,
    ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """``(model_overrides, train_overrides)`` for the model kinds: the profile's presets, then the given
        keys on top (for every kind listed)."""
        models = {k: {**self.models.get(k, {}), **(model_set or {})} for k in kinds}
        train = {k: {**self.train.get(k, {}), **(train_set or {})} for k in kinds}
        return models, train

    def config(self, overrides: dict[str, Any] | None = None, path: Path | None = None) -> PreprocessConfig:
        """The profile's preprocessing config; the keys ``path`` (a YAML config) sets, then ``overrides``,
        apply on top (a key the file does not set keeps the profile's value, not the default)."""
        base = flatten(PreprocessConfig.model_validate(self.preprocess))
        if path is not None:
            load_config(path)  # the file alone is a valid config: its errors as without a profile
            base.update(flatten_keys(read_config_file(path)))
        return load_config(None, {**base, **(overrides or {})})


def list_profiles(root: Path | None = None) -> list[str]:
    """Names of the profiles present in ``root`` (default :func:`profile_dir`)."""
    return sorted(p.stem for p in Path(root or profile_dir()).glob("*.yaml"))


def load_profile(name: str, root: Path | None = None) -> DatasetProfile:
    """Read ``<root>/<name>.yaml`` (``root`` defaults to :func:`profile_dir`).

    Raises:
        FileNotFoundError: if there is no such profile (the message lists the ones present).
        ValueError: on bad YAML or a bad key (pydantic's error names it).
    """
    root = Path(root or profile_dir())
    path = root / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no dataset profile {name!r} in {root}; present: {list_profiles(root)}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping, got {type(raw).__name__}")
    raw = {k: v for k, v in raw.items() if v is not None}
    profile = DatasetProfile.model_validate({"name": name, **raw})
    PreprocessConfig.model_validate(profile.preprocess)  # a bad protocol key fails here, naming the key
    return profile
