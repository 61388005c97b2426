"""nextloc's vectorised time features, splits, valid targets and samples against the reference loops.

The reference (mie-lab/location-prediction) builds its data set in ``preprocessing/utils.py``
(``enrich_time_info`` / ``_get_time``, ``split_dataset`` / ``_get_split_days_user``, ``get_valid_sequence``),
``preprocessing/geolife.py`` (``_filter_sp_history``: valid ids, user filter, user re-encoding) and
``utils/dataloader.py`` (``sp_loc_dataset``: duration cap, split, location encoding, and the per-row sample
loop producing ``X``/``user_X``/``weekday_X``/``start_min_X``/``dur_X``/``diff``/``Y``). Those O(n^2) loops
are ported below as independent oracles and compared with :mod:`nextloc.preprocessing.sequences` /
:func:`nextloc.preprocessing.dataset.build_dataset`, end to end on the GeoLife sample and on small inline fixtures.
"""

from __future__ import annotations

import warnings

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import trackintel  # noqa: F401  (registers the .as_staypoints accessor)
from sklearn.preprocessing import OrdinalEncoder

from nextloc.config import PreprocessConfig, SampleConfig
from nextloc.preprocessing.dataset import build_dataset, locate_staypoints
from nextloc.preprocessing.locations import merge_staypoints
from nextloc.preprocessing.sequences import (
    PAD,
    SPLITS,
    UNSEEN,
    WallTimes,
    add_time_features,
    assign_split,
    build_samples,
    encode,
    filter_users_with_targets,
    valid_targets,
    wall_clock_ns,
)

PREVIOUS_DAY = 7
DURATION_CAP = 60 * 24 * 2 - 1  # 2879
REF_SPLIT_NAMES = {"train": "train", "vali": "val", "test": "test"}
BASE = pd.Timestamp("2008-03-03", tz="UTC")  # a Monday

# The reference's groupby-applies run on the grouping column (its functions need it); trackintel's merge
# concatenates the staypoints with the empty triplegs frame the reference passes.
PD_APPLY_ON_GROUPING = "ignore:DataFrameGroupBy.apply operated on the grouping columns:FutureWarning"
TI_CONCAT_EMPTY_MESSAGE = "The behavior of DataFrame concatenation with empty or all-NA entries"
pytestmark = [pytest.mark.filterwarnings(PD_APPLY_ON_GROUPING)]


# --------------------------------------------------------------------------- #
# the reference, ported (preprocessing/utils.py, preprocessing/geolife.py, utils/dataloader.py)
# --------------------------------------------------------------------------- #


def ref_enrich_time_info(sp):
    sp = sp.groupby("user_id", group_keys=False).apply(_ref_get_time)
    sp.drop(columns={"finished_at", "started_at"}, inplace=True)
    sp.sort_values(by=["user_id", "start_day", "start_min"], inplace=True)
    sp = sp.reset_index(drop=True)

    #
    sp["location_id"] = sp["location_id"].astype(int)
    sp["user_id"] = sp["user_id"].astype(int)

    # final cleaning, reassign ids
    sp.index.name = "id"
    sp.reset_index(inplace=True)
    return sp


def _ref_get_time(df):
    min_day = pd.to_datetime(df["started_at"].min().date())
    df["started_at"] = df["started_at"].dt.tz_localize(tz=None)
    df["finished_at"] = df["finished_at"].dt.tz_localize(tz=None)

    df["start_day"] = (df["started_at"] - min_day).dt.days
    df["end_day"] = (df["finished_at"] - min_day).dt.days

    df["start_min"] = df["started_at"].dt.hour * 60 + df["started_at"].dt.minute
    df["end_min"] = df["finished_at"].dt.hour * 60 + df["finished_at"].dt.minute
    df.loc[df["end_min"] == 0, "end_min"] = 24 * 60

    df["weekday"] = df["started_at"].dt.weekday
    return df


def ref_split_dataset(totalData):
    """Split dataset into train, vali and test."""
    totalData = totalData.groupby("user_id", group_keys=False).apply(_ref_get_split_days_user)

    train_data = totalData.loc[totalData["Dataset"] == "train"].copy()
    vali_data = totalData.loc[totalData["Dataset"] == "vali"].copy()
    test_data = totalData.loc[totalData["Dataset"] == "test"].copy()

    # final cleaning
    train_data.drop(columns={"Dataset"}, inplace=True)
    vali_data.drop(columns={"Dataset"}, inplace=True)
    test_data.drop(columns={"Dataset"}, inplace=True)

    return train_data, vali_data, test_data


def _ref_get_split_days_user(df):
    """Split the dataset according to the tracked day of each user."""
    maxDay = df["start_day"].max()
    train_split = maxDay * 0.6
    validation_split = maxDay * 0.8

    df["Dataset"] = "test"
    df.loc[df["start_day"] < train_split, "Dataset"] = "train"
    df.loc[(df["start_day"] >= train_split) & (df["start_day"] < validation_split), "Dataset"] = "vali"

    return df


def ref_get_valid_sequence(input_df, previous_day=14):
    valid_id = []
    for user in input_df["user_id"].unique():
        df = input_df.loc[input_df["user_id"] == user].copy().reset_index(drop=True)

        min_days = df["start_day"].min()
        df["diff_day"] = df["start_day"] - min_days

        for index, row in df.iterrows():
            # exclude the first records
            if row["diff_day"] < previous_day:
                continue

            hist = df.iloc[:index]
            hist = hist.loc[(hist["start_day"] >= (row["start_day"] - previous_day))]
            if len(hist) < 3:
                continue

            valid_id.append(row["id"])

    return valid_id


def ref_filter_sp_history(sp, previous_day=PREVIOUS_DAY, filter_users=True):
    """``_filter_sp_history`` without its files: (final_valid_id, filtered_sp with users re-encoded 1..U)."""
    train_data, vali_data, test_data = ref_split_dataset(sp)
    all_ids = sp[["id"]].copy()

    valid_ids = ref_get_valid_sequence(train_data, previous_day=previous_day)
    valid_ids.extend(ref_get_valid_sequence(vali_data, previous_day=previous_day))
    valid_ids.extend(ref_get_valid_sequence(test_data, previous_day=previous_day))

    all_ids[f"{previous_day}"] = 0
    all_ids.loc[all_ids["id"].isin(valid_ids), f"{previous_day}"] = 1

    all_ids.set_index("id", inplace=True)
    final_valid_id = all_ids.loc[all_ids.sum(axis=1) == all_ids.shape[1]].reset_index()["id"].values

    if filter_users:
        valid_users_train = train_data.loc[train_data["id"].isin(final_valid_id), "user_id"].unique()
        valid_users_vali = vali_data.loc[vali_data["id"].isin(final_valid_id), "user_id"].unique()
        valid_users_test = test_data.loc[test_data["id"].isin(final_valid_id), "user_id"].unique()
        valid_users = set.intersection(set(valid_users_train), set(valid_users_vali), set(valid_users_test))
        filtered_sp = sp.loc[sp["user_id"].isin(valid_users)].copy()
    else:
        filtered_sp = sp.copy()

    enc = OrdinalEncoder(dtype=np.int64)
    filtered_sp["user_id"] = enc.fit_transform(filtered_sp["user_id"].values.reshape(-1, 1)) + 1
    return final_valid_id, filtered_sp


def ref_dataloader(ori_data, valid_ids, previous_day=PREVIOUS_DAY):
    """``sp_loc_dataset.generate_data`` (collective model, default day selection) for all three splits.

    Returns ``({"train": [sample, ...], "val": ..., "test": ...}, encoded staypoints)``; each sample is the
    reference dict plus ``"id"`` (the target's staypoint id, added here to line samples up).
    """
    ori_data = ori_data.copy()
    ori_data.sort_values(by=["user_id", "start_day", "start_min"], inplace=True)

    # truncate too long duration: > 2days to 2 days
    ori_data.loc[ori_data["duration"] > 60 * 24 * 2 - 1, "duration"] = 60 * 24 * 2 - 1

    train_data, vali_data, test_data = ref_split_dataset(ori_data)

    # _encode_loc: fit to train, add 2 (1 = unseen, 0 = padding)
    enc = OrdinalEncoder(dtype=np.int64, handle_unknown="use_encoded_value", unknown_value=-1).fit(
        train_data["location_id"].values.reshape(-1, 1)
    )
    train_data["location_id"] = enc.transform(train_data["location_id"].values.reshape(-1, 1)) + 2
    vali_data["location_id"] = enc.transform(vali_data["location_id"].values.reshape(-1, 1)) + 2
    test_data["location_id"] = enc.transform(test_data["location_id"].values.reshape(-1, 1)) + 2

    valid_ids = set(valid_ids)
    samples = {}
    for name, data in (("train", train_data), ("val", vali_data), ("test", test_data)):
        samples[name] = [
            item
            for _, group in data.groupby("user_id")
            for item in _ref_valid_sequence_user(group.copy(), valid_ids, previous_day)
        ]
    encoded = pd.concat([train_data, vali_data, test_data]).sort_values("id")
    return samples, encoded


def _ref_valid_sequence_user(df, valid_ids, previous_day):
    """``___getValidSequenceUser``."""
    df.reset_index(drop=True, inplace=True)

    data_single_user = []

    # get the day of tracking
    min_days = df["start_day"].min()
    df["diff_day"] = df["start_day"] - min_days

    for index, row in df.iterrows():
        # exclude the first records that do not include enough previous_day
        if row["diff_day"] < previous_day:
            continue

        # get the history records [curr-previous, curr]
        hist = df.iloc[:index]
        hist = hist.loc[(hist["start_day"] >= (row["start_day"] - previous_day))]

        # should be in the valid user ids
        if not (row["id"] in valid_ids):  # noqa: E713 - verbatim reference
            continue

        data_dict = {}
        data_dict["X"] = hist["location_id"].values
        data_dict["user_X"] = hist["user_id"].values
        data_dict["weekday_X"] = hist["weekday"].values
        data_dict["start_min_X"] = hist["start_min"].values
        data_dict["dur_X"] = hist["duration"].values
        data_dict["diff"] = (row["diff_day"] - hist["diff_day"]).astype(int).values
        data_dict["Y"] = int(row["location_id"])
        data_dict["id"] = int(row["id"])  # test instrumentation, not in the reference

        data_single_user.append(data_dict)

    return data_single_user


def ref_duration(merged: pd.DataFrame) -> pd.DataFrame:
    """``get_dataset``: recalculate the staypoint duration after merging (whole minutes, floored)."""
    merged = merged.copy()
    merged["duration"] = (merged["finished_at"] - merged["started_at"]).dt.total_seconds() // 60
    return merged


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def trackintel_merge(located: pd.DataFrame) -> pd.DataFrame:
    """The reference merge (trackintel) of located staypoints: index ``id``, location_id Int64."""
    gdf = gpd.GeoDataFrame(
        located[["user_id", "started_at", "finished_at", "location_id"]].copy(),
        geometry=gpd.points_from_xy(located["longitude"], located["latitude"]),
        crs="EPSG:4326",
    ).rename_geometry("geom")
    gdf.index = pd.RangeIndex(len(gdf), name="id")
    gdf = gdf[["user_id", "started_at", "finished_at", "geom", "location_id"]]
    return gdf.as_staypoints.merge_staypoints(
        triplegs=pd.DataFrame([]), max_time_gap="1min", agg={"location_id": "first"}
    )


def nextloc_merge(located: pd.DataFrame) -> pd.DataFrame:
    merged = merge_staypoints(located[["user_id", "started_at", "finished_at", "location_id"]], 1.0)
    merged["location_id"] = merged["location_id"].astype(np.int64)
    return merged


def visit(user: int, day: int, hhmm: str, minutes: int, loc: int) -> dict:
    start = BASE + pd.Timedelta(days=day) + pd.Timedelta(hhmm + ":00")
    return {
        "user_id": user,
        "started_at": start,
        "finished_at": start + pd.Timedelta(minutes=minutes),
        "location_id": loc,
    }


def frame(visits: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(visits)
    df["user_id"] = df["user_id"].astype(np.int32)
    df["location_id"] = df["location_id"].astype(np.int64)
    return df


HOME, WORK, NEW, OTHER, SHOP = 10, 20, 30, 40, 50
USER_A, USER_B = 17, 5


def fixture_user_a() -> list[dict]:
    """User 17: every day 0..50 work 08:00-17:00 then home 18:00-07:00 (+1 day).

    maxDay 50: train days < 30, val 30..39, test >= 40. Day 38's work visit is at NEW (never seen in train,
    so encoded 1); day 48's work visit is at NEW again (still 1: the vocabulary is train only).
    """
    visits = []
    for day in range(51):
        work = NEW if day in (38, 48) else WORK
        visits.append(visit(USER_A, day, "08:00", 9 * 60, work))
        visits.append(visit(USER_A, day, "18:00", 13 * 60, HOME))
    return visits


def fixture_user_b() -> list[dict]:
    """User 5: sparse history and very long stays; a last visit on day 100 puts days <= 59 in train.

    Days 0, 10, 11, 12, 13 (1 h each, OTHER), 14 10:00 -> 17 10:00 (4320 min), 17 12:00 -> 19 12:00
    (2880 min), 19 13:00 -> 21 12:59 (2879 min), 21 14:00 (1 h, SHOP), 100 (1 h, SHOP).
    """
    return [
        visit(USER_B, 0, "09:00", 60, OTHER),
        visit(USER_B, 10, "09:00", 60, OTHER),
        visit(USER_B, 11, "09:00", 60, OTHER),
        visit(USER_B, 12, "09:00", 60, OTHER),
        visit(USER_B, 13, "09:00", 60, OTHER),
        visit(USER_B, 14, "10:00", 4320, HOME),
        visit(USER_B, 17, "12:00", 2880, WORK),
        visit(USER_B, 19, "13:00", 2879, HOME),
        visit(USER_B, 21, "14:00", 60, SHOP),
        visit(USER_B, 100, "09:00", 60, SHOP),
    ]


def nextloc_steps(merged: pd.DataFrame, filter_users: bool = False):
    """add_time_features -> assign_split -> valid_targets -> [user filter] -> encode -> build_samples."""
    sp = assign_split(add_time_features(merged))
    valid = valid_targets(sp)
    sp = sp.assign(is_target=valid)
    if filter_users:
        sp = filter_users_with_targets(sp, sp["is_target"].to_numpy())
    enc, sizes = encode(sp)
    return enc, build_samples(enc, enc["is_target"].to_numpy()), sizes


def oracle_steps(merged: pd.DataFrame, filter_users: bool = False):
    sp_time = ref_enrich_time_info(ref_duration(merged))
    final_valid_id, filtered = ref_filter_sp_history(sp_time, filter_users=filter_users)
    samples, encoded = ref_dataloader(filtered, final_valid_id)
    return sp_time, final_valid_id, samples, encoded


def assert_same_samples(ours: dict, theirs: dict) -> None:
    for split in SPLITS:
        got = ours[split].to_pylist()
        want = theirs[split]
        assert len(got) == len(want), split
        for g, w in zip(got, want, strict=True):
            assert g["staypoint_id"] == w["id"]
            assert g["loc_hist"] == w["X"].tolist()
            assert g["user_hist"] == w["user_X"].tolist()
            assert g["weekday_hist"] == w["weekday_X"].tolist()
            assert g["start_min_hist"] == w["start_min_X"].tolist()
            assert g["duration_hist"] == [int(d) for d in w["dur_X"]]
            assert g["diff_hist"] == w["diff"].tolist()
            assert g["target_loc"] == w["Y"]
            assert g["hist_len"] == len(w["X"])
            assert g["user"] == w["user_X"][0]


def hist_rows(sp: pd.DataFrame, sample: dict) -> pd.DataFrame:
    """The staypoints a sample's history came from: the hist_len rows right before its target row."""
    target = int(np.flatnonzero(sp["id"].to_numpy() == sample["staypoint_id"])[0])
    return sp.iloc[target - sample["hist_len"] : target]


@pytest.fixture(scope="module")
def located(sample_staypoints) -> pd.DataFrame:
    """Located (DBSCAN, noise dropped) activity staypoints of the quality users, from nextloc."""
    return locate_staypoints(*sample_staypoints, PreprocessConfig()).staypoints


@pytest.fixture(scope="module")
def reference_merged(located) -> pd.DataFrame:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TI_CONCAT_EMPTY_MESSAGE, category=FutureWarning)
        return trackintel_merge(located)


@pytest.fixture(scope="module")
def oracle(reference_merged):
    return oracle_steps(reference_merged, filter_users=True)


@pytest.fixture(scope="module")
def dataset(located):
    return build_dataset(located, PreprocessConfig())


# --------------------------------------------------------------------------- #
# end to end on the sample
# --------------------------------------------------------------------------- #


class TestAgainstReferenceOnSample:
    def test_merge_matches_the_reference_merge(self, located, reference_merged):
        ours = nextloc_merge(located)
        assert len(ours) == len(reference_merged)
        for col in ("user_id", "location_id"):
            np.testing.assert_array_equal(
                ours[col].to_numpy(np.int64), reference_merged[col].to_numpy(np.int64)
            )
        for col in ("started_at", "finished_at"):
            np.testing.assert_array_equal(
                ours[col].to_numpy("datetime64[ns]"),
                reference_merged[col].dt.tz_convert("UTC").to_numpy("datetime64[ns]"),
            )

    def test_time_features(self, located, oracle):
        sp_time = oracle[0]
        ours = add_time_features(nextloc_merge(located))
        cols = [
            "id",
            "user_id",
            "location_id",
            "duration",
            "start_day",
            "end_day",
            "start_min",
            "end_min",
            "weekday",
        ]
        for col in cols:
            np.testing.assert_array_equal(
                ours[col].to_numpy(np.int64), sp_time[col].to_numpy(np.int64), err_msg=col
            )

    def test_split(self, located, oracle):
        sp_time = oracle[0]
        ours = assign_split(add_time_features(nextloc_merge(located)))
        train, vali, test = ref_split_dataset(sp_time.copy())
        expected = pd.concat(
            [train.assign(s="train"), vali.assign(s="val"), test.assign(s="test")]
        ).sort_values("id")
        np.testing.assert_array_equal(ours["split"].to_numpy(), expected["s"].to_numpy())
        assert set(ours["split"]) == set(SPLITS)

    def test_valid_targets(self, located, oracle):
        ours = assign_split(add_time_features(nextloc_merge(located)))
        valid = valid_targets(ours, SampleConfig(previous_days=PREVIOUS_DAY, min_history=3))
        assert set(ours.loc[valid, "id"]) == set(oracle[1].tolist())
        assert valid.sum() > 100

    def test_final_staypoints(self, dataset, oracle):
        _, final_valid_id, _, encoded = oracle
        sp = dataset.staypoints
        np.testing.assert_array_equal(sp["id"].to_numpy(), encoded["id"].to_numpy())
        np.testing.assert_array_equal(sp["user"].to_numpy(), encoded["user_id"].to_numpy())
        np.testing.assert_array_equal(sp["location_id"].to_numpy(), encoded["location_id"].to_numpy())
        np.testing.assert_array_equal(sp["is_target"].to_numpy(), sp["id"].isin(final_valid_id).to_numpy())
        # more than one user survives and both encodings start where they should
        assert sp["user"].min() == 1
        assert sp["user"].nunique() == sp["user"].max() >= 2
        assert sp["location_id"].min() >= UNSEEN

    def test_samples(self, dataset, oracle):
        samples = oracle[2]
        assert_same_samples(dataset.samples, samples)
        assert all(len(samples[s]) > 0 for s in SPLITS)
        # the sample has targets at locations never seen in train (encoded 1), and they are kept
        unseen = sum(
            int((dataset.samples[s].column("target_loc").to_numpy() == UNSEEN).sum()) for s in SPLITS
        )
        assert unseen == sum(1 for s in SPLITS for item in samples[s] if item["Y"] == UNSEEN) > 0

    def test_location_encoding_is_ordinal_encoder_on_train(self, dataset):
        sp = dataset.staypoints
        train = sp["split"] == "train"
        enc = OrdinalEncoder(dtype=np.int64, handle_unknown="use_encoded_value", unknown_value=-1)
        enc.fit(sp.loc[train, "raw_location_id"].to_numpy().reshape(-1, 1))
        expected = enc.transform(sp["raw_location_id"].to_numpy().reshape(-1, 1))[:, 0] + 2
        np.testing.assert_array_equal(sp["location_id"].to_numpy(), expected)
        assert dataset.stats["total_loc_num"] == len(enc.categories_[0]) + 2
        assert set(sp.loc[train, "location_id"]) == set(range(2, len(enc.categories_[0]) + 2))

    def test_history_invariants(self, dataset):
        """Every history: same user and split as its target, strictly before it, time ordered, within
        ``previous_days``; no target in the first 7 days of its (user, split)."""
        sp = dataset.staypoints
        first_day = sp.groupby(["user_id", "split"])["start_day"].transform("min")
        assert (sp.loc[sp["is_target"], "start_day"] - first_day[sp["is_target"]] >= PREVIOUS_DAY).all()
        for split in SPLITS:
            for sample in dataset.samples[split].to_pylist():
                target = sp.loc[sp["id"] == sample["staypoint_id"]].iloc[0]
                hist = hist_rows(sp, sample)
                assert (hist["user_id"] == target["user_id"]).all()
                assert (hist["split"] == split).all()
                assert target["split"] == split
                assert sample["staypoint_id"] not in set(hist["id"])
                assert (hist["id"] < target["id"]).all()
                order = list(zip(hist["start_day"], hist["start_min"], strict=True))
                assert order == sorted(order)
                assert (hist["start_day"] >= target["start_day"] - PREVIOUS_DAY).all()
                assert sample["loc_hist"] == hist["location_id"].tolist()
                assert sample["diff_hist"] == (target["start_day"] - hist["start_day"]).tolist()
                assert len(hist) >= 3


# --------------------------------------------------------------------------- #
# inline fixtures
# --------------------------------------------------------------------------- #


class TestTimeFeatures:
    def test_matches_reference_on_edge_cases(self):
        """Expected for user 3 (first staypoint 2008-03-03 23:30): start_day counts from 2008-03-03;
        a stay ending exactly at midnight has end_min 1440 and end_day = next day; seconds are floored
        (duration 89 min for 89 min 59 s); weekday Mon=0; rows come back sorted by (user, day, minute)."""
        merged = frame(
            [
                {
                    "user_id": 3,
                    "started_at": BASE + pd.Timedelta("1 days 10:00:30"),
                    "finished_at": BASE + pd.Timedelta("1 days 11:30:29"),
                    "location_id": 2,
                },
                {
                    "user_id": 3,
                    "started_at": BASE + pd.Timedelta("0 days 23:30:00"),
                    "finished_at": BASE + pd.Timedelta("1 days 00:00:00"),
                    "location_id": 1,
                },
                visit(1, 6, "12:00", 30, 7),
            ]
        )
        ours = add_time_features(merged)
        assert ours[
            ["id", "user_id", "start_day", "end_day", "start_min", "end_min", "duration", "weekday"]
        ].to_dict("records") == [
            {
                "id": 0,
                "user_id": 1,
                "start_day": 0,
                "end_day": 0,
                "start_min": 720,
                "end_min": 750,
                "duration": 30,
                "weekday": 6,
            },
            {
                "id": 1,
                "user_id": 3,
                "start_day": 0,
                "end_day": 1,
                "start_min": 1410,
                "end_min": 1440,
                "duration": 30,
                "weekday": 0,
            },
            {
                "id": 2,
                "user_id": 3,
                "start_day": 1,
                "end_day": 1,
                "start_min": 600,
                "end_min": 690,
                "duration": 89,
                "weekday": 1,
            },
        ]
        ref = ref_enrich_time_info(
            ref_duration(merged.sort_values(["user_id", "started_at"]).reset_index(drop=True))
        )
        for col in [
            "id",
            "user_id",
            "location_id",
            "duration",
            "start_day",
            "end_day",
            "start_min",
            "end_min",
            "weekday",
        ]:
            np.testing.assert_array_equal(
                ours[col].to_numpy(np.int64), ref[col].to_numpy(np.int64), err_msg=col
            )

    def test_timezone_changes_wall_clock_features(self):
        """In Asia/Shanghai (UTC+8) the 23:30 UTC Monday stay starts at 07:30 on Tuesday."""
        merged = frame([visit(1, 0, "23:30", 60, 1)])
        local = add_time_features(merged, timezone="Asia/Shanghai")
        assert local[["start_min", "weekday", "end_min"]].iloc[0].tolist() == [450, 1, 510]


@pytest.fixture(scope="module")
def merged() -> pd.DataFrame:
    """Users 17 and 5 (see :func:`fixture_user_a` and :func:`fixture_user_b`)."""
    return frame(fixture_user_a() + fixture_user_b())


@pytest.fixture(scope="module")
def ours(merged):
    return nextloc_steps(merged)


class TestSplitsTargetsAndSamples:
    def test_split_boundaries(self, ours):
        """User 17 (maxDay 50): day 29 train, day 30 val (30.0 = 0.6*50 is not < 30), day 39 val, day 40
        test. User 5 (maxDay 100): days <= 59 train, day 100 test."""
        sp = ours[0]
        day_split = sp.groupby(["user_id", "start_day"])["split"].first()
        assert [day_split[(USER_A, d)] for d in (0, 29, 30, 39, 40, 50)] == [
            "train",
            "train",
            "val",
            "val",
            "test",
            "test",
        ]
        assert [day_split[(USER_B, d)] for d in (0, 21, 100)] == ["train", "train", "test"]

    def test_valid_targets(self, ours):
        """User 17: train targets on days 7..29 (46), val 37..39 (6), test 47..50 (8) -- the first 7 days of
        each split never are. User 5: days 13, 14, 17, 19, 21 (day 10-12 have < 3 history rows in their
        7-day window; day 100 is the first day of its split)."""
        sp = ours[0]
        targets = sp[sp["is_target"]]
        a = targets[targets["user_id"] == USER_A]
        assert a.groupby("split").size().to_dict() == {"train": 46, "val": 6, "test": 8}
        assert sorted(set(a.loc[a["split"] == "val", "start_day"])) == [37, 38, 39]
        assert sorted(set(a.loc[a["split"] == "test", "start_day"])) == [47, 48, 49, 50]
        assert targets.loc[targets["user_id"] == USER_B, "start_day"].tolist() == [13, 14, 17, 19, 21]

    def test_history_of_first_val_targets(self, ours):
        """Day 37 work (first val target): history = val days 30..36, 14 rows, nothing from train.
        Day 37 home: the same 14 rows plus that morning's work visit (diff 0), 15 rows."""
        sp, samples = ours[0], ours[1]
        val = samples["val"].to_pylist()
        work, home = val[0], val[1]
        assert (work["target_day"], work["target_start_min"], work["hist_len"]) == (37, 480, 14)
        assert work["diff_hist"] == [d for d in range(7, 0, -1) for _ in range(2)]
        assert (home["target_day"], home["target_start_min"], home["hist_len"]) == (37, 1080, 15)
        assert home["diff_hist"][-1] == 0
        assert home["start_min_hist"][-1] == 480
        assert set(hist_rows(sp, home)["split"]) == {"val"}
        assert (home["target_day"], home["target_start_min"]) not in set(
            zip([37 - d for d in home["diff_hist"]], home["start_min_hist"], strict=True)
        )

    def test_unseen_targets_are_kept(self, ours):
        """Days 38 and 48 work at NEW, absent from train: both are targets with location 1 (unseen)."""
        samples = ours[1]
        unseen = [
            (s, x["target_day"]) for s in SPLITS for x in samples[s].to_pylist() if x["target_loc"] == UNSEEN
        ]
        assert unseen == [("val", 38), ("test", 48)]

    def test_encodings(self, ours):
        """Train vocabulary {HOME, WORK, OTHER, SHOP} = {10, 20, 40, 50} -> 2, 3, 4, 5; NEW (30) -> 1;
        0 is never used (padding). Users 5, 17 -> 1, 2."""
        sp, _, sizes = ours
        mapping = dict(zip(sp["raw_location_id"], sp["location_id"], strict=True))
        assert mapping == {HOME: 2, WORK: 3, NEW: UNSEEN, OTHER: 4, SHOP: 5}
        assert PAD not in set(sp["location_id"])
        assert dict(zip(sp["user_id"], sp["user"], strict=True)) == {USER_B: 1, USER_A: 2}
        assert sizes == {"total_loc_num": 6, "total_user_num": 3, "n_train_locations": 4}
        enc = OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1)
        enc.fit(sp.loc[sp["split"] == "train", ["raw_location_id"]].to_numpy())
        np.testing.assert_array_equal(
            sp["location_id"], enc.transform(sp[["raw_location_id"]].to_numpy())[:, 0] + 2
        )

    def test_duration_cap(self, ours):
        """User 5's day-21 target: history days 14, 17, 19 with raw durations 4320, 2880, 2879 minutes,
        capped to 2879 each; diff 7, 4, 2; sparse earlier days are outside the window."""
        sp, samples = ours[0], ours[1]
        last = [x for x in samples["train"].to_pylist() if x["user_id"] == USER_B][-1]
        assert last["target_day"] == 21
        assert last["duration_hist"] == [DURATION_CAP] * 3
        assert hist_rows(sp, last)["duration"].tolist() == [4320, 2880, 2879]
        assert last["diff_hist"] == [7, 4, 2]
        assert last["loc_hist"] == [2, 3, 2]

    def test_samples_match_reference(self, merged, ours):
        _, final_valid_id, samples, _ = oracle_steps(merged, filter_users=False)
        assert set(ours[0].loc[ours[0]["is_target"], "id"]) == set(final_valid_id.tolist())
        assert_same_samples(ours[1], samples)

    def test_user_filter_matches_reference(self, merged):
        """User 5 has no val/test target and is dropped; user 17 is re-encoded as 1."""
        enc, samples, sizes = nextloc_steps(merged, filter_users=True)
        assert set(enc["user_id"]) == {USER_A}
        assert set(enc["user"]) == {1}
        _, _, ref_samples, _ = oracle_steps(merged, filter_users=True)
        assert_same_samples(samples, ref_samples)

    def test_input_order_does_not_matter(self, merged, ours):
        shuffled = merged.sample(frac=1.0, random_state=3)
        again = nextloc_steps(shuffled)
        for split in SPLITS:
            assert again[1][split].equals(ours[1][split])


@pytest.mark.parametrize("timezone", ["UTC", "Asia/Shanghai", "America/New_York"])
def test_wall_times_are_pandas_wall_clock_features(timezone):
    """WallTimes (the arrays behind add_time_features and a request's history) against pandas' .dt, across
    DST changes and midnight."""
    rng = np.random.default_rng(3)
    start = pd.Series(
        pd.to_datetime("2008-03-01", utc=True) + pd.to_timedelta(rng.integers(0, 300 * 86400, 500), "s")
    )
    end = start + pd.to_timedelta(rng.integers(0, 3 * 86400 * 10**9, 500), "ns")
    start_ns = start.to_numpy("datetime64[ns]").view(np.int64)
    wall = WallTimes.of(start_ns, end.to_numpy("datetime64[ns]").view(np.int64), timezone)
    local_start = start.dt.tz_convert(timezone).dt.tz_localize(None)
    local_end = end.dt.tz_convert(timezone).dt.tz_localize(None)
    assert np.array_equal(wall_clock_ns(start_ns, timezone), local_start.to_numpy().view(np.int64))
    assert np.array_equal(wall.start_date, local_start.to_numpy("datetime64[D]").astype(np.int64))
    assert np.array_equal(wall.end_date, local_end.to_numpy("datetime64[D]").astype(np.int64))
    assert np.array_equal(wall.start_min, local_start.dt.hour * 60 + local_start.dt.minute)
    end_min = local_end.dt.hour * 60 + local_end.dt.minute
    assert np.array_equal(wall.end_min, end_min.where(end_min != 0, 1440))
    assert np.array_equal(wall.weekday, local_start.dt.weekday)
    assert np.array_equal(wall.duration, ((end - start).dt.total_seconds() // 60).astype(np.int64))
