"""The deployment protocol (:mod:`nextloc.preprocessing.deployment`, ``protocol: deployment``) on the real
GeoLife sample: locations known from the train periods alone, noise kept as new places, windows and
``diff_hist`` counted from now; the switch itself is typed and part of the config's fingerprint."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from causal_build import sample_mismatches
from pydantic import ValidationError

from nextloc.bundle import DEFAULT_MATCH_RADIUS_M, match_radius
from nextloc.config import PreprocessConfig, load_config
from nextloc.preprocessing import sequences
from nextloc.preprocessing.dataset import build_dataset, locate_staypoints
from nextloc.preprocessing.deployment import period_splits
from nextloc.preprocessing.locations import generate_locations
from nextloc.preprocessing.staypoints import create_activity_flag
from nextloc.preprocessing.vocabulary import location_centres

DEPLOYMENT = PreprocessConfig(protocol="deployment")


@pytest.fixture(scope="module")
def located(sample_staypoints) -> pd.DataFrame:
    return locate_staypoints(*sample_staypoints, DEPLOYMENT).staypoints


@pytest.fixture(scope="module")
def dataset(located):
    return build_dataset(located, DEPLOYMENT)


def test_the_switch_is_typed_recorded_and_defaults_to_the_reference():
    assert PreprocessConfig().protocol == "reference"
    assert load_config(overrides={"protocol": "deployment"}) == DEPLOYMENT
    assert DEPLOYMENT.fingerprint() != PreprocessConfig().fingerprint()
    assert DEPLOYMENT.model_dump(mode="json")["protocol"] == "deployment"
    with pytest.raises(ValidationError, match="protocol"):
        PreprocessConfig(protocol="live")
    assert match_radius(PreprocessConfig()) == DEFAULT_MATCH_RADIUS_M
    assert match_radius(DEPLOYMENT) == DEPLOYMENT.locations.match_radius_m == DEFAULT_MATCH_RADIUS_M


def test_every_activity_staypoint_of_the_kept_users_stays(sample_staypoints, located):
    """Noise is not dropped: the reference keeps the clustered rows only, the deployment protocol every
    activity staypoint of the quality-filtered users (a place of its own has a unique negative id)."""
    reference = locate_staypoints(*sample_staypoints, PreprocessConfig()).staypoints
    assert set(reference["user_id"]) == set(located["user_id"])
    activity = create_activity_flag(sample_staypoints[0], DEPLOYMENT.staypoints.activity_time_threshold_min)
    kept = activity[activity["is_activity"] & activity["user_id"].isin(located["user_id"])]
    assert len(located) == len(kept) > len(reference)
    own = located["location_id"].to_numpy() < 0
    assert own.any()
    assert located.loc[own, "location_id"].is_unique


def test_train_locations_are_dbscan_on_the_train_periods_alone(located):
    """The train periods' labels are DBSCAN's on those staypoints only, so no later staypoint can make one
    a place; the later ones never make a location (their ids are train ids or places of their own)."""
    fitted = located["fitted"].to_numpy()
    assert np.array_equal(fitted, (located["split"] == "train").to_numpy())
    alone = generate_locations(located.loc[fitted, ["latitude", "longitude"]], DEPLOYMENT.locations)
    expected = alone["location_id"].fillna(-1).to_numpy(np.int64)
    got = located.loc[fitted, "location_id"].to_numpy()
    assert np.array_equal(np.where(got < 0, -1, got), expected)
    later = located.loc[~fitted, "location_id"].to_numpy()
    assert np.isin(later[later >= 0], got[got >= 0]).all()


def test_a_later_staypoint_is_the_nearest_train_centre_within_the_match_radius(located):
    centres = location_centres(located[located["fitted"] & (located["location_id"] >= 0)])
    later = located[~located["fitted"]]
    lat, lon = np.radians(later[["latitude", "longitude"]].to_numpy()).T
    clat, clon = np.radians(centres[["latitude", "longitude"]].to_numpy()).T
    a = np.sin((clat[None] - lat[:, None]) / 2) ** 2
    a += np.cos(lat[:, None]) * np.cos(clat[None]) * np.sin((clon[None] - lon[:, None]) / 2) ** 2
    metres = 2 * 6_371_000 * np.arcsin(np.sqrt(a))
    nearest = centres.index.to_numpy()[metres.argmin(axis=1)]
    within = metres.min(axis=1) <= DEPLOYMENT.locations.match_radius_m
    got = later["location_id"].to_numpy()
    assert within.any()
    assert (~within).any()
    assert np.array_equal(got[within], nearest[within])
    assert (got[~within] < 0).all()


def test_the_split_is_the_reference_day_cut_off_on_the_staypoints(located, dataset):
    """Each final staypoint keeps the period its location was decided in, the reference's cut-off."""
    assert np.array_equal(located["split"].to_numpy(), period_splits(located, DEPLOYMENT))
    first = located.drop_duplicates(["user_id", "started_at"]).set_index(["user_id", "started_at"])["split"]
    final = dataset.staypoints.set_index(["user_id", "started_at"])["split"]
    assert final.equals(first.reindex(final.index))


def test_a_target_no_train_location_holds_is_a_new_place(dataset):
    """The vocabulary holds train locations only: a place of its own is never in it, and every sample whose
    target staypoint has a negative raw id has target 1 (new place)."""
    sp = dataset.staypoints.set_index("id")
    for split, table in dataset.samples.items():
        raw = sp.loc[table.column("staypoint_id").to_numpy(), "raw_location_id"].to_numpy()
        target = table.column("target_loc").to_numpy()
        assert (target[raw < 0] == 1).all(), split
        assert (raw < 0).any(), split
    assert (sp.loc[sp["location_id"] >= 2, "raw_location_id"] >= 0).all()


def test_windows_and_diff_hist_count_from_now(dataset):
    """A sample's history is its (user, split) rows before the target that started at most ``previous_days``
    before now's day (the end day of the last history visit), and ``diff_hist`` is now's day minus each
    visit's start day; whether a row is a question is decided at now too."""
    sp = dataset.staypoints.set_index("id")
    days = DEPLOYMENT.samples.previous_days
    checked = 0
    for split, table in dataset.samples.items():
        frame = table.to_pandas()
        for row in frame.itertuples():
            target = sp.loc[row.staypoint_id]
            group = sp[(sp["user_id"] == target["user_id"]) & (sp["split"] == split)]
            before = group[group.index < row.staypoint_id]
            now_day = before["end_day"].iloc[-1]
            window = before[before["start_day"] >= now_day - days]
            assert list(row.loc_hist) == window["location_id"].tolist()
            assert list(row.diff_hist) == (now_day - window["start_day"]).tolist()
            assert now_day - group["start_day"].iloc[0] >= days
            checked += 1
    assert checked == sum(t.num_rows for t in dataset.samples.values()) > 0


def test_dbscan_by_tiles_gives_the_same_dataset(sample_staypoints, located):
    tiled = locate_staypoints(*sample_staypoints, DEPLOYMENT, dbscan_tiles=3).staypoints
    pd.testing.assert_frame_equal(tiled, located)


def every_question(samples: dict) -> list[tuple[str, int]]:
    return [(split, i) for split, table in samples.items() for i in range(table.num_rows)]


def test_no_sample_input_reads_after_now(dataset):
    """Every train, validation and test sample's inputs equal those rebuilt from the staypoints that started
    before its now, the target poisoned (``tests/causal_build.py``)."""
    assert (
        sample_mismatches(dataset.staypoints, dataset.samples, DEPLOYMENT, every_question(dataset.samples))
        == []
    )


@pytest.mark.parametrize(
    "mutant",
    [
        pytest.param(
            lambda sp, protocol="reference": sp["start_day"].to_numpy(np.int64), id="now-at-arrival"
        ),
        pytest.param(
            lambda sp, protocol="reference": sp["end_day"].to_numpy(np.int64), id="now-at-target-end"
        ),
    ],
)
def test_the_sample_check_catches_a_wrong_now(monkeypatch, located, mutant):
    """The same check fails on mutated copies of the samples: now set to the arrival at the target (the
    reference's anchor, reading the target's start) or to the target's end (an ongoing stay's), in every
    split, train included."""
    monkeypatch.setattr(sequences, "question_days", mutant)
    mutated = build_dataset(located, DEPLOYMENT)
    wrong = sample_mismatches(
        mutated.staypoints, mutated.samples, DEPLOYMENT, every_question(mutated.samples)
    )
    for split in ("train", "val", "test"):
        assert any(w.startswith(f"{split} sample") for w in wrong), split


def test_the_reference_samples_fail_the_sample_check(sample_staypoints):
    """The reference protocol's samples count from the target's day: the check sees it."""
    config = PreprocessConfig()
    dataset = build_dataset(locate_staypoints(*sample_staypoints, config).staypoints, config)
    wrong = sample_mismatches(dataset.staypoints, dataset.samples, config, every_question(dataset.samples))
    assert any(w.endswith("diff_hist") for w in wrong)
