"""Property-based tests of the sample builder (:mod:`nextloc.preprocessing.sequences`, chained by
:func:`nextloc.preprocessing.dataset.build_dataset`) on random per-user staypoint sequences.

The rules the code guarantees (it reproduces mie-lab/location-prediction exactly; these tests pin them, they
do not change them):

* Order: each user's merged staypoints are ordered by ``(start_day, start_min)`` -- wall-clock day index and
  minute in ``config.timezone`` -- with ties (same minute) kept in ``started_at`` order. In a zone without
  daylight saving time (UTC, the reference's choice; Asia/Shanghai, GeoLife's) that is ``started_at`` order.
* Splits: per user, by day index: ``train < train_ratio * maxDay <= val < (train + val) * maxDay <= test``.
* History of a target: the staypoints of the **same user and the same split** that come before it in that
  order and start on a day index ``>= target_day - previous_days``. Histories never cross splits: the
  reference splits first and builds each split's samples on its own, so a val/test target never sees a
  train/val record, even one inside its ``previous_days`` window.
* ``previous_days`` counts day indices (calendar days in the zone), not 24-hour periods: every history record
  has ``0 <= target_day - day <= previous_days`` (that difference is ``diff_hist``), so it started less than
  ``previous_days + 1`` days before the target.
* A staypoint is a target (``is_target``) iff its day index is ``>= previous_days`` after the first day of
  its (user, split) and its history has ``>= min_history`` records; ``build_dataset`` keeps only users with a
  target in each of train, val and test, and makes exactly one sample per target.

Known limit (see :func:`test_dst_fall_back_hour_can_put_a_later_staypoint_in_the_history`): in a zone with
DST, the repeated wall-clock hour of the autumn change can order a later staypoint before an earlier one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nextloc.config import PreprocessConfig, SampleConfig, SplitConfig
from nextloc.preprocessing.dataset import build_dataset
from nextloc.preprocessing.locations import merge_staypoints
from nextloc.preprocessing.sequences import (
    SPLITS,
    add_time_features,
    assign_split,
    build_samples,
    encode,
    history_windows,
    valid_targets,
)

BASE = pd.Timestamp("2008-03-01", tz="UTC")
DAY = pd.Timedelta(days=1)
SPLIT_RANK = {name: rank for rank, name in enumerate(SPLITS)}

# Seconds. Gaps of up to 90 s let merge_staypoints join same-location neighbours; sub-minute stays make
# several staypoints start in the same minute (ties in (start_day, start_min)); multi-day gaps and stays
# leave days without any staypoint.
_H = 3600
_GAP = st.one_of(
    st.integers(0, 90), st.integers(60, 6 * _H), st.integers(60, 12 * _H), st.integers(12 * _H, 3 * 86_400)
)
_DURATION = st.one_of(
    st.integers(1, 600), st.integers(600, 8 * _H), st.integers(600, 14 * _H), st.integers(14 * _H, 3 * 86_400)
)
_STEP = st.tuples(_GAP, _DURATION, st.integers(0, 6))
_SETTINGS = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@st.composite
def located_staypoints(draw: st.DrawFn, dense_first_user: bool = True) -> pd.DataFrame:
    """Non-overlapping staypoints of 1-3 users (what located, noise-free staypoints look like), shuffled.

    With ``dense_first_user`` the first user has at least 40 staypoints (so that most examples keep a user
    through build_dataset's user filter); any other user may have as few as one.
    """
    users = draw(st.lists(st.integers(1, 500), min_size=1, max_size=3, unique=True))
    rows = []
    for k, user in enumerate(users):
        t = BASE + pd.Timedelta(seconds=draw(st.integers(0, 400 * 86_400)))
        min_steps = 40 if k == 0 and dense_first_user else draw(st.sampled_from([1, 40]))
        for gap, duration, loc in draw(st.lists(_STEP, min_size=min_steps, max_size=150)):
            start = t + pd.Timedelta(seconds=gap)
            t = start + pd.Timedelta(seconds=duration)
            rows.append((user, start, t, loc))
    order = draw(st.permutations(range(len(rows))))
    df = pd.DataFrame(
        [rows[i] for i in order], columns=["user_id", "started_at", "finished_at", "location_id"]
    )
    df["user_id"] = df["user_id"].astype(np.int32)
    df["location_id"] = df["location_id"].astype(np.int64)
    # located staypoints carry their coordinates (the final staypoints keep them); the rules ignore them
    df["latitude"] = 39.9 + df["location_id"] * 1e-3
    df["longitude"] = 116.3
    return df


_CONFIG = st.builds(
    lambda tz, previous_days, min_history, train, val: PreprocessConfig(
        timezone=tz,
        samples=SampleConfig(previous_days=previous_days, min_history=min_history),
        split=SplitConfig(train=train, val=val, test=round(1 - train - val, 10)),
    ),
    st.sampled_from(["UTC", "Asia/Shanghai"]),
    st.integers(1, 8),
    st.integers(1, 4),
    st.sampled_from([0.6, 0.5, 0.7]),
    st.sampled_from([0.2, 0.1, 0.25]),
)


# ------------------------------------------------------------------------------------------------ oracle


class Oracle:
    """The rules of the module docstring, written from the timestamps, one row at a time."""

    def __init__(self, sp: pd.DataFrame, samples: SampleConfig) -> None:
        self.samples = samples
        self.user = sp["user_id"].to_numpy()
        self.split = sp["split"].to_numpy()
        self.started = sp["started_at"].to_numpy("datetime64[ns]")
        self.day = sp["start_day"].to_numpy()
        self.first_day = sp.groupby(["user_id", "split"])["start_day"].transform("min").to_numpy()

    def history(self, i: int) -> np.ndarray:
        """Positions of row ``i``'s history: same user, same split, started earlier, day index within
        ``previous_days``; in time order."""
        mask = (
            (self.user == self.user[i])
            & (self.split == self.split[i])
            & (self.started < self.started[i])
            & (self.day >= self.day[i] - self.samples.previous_days)
        )
        pos = np.flatnonzero(mask)
        return pos[np.argsort(self.started[pos], kind="stable")]

    def valid(self) -> np.ndarray:
        n_hist = np.array([len(self.history(i)) for i in range(len(self.day))], dtype=np.int64)
        old_enough = self.day - self.first_day >= self.samples.previous_days
        return old_enough & (n_hist >= self.samples.min_history)

    def kept_users(self) -> list[int]:
        """Users with a valid target in each of train, val and test."""
        valid = self.valid()
        return sorted(
            int(u) for u in np.unique(self.user) if set(self.split[valid & (self.user == u)]) == set(SPLITS)
        )


def steps_before_user_filter(located: pd.DataFrame, config: PreprocessConfig) -> pd.DataFrame:
    """merge -> time features -> split, as build_dataset chains them."""
    merged = merge_staypoints(located, config.locations.merge_max_gap_min)
    return assign_split(add_time_features(merged, config.timezone), config.split)


# ------------------------------------------------------------------------------------------------ checks


def check_order_and_splits(sp: pd.DataFrame, split: SplitConfig) -> None:
    """Rows are grouped by user in (start_day, start_min) order, which is started_at order; splits are
    chronological and follow the day-index thresholds."""
    keys = list(zip(sp["user_id"], sp["start_day"], sp["start_min"], strict=True))
    assert keys == sorted(keys)
    for _, user in sp.groupby("user_id", sort=False):
        assert user["started_at"].is_monotonic_increasing
        assert user["started_at"].is_unique
        day = user["start_day"].to_numpy()
        rank = user["split"].map(SPLIT_RANK).to_numpy()
        assert (np.diff(rank) >= 0).all()
        max_day = float(day.max())
        expected = np.where(
            day < max_day * split.train, 0, np.where(day < max_day * (split.train + split.val), 1, 2)
        )
        np.testing.assert_array_equal(rank, expected)


def check_samples(sp: pd.DataFrame, samples: dict[str, pa.Table], config: PreprocessConfig) -> int:
    """Every sample against its target and history rows; returns the number of samples checked."""
    previous_days = config.samples.previous_days
    cap = config.samples.duration_cap_min
    oracle = Oracle(sp, config.samples)
    position = {int(i): p for p, i in enumerate(sp["id"])}
    n_checked = 0
    for name in SPLITS:
        table = samples[name]
        ids = table.column("staypoint_id").to_pylist()
        # exactly one sample per target of this split, in row order
        assert ids == sp.loc[sp["is_target"] & (sp["split"] == name), "id"].tolist()
        for sample in table.to_pylist():
            t = position[sample["staypoint_id"]]
            target = sp.iloc[t]
            hist_pos = np.arange(t - sample["hist_len"], t)  # the implementation's layout ...
            np.testing.assert_array_equal(hist_pos, oracle.history(t))  # ... is the rule
            hist = sp.iloc[hist_pos]

            # the target itself is never in its history
            assert sample["staypoint_id"] not in set(hist["id"])
            # strictly time ordered, all before the target
            assert hist["started_at"].is_monotonic_increasing
            assert hist["started_at"].is_unique
            assert (hist["started_at"] < target["started_at"]).all()
            # within previous_days (day indices), hence less than previous_days + 1 days earlier
            day_gap = target["start_day"] - hist["start_day"]
            assert ((day_gap >= 0) & (day_gap <= previous_days)).all()
            assert (target["started_at"] - hist["started_at"] < (previous_days + 1) * DAY).all()
            # same user, same split: histories never cross splits
            assert (hist["user_id"] == target["user_id"]).all()
            assert (hist["split"] == name).all()
            assert target["split"] == name
            # a valid target
            assert target["is_target"]
            assert sample["hist_len"] >= config.samples.min_history
            assert target["start_day"] - oracle.first_day[t] >= previous_days

            # the lists are those rows' values
            assert sample["loc_hist"] == hist["location_id"].tolist()
            assert sample["user_hist"] == hist["user"].tolist() == [sample["user"]] * len(hist)
            assert sample["weekday_hist"] == hist["weekday"].tolist()
            assert sample["start_min_hist"] == hist["start_min"].tolist()
            assert sample["duration_hist"] == np.minimum(hist["duration"], cap).tolist()
            assert sample["diff_hist"] == day_gap.tolist()
            assert (sample["user_id"], sample["user"]) == (target["user_id"], target["user"])
            assert sample["target_loc"] == target["location_id"]
            assert sample["target_day"] == target["start_day"]
            assert sample["target_start_min"] == target["start_min"]
            assert sample["target_weekday"] == target["weekday"]
            n_checked += 1
    return n_checked


# ------------------------------------------------------------------------------------------------- tests


class TestBuildDatasetProperties:
    @_SETTINGS
    @given(located=located_staypoints(), config=_CONFIG)
    def test_samples_follow_the_history_rules(self, located: pd.DataFrame, config: PreprocessConfig) -> None:
        before_filter = Oracle(steps_before_user_filter(located, config), config.samples)
        kept = before_filter.kept_users()
        assume(kept)  # with no user kept, build_dataset fails: see test_no_user_kept_is_not_an_index_error

        ds = build_dataset(located, config)
        sp = ds.staypoints
        assert sorted(sp["user_id"].unique()) == kept
        assert ds.stats["n_valid_targets_before_user_filter"] == int(before_filter.valid().sum())
        check_order_and_splits(sp, config.split)
        np.testing.assert_array_equal(sp["is_target"].to_numpy(), Oracle(sp, config.samples).valid())
        n = check_samples(sp, ds.samples, config)
        assert n == int(sp["is_target"].sum()) == sum(ds.stats["n_samples"].values()) > 0


class TestStepsProperties:
    """The steps without the user filter, so that every user's targets are checked."""

    @_SETTINGS
    @given(located=located_staypoints(dense_first_user=False), config=_CONFIG)
    def test_history_windows_valid_targets_and_samples(
        self, located: pd.DataFrame, config: PreprocessConfig
    ) -> None:
        sp = steps_before_user_filter(located, config)
        assume((sp["split"] == "train").any())  # encode needs a train vocabulary
        check_order_and_splits(sp, config.split)
        oracle = Oracle(sp, config.samples)

        lo, diff_day = history_windows(sp, config.samples.previous_days)
        np.testing.assert_array_equal(diff_day, oracle.day - oracle.first_day)
        for i in range(len(sp)):
            np.testing.assert_array_equal(np.arange(lo[i], i), oracle.history(i))

        valid = valid_targets(sp, config.samples)
        np.testing.assert_array_equal(valid, oracle.valid())

        enc, _ = encode(sp.assign(is_target=valid), config.samples.duration_cap_min)
        samples = build_samples(enc, enc["is_target"].to_numpy(), config.samples.previous_days)
        assert check_samples(enc, samples, config) == int(valid.sum())


def test_no_user_kept_is_not_an_index_error() -> None:
    """One user with a single staypoint has no target: build_dataset must give empty samples or a clear
    ValueError, not an IndexError from deep inside."""
    start = pd.Timestamp("2008-03-01 08:00", tz="UTC")
    located = pd.DataFrame(
        {
            "user_id": np.array([1], np.int32),
            "started_at": [start],
            "finished_at": [start + pd.Timedelta(hours=1)],
            "location_id": np.array([3], np.int64),
            "latitude": [39.9],
            "longitude": [116.3],
        }
    )
    with pytest.raises(ValueError, match="no user has a valid target in every split"):
        build_dataset(located, PreprocessConfig())


@pytest.mark.xfail(
    strict=True,
    reason="known limit: ordering uses wall-clock (start_day, start_min); in a DST fall-back hour a later "
    "staypoint sorts first and enters an earlier one's history (reference uses UTC; GeoLife's zone has no DST)",
)
def test_dst_fall_back_hour_can_put_a_later_staypoint_in_the_history() -> None:
    """America/New_York, 2008-11-02: 05:30 UTC is 01:30 EDT, 06:10 UTC is 01:10 EST (40 minutes later)."""
    starts = pd.to_datetime(["2008-11-02 05:30", "2008-11-02 06:10"], utc=True)
    merged = pd.DataFrame(
        {
            "user_id": np.int32(1),
            "started_at": starts,
            "finished_at": starts + pd.Timedelta(minutes=20),
            "location_id": [1, 2],
        }
    )
    sp = assign_split(add_time_features(merged, "America/New_York"))
    lo, _ = history_windows(sp, 7)
    for i in range(len(sp)):
        assert (sp["started_at"].iloc[lo[i] : i] < sp["started_at"].iloc[i]).all()
