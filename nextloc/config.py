"""Typed, frozen configuration for every preprocessing stage.

Defaults reproduce the reference protocol (Hong et al. 2023, ``mie-lab/location-prediction``) exactly,
quirks included; each quirk has a switch so the corrected protocol can be run too:

* ``timezone``: the reference computes day boundaries, start minutes and weekdays in UTC wall-clock
  time although GeoLife was recorded in Beijing (``"Asia/Shanghai"`` is the corrected choice).
* ``locations.coordinate_order``: trackintel feeds ``[lon, lat]`` to sklearn's haversine metric, which
  expects ``[lat, lon]``; ``"lat_lon"`` gives a true ``epsilon_m`` radius.
* ``protocol``: ``"reference"`` clusters every split's staypoints together and drops DBSCAN's noise, and a
  sample's history counts days from the target's day; ``"deployment"`` knows only the locations of the
  train period (later staypoints are matched to them, else a new place) and counts from now
  (:mod:`nextloc.preprocessing.deployment`, docs/protocol.md).
* ``duplicates.drop_shared_files``: GeoLife holds some trajectory files under two users; the reference
  reads both copies, ``true`` reads one (:mod:`nextloc.raw.duplicates`).

Every model is ``frozen`` and ``extra="forbid"``: an unknown key or a wrong type is rejected before any
work starts, and the error names the key. Numbers must be finite, and a boolean is not a number (so
``--locations.epsilon_m true`` does not silently mean 1 metre).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


def known_timezone(value: str) -> str:
    """``value`` if it names an IANA timezone; else a ValueError naming it (the validator of every
    ``timezone`` field)."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise ValueError(f"unknown timezone {value!r}") from err
    return value


# "reference": the published protocol; "deployment": every input as a live answer would have it
Protocol = Literal["reference", "deployment"]
# a visit within this many metres of a known location's centre is that location (answers, bundles, the
# champion rule's reading of later data, the deployment protocol's later staypoints)
DEFAULT_MATCH_RADIUS_M = 50.0


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _check_raw_value(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation
        # pydantic's lax mode reads True/False as 1/0 for int and float fields.
        if isinstance(value, bool) and annotation in (int, float):
            raise ValueError(f"expected a number, got the boolean {value}")
        # An empty YAML section (``locations:`` with every key commented out) means its defaults.
        if value is None and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return {}
        return value


class _NamesUnknownKeys(_Frozen):
    """A frozen config whose unknown keys are named with the allowed ones (pydantic names only the key)."""

    option_label: ClassVar[str] = "option"

    @model_validator(mode="before")
    @classmethod
    def _name_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise ValueError(cls.unknown_keys_message(unknown))
        return data

    @classmethod
    def unknown_keys_message(cls, unknown: list[str]) -> str:
        return f"unknown {cls.option_label}(s) {unknown}; allowed: {sorted(cls.model_fields)}"


class StaypointConfig(_Frozen):
    """Sliding-window staypoint detection (trackintel ``generate_staypoints(method="sliding")``)."""

    dist_threshold_m: float = Field(200.0, gt=0, description="Leave radius in metres (haversine).")
    time_threshold_min: float = Field(30.0, ge=0, description="Minimum staypoint duration in minutes.")
    gap_threshold_min: float = Field(
        1440.0, gt=0, description="A larger gap between fixes resets the window."
    )
    include_last: bool = Field(True, description="Turn the trailing window into a staypoint if long enough.")
    exclude_duplicate_pfs: bool = Field(True, description="Drop exact duplicate positionfixes first.")
    activity_time_threshold_min: float = Field(
        25.0, ge=0, description="is_activity = duration > this (trackintel create_activity_flag)."
    )


class QualityConfig(_Frozen):
    """User tracking-quality filter (reference ``calculate_user_quality``)."""

    day_filter: int = Field(
        50, ge=0, description="Keep users whose tracked span is more than this many days."
    )
    window_weeks: int = Field(10, ge=1, description="Sliding window length in weeks; shorter spans drop out.")
    tripleg_gap_threshold_min: float = Field(15.0, gt=0, description="Temporal gap that splits triplegs.")
    min_thres: float | None = Field(
        None, ge=0, le=1, description="Keep users whose worst window quality exceeds this (DIY 0.6; off)."
    )
    mean_thres: float | None = Field(
        None, ge=0, le=1, description="Keep users whose mean window quality exceeds this (DIY 0.7; off)."
    )


class LocationConfig(_Frozen):
    """Dataset-level DBSCAN location generation (trackintel ``generate_locations``)."""

    epsilon_m: float = Field(20.0, gt=0, description="DBSCAN radius in metres (see coordinate_order).")
    min_samples: int = Field(2, ge=1, description="DBSCAN min_samples; noise staypoints are dropped.")
    coordinate_order: Literal["lon_lat", "lat_lon"] = Field(
        "lon_lat", description="Order fed to sklearn haversine: 'lon_lat' is the reference quirk."
    )
    merge_max_gap_min: float = Field(1.0, ge=0, description="Merge consecutive same-location staypoints.")
    match_radius_m: float = Field(
        DEFAULT_MATCH_RADIUS_M,
        gt=0,
        description="A visit within this many metres of a known location's centre is that location: how a "
        "model's answers read visits, and the deployment protocol's later staypoints.",
    )


class SplitConfig(_Frozen):
    """Per-user chronological split by day index."""

    train: float = Field(0.6, gt=0, lt=1)
    val: float = Field(0.2, ge=0, lt=1)
    test: float = Field(0.2, ge=0, lt=1)

    @model_validator(mode="after")
    def _sums_to_one(self) -> SplitConfig:
        total = self.train + self.val + self.test
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            raise ValueError(f"split ratios train+val+test must sum to 1, got {total:g}")
        return self


class SampleConfig(_Frozen):
    """History-window samples (reference ``get_valid_sequence`` / dataloader)."""

    previous_days: int = Field(7, ge=1, description="History window in days; earlier targets are skipped.")
    min_history: int = Field(3, ge=1, description="Minimum number of history records for a valid target.")
    duration_cap_min: int = Field(2879, ge=1, description="Durations above this are capped (2*1440-1).")


class DuplicateConfig(_Frozen):
    """Recordings held under several users (:mod:`nextloc.raw.duplicates`); they are always reported."""

    drop_shared_files: bool = Field(
        False,
        description="Read a file found, byte-identical, under several users once (the lowest user id's); "
        "the reference reads every copy.",
    )


class PreprocessConfig(_Frozen):
    """All preprocessing parameters; the defaults are the reference GeoLife protocol."""

    timezone: str = Field("UTC", description="Wall-clock zone of time features; reference: UTC.")
    protocol: Protocol = Field(
        "reference",
        description="'reference': DBSCAN on every split, noise dropped, history counted from the target's "
        "day; 'deployment': locations of the train period only, history counted from now.",
    )
    staypoints: StaypointConfig = StaypointConfig()
    quality: QualityConfig = QualityConfig()
    locations: LocationConfig = LocationConfig()
    split: SplitConfig = SplitConfig()
    samples: SampleConfig = SampleConfig()
    duplicates: DuplicateConfig = DuplicateConfig()

    _known_timezone = field_validator("timezone")(classmethod(lambda cls, value: known_timezone(value)))

    def fingerprint(self) -> str:
        """Stable short hash of the full configuration."""
        from nextloc.fingerprint import hash_text

        return hash_text(json.dumps(self.model_dump(mode="json"), sort_keys=True))


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> PreprocessConfig:
    """Load a YAML file (its ``preprocess`` section) and apply dotted overrides.

    Args:
        path: YAML file; ``None`` uses the defaults.
        overrides: ``{"locations.epsilon_m": 50}``-style keys; unknown keys raise.

    Returns:
        The validated configuration.

    Raises:
        pydantic.ValidationError: on unknown keys, wrong types or impossible values (it names the key).
        ValueError: if the file is not YAML holding a mapping, or an override goes below a plain value
            (``pydantic.ValidationError`` is a ``ValueError`` too).
        FileNotFoundError: if ``path`` does not exist.

    Examples:
        >>> load_config(overrides={"locations.epsilon_m": 50}).locations.epsilon_m
        50.0
    """
    data = read_config_file(path) if path is not None else {}
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for depth, key in enumerate(parents):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            elif not isinstance(child, dict):
                section = ".".join(parents[: depth + 1])
                raise ValueError(f"cannot set {dotted!r}: {section!r} is a value ({child!r}), not a section")
            node = child
        node[leaf] = copy.deepcopy(value)  # later overrides must not write into the caller's values
    return PreprocessConfig.model_validate(data)


def read_config_file(path: Path) -> dict[str, Any]:
    """The keys a YAML config file sets: its ``preprocess`` section (or the whole file without one), as
    written, nothing validated but the shape (:func:`load_config` validates).

    Raises:
        ValueError: if the file is not YAML holding a mapping (the message names the file).
        FileNotFoundError: if ``path`` does not exist.
    """
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from err
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of config keys, got {type(raw).__name__}")
    data = raw.get("preprocess", raw)
    if data is None:  # an empty ``preprocess:`` section: the defaults
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: 'preprocess' must be a mapping of config keys, got {type(data).__name__}")
    return data


def flatten_keys(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten a nested mapping of config keys into ``{"locations.epsilon_m": 50, ...}``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        _flatten_into(flat, f"{prefix}{key}", value)
    return flat


def flatten(config: BaseModel, prefix: str = "") -> dict[str, Any]:
    """Flatten a nested config into ``{"locations.epsilon_m": 20.0, ...}``."""
    return flatten_keys(config.model_dump(mode="json"), prefix)


def _flatten_into(flat: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, dict):
        for sub, sub_value in value.items():
            _flatten_into(flat, f"{key}.{sub}", sub_value)
    else:
        flat[key] = value
