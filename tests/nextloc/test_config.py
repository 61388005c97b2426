"""Tests for :mod:`nextloc.config`: defaults, validation (naming the key), freezing, flatten, fingerprint."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pydantic
import pytest

from nextloc.config import (
    LocationConfig,
    PreprocessConfig,
    QualityConfig,
    SampleConfig,
    SplitConfig,
    StaypointConfig,
    flatten,
    load_config,
)

REPO = Path(__file__).resolve().parents[2]

# The reference protocol (Hong et al. 2023, mie-lab/location-prediction), key by key.
REFERENCE = {
    "timezone": "UTC",
    "protocol": "reference",  # DBSCAN on every split, noise dropped, windows from the target's day
    "staypoints.dist_threshold_m": 200.0,
    "staypoints.time_threshold_min": 30.0,
    "staypoints.gap_threshold_min": 1440.0,
    "staypoints.include_last": True,
    "staypoints.exclude_duplicate_pfs": True,
    "staypoints.activity_time_threshold_min": 25.0,
    "quality.day_filter": 50,
    "quality.window_weeks": 10,
    "quality.tripleg_gap_threshold_min": 15.0,
    "quality.min_thres": None,  # DIY 0.6; off for GeoLife
    "quality.mean_thres": None,  # DIY 0.7; off for GeoLife
    "locations.epsilon_m": 20.0,
    "locations.min_samples": 2,
    "locations.coordinate_order": "lon_lat",
    "locations.merge_max_gap_min": 1.0,
    "locations.match_radius_m": 50.0,  # how answers read visits (and the deployment protocol's later ones)
    "split.train": 0.6,
    "split.val": 0.2,
    "split.test": 0.2,
    "samples.previous_days": 7,
    "samples.min_history": 3,
    "samples.duration_cap_min": 2879,
    "duplicates.drop_shared_files": False,  # every copy of a file held by several users is read
}


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def error_locs(err: pydantic.ValidationError) -> list[str]:
    return [".".join(str(part) for part in e["loc"]) for e in err.errors()]


def assert_rejected(key: str, **kwargs: Any) -> pydantic.ValidationError:
    """load_config(**kwargs) fails with a ValidationError that names ``key``."""
    with pytest.raises(pydantic.ValidationError) as info:
        load_config(**kwargs)
    assert key in error_locs(info.value), error_locs(info.value)
    assert key in str(info.value)
    return info.value


def changed(value: Any) -> Any:
    """A different valid value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 + 0.25
    if value is None:  # an optional threshold that is off: switch it on
        return 0.5
    return {"UTC": "Asia/Shanghai", "lon_lat": "lat_lon", "reference": "deployment"}[value]


class TestDefaults:
    def test_defaults_are_the_reference_protocol(self) -> None:
        assert flatten(PreprocessConfig()) == REFERENCE

    def test_default_types(self) -> None:
        flat = flatten(PreprocessConfig())
        for key, value in REFERENCE.items():
            assert type(flat[key]) is type(value), key

    def test_sections_have_the_same_defaults_alone(self) -> None:
        config = PreprocessConfig()
        assert config.staypoints == StaypointConfig()
        assert config.quality == QualityConfig()
        assert config.locations == LocationConfig()
        assert config.split == SplitConfig()
        assert config.samples == SampleConfig()

    def test_no_path_no_overrides_is_default(self) -> None:
        assert load_config() == PreprocessConfig()
        assert load_config(None, {}) == PreprocessConfig()

    def test_shipped_base_yaml_is_the_reference(self) -> None:
        base = REPO / "configs" / "base.yaml"
        if not base.exists():
            pytest.skip("configs/base.yaml not in this checkout")
        assert load_config(base) == PreprocessConfig()


class TestLoadConfig:
    def test_overrides_apply(self) -> None:
        config = load_config(
            overrides={
                "locations.epsilon_m": 50,
                "timezone": "Asia/Shanghai",
                "split.train": 0.7,
                "split.val": 0.1,
            }
        )
        assert config.locations.epsilon_m == 50.0
        assert isinstance(config.locations.epsilon_m, float)
        assert config.timezone == "Asia/Shanghai"
        assert (config.split.train, config.split.val, config.split.test) == (0.7, 0.1, 0.2)
        assert config.locations.min_samples == 2  # untouched keys keep their defaults

    def test_yaml_preprocess_section(self, tmp_path: Path) -> None:
        path = write_yaml(
            tmp_path,
            "preprocess:\n  locations:\n    epsilon_m: 50\n  timezone: Asia/Shanghai\ntrain:\n  lr: 1\n",
        )
        config = load_config(path)
        assert config.locations.epsilon_m == 50.0
        assert config.timezone == "Asia/Shanghai"

    def test_yaml_without_section(self, tmp_path: Path) -> None:
        path = write_yaml(tmp_path, "locations:\n  min_samples: 5\n")
        assert load_config(path).locations.min_samples == 5

    @pytest.mark.parametrize(
        "text", ["", "# only a comment\n", "preprocess:\n", "preprocess:\n  locations:\n"]
    )
    def test_empty_yaml_means_defaults(self, tmp_path: Path, text: str) -> None:
        assert load_config(write_yaml(tmp_path, text)) == PreprocessConfig()

    def test_overrides_win_over_yaml(self, tmp_path: Path) -> None:
        path = write_yaml(tmp_path, "preprocess:\n  locations:\n    epsilon_m: 50\n    min_samples: 4\n")
        config = load_config(path, {"locations.epsilon_m": 75})
        assert config.locations.epsilon_m == 75.0
        assert config.locations.min_samples == 4

    def test_override_into_empty_yaml_section(self, tmp_path: Path) -> None:
        path = write_yaml(tmp_path, "preprocess:\n  locations:\n")
        assert load_config(path, {"locations.epsilon_m": 30}).locations.epsilon_m == 30.0

    def test_does_not_modify_caller_overrides(self) -> None:
        overrides = {"locations": {"epsilon_m": 30.0}, "locations.min_samples": 4}
        before = {"locations": {"epsilon_m": 30.0}, "locations.min_samples": 4}
        config = load_config(overrides=overrides)
        assert (config.locations.epsilon_m, config.locations.min_samples) == (30.0, 4)
        assert overrides == before

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(FileNotFoundError):
            load_config(tmp_path / "nope.yaml")

    @pytest.mark.parametrize(
        ("text", "match"),
        [
            ("preprocess: [\n", "not valid YAML"),
            ("- 1\n- 2\n", "expected a mapping"),
            ("just a string\n", "expected a mapping"),
            ("preprocess: 5\n", "'preprocess' must be a mapping"),
        ],
    )
    def test_malformed_yaml_is_a_value_error_naming_the_file(
        self, tmp_path: Path, text: str, match: str
    ) -> None:
        path = write_yaml(tmp_path, text)
        with pytest.raises(ValueError, match=match) as info:
            load_config(path)
        assert str(path) in str(info.value)

    def test_override_below_a_plain_value_names_the_key(self, tmp_path: Path) -> None:
        path = write_yaml(tmp_path, "preprocess:\n  timezone: UTC\n")
        with pytest.raises(ValueError, match=r"timezone\.zone"):
            load_config(path, {"timezone.zone": "x"})
        with pytest.raises(ValueError, match=r"timezone"):
            load_config(overrides={"timezone.zone": "x"})


class TestRejection:
    @pytest.mark.parametrize(
        ("key", "value"),
        [("nope", 1), ("locations.nope", 1), ("staypoints.dist_threshold", 100), ("split.training", 0.6)],
    )
    def test_unknown_key_in_overrides(self, key: str, value: Any) -> None:
        assert_rejected(key, overrides={key: value})

    @pytest.mark.parametrize(
        ("text", "key"),
        [
            ("preprocess:\n  nope: 1\n", "nope"),
            ("preprocess:\n  locations:\n    epsilonm: 50\n", "locations.epsilonm"),
            ("preprocess:\n  samples:\n    previous_day: 7\n", "samples.previous_day"),
            ("nope: 1\n", "nope"),
        ],
    )
    def test_unknown_key_in_yaml(self, tmp_path: Path, text: str, key: str) -> None:
        assert_rejected(key, path=write_yaml(tmp_path, text))

    def test_unknown_key_in_constructor(self) -> None:
        with pytest.raises(pydantic.ValidationError, match="nope"):
            PreprocessConfig(nope=1)
        with pytest.raises(pydantic.ValidationError, match="nope"):
            LocationConfig(nope=1)

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("locations.epsilon_m", "twenty"),
            ("locations.epsilon_m", [20]),
            ("locations.epsilon_m", {"x": 1}),
            ("locations.epsilon_m", True),
            ("locations.min_samples", "abc"),
            ("locations.min_samples", 2.5),
            ("locations.min_samples", False),
            ("samples.previous_days", None),
            ("staypoints.include_last", "maybe"),
            ("staypoints.include_last", [True]),
            ("locations.coordinate_order", "xy"),
            ("timezone", 8),
            ("locations", 5),
            ("split", "0.6/0.2/0.2"),
        ],
    )
    def test_wrong_type(self, key: str, value: Any) -> None:
        assert_rejected(key, overrides={key: value})

    def test_wrong_type_in_yaml(self, tmp_path: Path) -> None:
        assert_rejected(
            "quality.day_filter", path=write_yaml(tmp_path, "preprocess:\n  quality:\n    day_filter: lots\n")
        )

    @pytest.mark.parametrize("value", [-5, -0.001, 0, 0.0])
    def test_non_positive_epsilon(self, value: float) -> None:
        assert_rejected("locations.epsilon_m", overrides={"locations.epsilon_m": value})

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("staypoints.dist_threshold_m", -200),
            ("staypoints.time_threshold_min", -1),
            ("staypoints.gap_threshold_min", 0),
            ("quality.day_filter", -1),
            ("quality.window_weeks", 0),
            ("locations.min_samples", 0),
            ("locations.merge_max_gap_min", -1),
            ("samples.previous_days", 0),
            ("samples.min_history", 0),
            ("samples.duration_cap_min", 0),
        ],
    )
    def test_impossible_values(self, key: str, value: Any) -> None:
        assert_rejected(key, overrides={key: value})

    @pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
    @pytest.mark.parametrize("key", ["locations.epsilon_m", "staypoints.time_threshold_min", "split.train"])
    def test_non_finite_numbers(self, key: str, value: float) -> None:
        assert_rejected(key, overrides={key: value})

    @pytest.mark.parametrize(
        "split",
        [
            {"train": 0.9},
            {"train": 0.5},
            {"train": 0.6, "val": 0.2, "test": 0.3},
            {"train": 0.5, "val": 0.1, "test": 0.1},
        ],
    )
    def test_split_not_summing_to_one(self, split: dict[str, float]) -> None:
        err = assert_rejected("split", overrides={f"split.{k}": v for k, v in split.items()})
        assert "sum to 1" in str(err)

    @pytest.mark.parametrize("split", [(0.7, 0.1, 0.2), (0.8, 0.2, 0.0), (0.1 + 0.2, 0.4, 0.3)])
    def test_split_summing_to_one_in_floats(self, split: tuple[float, float, float]) -> None:
        config = load_config(
            overrides=dict(zip(("split.train", "split.val", "split.test"), split, strict=True))
        )
        assert (config.split.train, config.split.val, config.split.test) == split

    @pytest.mark.parametrize("value", ["Mars/Olympus_Mons", "", "utc+8", "../../etc/passwd", "Asia/"])
    def test_unknown_timezone(self, value: str) -> None:
        err = assert_rejected("timezone", overrides={"timezone": value})
        assert "unknown timezone" in str(err)

    @pytest.mark.parametrize("value", ["Asia/Shanghai", "Europe/Zurich", "Etc/GMT-8"])
    def test_known_timezone(self, value: str) -> None:
        assert load_config(overrides={"timezone": value}).timezone == value

    def test_all_errors_are_reported_at_once(self) -> None:
        with pytest.raises(pydantic.ValidationError) as info:
            load_config(overrides={"nope": 1, "locations.epsilon_m": -1, "timezone": "Nowhere/Land"})
        assert set(error_locs(info.value)) == {"nope", "locations.epsilon_m", "timezone"}


class TestFrozen:
    def test_top_level_assignment_raises(self) -> None:
        config = PreprocessConfig()
        with pytest.raises(pydantic.ValidationError, match="frozen"):
            config.timezone = "Asia/Shanghai"  # type: ignore[misc]
        assert config.timezone == "UTC"

    def test_nested_assignment_raises(self) -> None:
        config = PreprocessConfig()
        with pytest.raises(pydantic.ValidationError, match="frozen"):
            config.locations.epsilon_m = 50.0  # type: ignore[misc]
        with pytest.raises(pydantic.ValidationError, match="frozen"):
            config.locations = LocationConfig(epsilon_m=50)  # type: ignore[misc]
        assert config.locations.epsilon_m == 20.0

    def test_hashable_and_equal_by_value(self) -> None:
        a = load_config(overrides={"locations.epsilon_m": 50})
        b = load_config(overrides={"locations.epsilon_m": 50.0})
        assert a == b
        assert hash(a) == hash(b)
        assert a != PreprocessConfig()


class TestFlatten:
    def test_keys_are_dotted_leaves(self) -> None:
        flat = flatten(PreprocessConfig())
        assert set(flat) == set(REFERENCE)
        assert all(not isinstance(v, dict) for v in flat.values())

    def test_prefix(self) -> None:
        flat = flatten(PreprocessConfig(), prefix="preprocess.")
        assert flat["preprocess.locations.epsilon_m"] == 20.0
        assert flatten(LocationConfig()) == {
            "epsilon_m": 20.0,
            "min_samples": 2,
            "coordinate_order": "lon_lat",
            "merge_max_gap_min": 1.0,
            "match_radius_m": 50.0,
        }

    def test_round_trip_defaults(self) -> None:
        assert load_config(overrides=flatten(PreprocessConfig())) == PreprocessConfig()

    def test_round_trip_changed_config(self) -> None:
        changes = {
            "timezone": "Asia/Shanghai",
            "locations.coordinate_order": "lat_lon",
            "locations.epsilon_m": 42.5,
            "staypoints.include_last": False,
            "split.train": 0.8,
            "split.val": 0.1,
            "split.test": 0.1,
            "samples.previous_days": 14,
        }
        config = load_config(overrides=changes)
        flat = flatten(config)
        assert {k: flat[k] for k in changes} == changes
        assert load_config(overrides=flat) == config

    def test_round_trip_through_yaml(self, tmp_path: Path) -> None:
        import yaml

        config = load_config(overrides={"locations.epsilon_m": 33.0, "quality.day_filter": 10})
        path = write_yaml(tmp_path, yaml.safe_dump({"preprocess": config.model_dump(mode="json")}))
        assert load_config(path) == config


class TestFingerprint:
    def test_stable_within_a_process(self) -> None:
        a, b = PreprocessConfig(), load_config(overrides=flatten(PreprocessConfig()))
        assert a.fingerprint() == a.fingerprint() == b.fingerprint()
        assert isinstance(a.fingerprint(), str)
        assert len(a.fingerprint()) >= 16

    def test_same_value_written_differently(self) -> None:
        assert (
            load_config(overrides={"locations.epsilon_m": 50}).fingerprint()
            == load_config(overrides={"locations.epsilon_m": 50.0}).fingerprint()
        )

    def test_stable_across_processes(self) -> None:
        code = (
            "from nextloc.config import load_config;"
            "print(load_config(overrides={'locations.epsilon_m': 50, 'timezone': 'Asia/Shanghai'}).fingerprint())"
        )
        here = load_config(overrides={"locations.epsilon_m": 50, "timezone": "Asia/Shanghai"}).fingerprint()
        for seed in ("0", "12345"):
            out = subprocess.run(
                [sys.executable, "-c", code],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
                env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            )
            assert out.stdout.strip() == here

    @pytest.mark.parametrize("key", sorted(REFERENCE))
    def test_changes_when_any_value_changes(self, key: str) -> None:
        base = PreprocessConfig()
        if key.startswith("split."):  # move 0.1 to another ratio so they still sum to 1
            other = "split.val" if key != "split.val" else "split.test"
            overrides = {key: REFERENCE[key] - 0.1, other: REFERENCE[other] + 0.1}
        else:
            overrides = {key: changed(REFERENCE[key])}
        other_config = load_config(overrides=overrides)
        assert other_config != base
        assert other_config.fingerprint() != base.fingerprint()


# --- the training recipe (nextloc.models.train_config) --------------------------------------------------------


def test_train_config_is_frozen_and_rejects_unknown_keys_naming_the_allowed_ones():
    from nextloc.models.registry import training_recipe
    from nextloc.models.train_config import TrainConfig

    config = training_recipe("pointer_plus")
    with pytest.raises(pydantic.ValidationError):
        config.lr = 1.0  # type: ignore[misc]
    with pytest.raises(
        ValueError, match=r"unknown training option\(s\) \['overlap_validation'\]; allowed: \["
    ):
        training_recipe("mhsa", overlap_validation=False)
    for removed in ("overlap_validation", "prefetch_dropout", "ema_decay"):
        assert removed not in TrainConfig.model_fields
    with pytest.raises(ValueError, match=r"training option lr=True: expected a number, got the boolean"):
        training_recipe("mhsa", lr=True)
    assert training_recipe("mhsa", betas=[0.8, 0.9]).betas == (0.8, 0.9)
    with pytest.raises(ValueError, match=r"unknown recipe 'transformer'; expected one of \['mhsa'"):
        training_recipe("transformer")


def test_train_config_changes_through_model_copy_and_round_trips_as_plain_data():
    from nextloc.models.registry import training_recipe
    from nextloc.models.train_config import TrainConfig

    config = training_recipe("pointer", seed=3)
    assert TrainConfig.model_validate(config.model_dump()) == config
    assert TrainConfig.model_validate_json(config.model_dump_json()) == config
    assert config.model_copy(update={"seed": 4}).seed == 4
