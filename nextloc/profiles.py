"""Dataset profiles: ``configs/datasets/<name>.yaml`` names the input, the protocol and the model presets.

A profile has four sections: ``input`` (an :class:`~nextloc.inputs.InputSpec` plus ``raw_dir``),
``preprocess`` (partial :class:`~nextloc.config.PreprocessConfig`: only the keys that differ from the
reference GeoLife protocol), ``models`` and ``train`` (per model kind, config and training overrides).
Its outputs go under ``data/<name>/``. Unknown keys are rejected, naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from nextloc.config import PreprocessConfig, flatten, load_config
from nextloc.inputs import InputSpec

PROFILE_DIR = Path(__file__).resolve().parents[1] / "configs" / "datasets"


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

    def config(self, overrides: dict[str, Any] | None = None, path: Path | None = None) -> PreprocessConfig:
        """The profile's preprocessing config; ``path`` (a YAML config) and ``overrides`` apply on top."""
        base = flatten(PreprocessConfig.model_validate(self.preprocess))
        if path is not None:
            base = flatten(load_config(path))
        return load_config(None, {**base, **(overrides or {})})


def list_profiles(root: Path = PROFILE_DIR) -> list[str]:
    """Names of the profiles present."""
    return sorted(p.stem for p in Path(root).glob("*.yaml"))


def load_profile(name: str, root: Path = PROFILE_DIR) -> DatasetProfile:
    """Read ``<root>/<name>.yaml``.

    Raises:
        FileNotFoundError: if there is no such profile (the message lists the ones present).
        ValueError: on bad YAML or a bad key (pydantic's error names it).
    """
    path = Path(root) / f"{name}.yaml"
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
