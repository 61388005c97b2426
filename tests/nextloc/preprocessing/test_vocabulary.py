"""Tests for :mod:`nextloc.preprocessing.vocabulary`: what encoded ids mean and how samples move between vocabularies.

Small synthetic frames pin the exact values; the end-to-end checks build the dataset of the GeoLife sample
the way ``tasks/preprocess.py`` does (``locate_staypoints`` -> ``build_dataset`` -> vocabularies from the
located and the final staypoints).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from nextloc.config import PreprocessConfig
from nextloc.preprocessing.dataset import build_dataset, locate_staypoints
from nextloc.preprocessing.sequences import PAD, SPLITS, UNSEEN
from nextloc.preprocessing.vocabulary import (
    LOCATION_COLUMNS,
    USER_COLUMNS,
    location_mapping,
    location_vocabulary,
    translate_samples,
    user_data_groups,
    user_vocabulary,
)

M_PER_DEG_LAT = 6_371_000.0 * np.pi / 180  # metres per degree of latitude on the sphere the module uses
BASE = (39.98, 116.33)  # Beijing
LIST32 = pa.list_(pa.int32())
ID_COLUMNS = ("loc_hist", "target_loc", "user", "user_hist")


def north(metres: float, origin: tuple[float, float] = BASE) -> tuple[float, float]:
    """A point ``metres`` due north of ``origin``."""
    return origin[0] + metres / M_PER_DEG_LAT, origin[1]


def locations(centres: dict[int, tuple[float, float]], raw_offset: int = 100) -> pd.DataFrame:
    """A location vocabulary: ``{loc_index: (lat, lon)}``."""
    index = sorted(centres)
    return pd.DataFrame(
        {
            "loc_index": np.array(index, np.int64),
            "raw_location_id": np.array([raw_offset + i for i in index], np.int64),
            "latitude": [centres[i][0] for i in index],
            "longitude": [centres[i][1] for i in index],
            "n_staypoints": np.ones(len(index), np.int64),
        }
    )


def users(user_ids: dict[int, int]) -> pd.DataFrame:
    """A user vocabulary: ``{user_index: user_id}``."""
    index = sorted(user_ids)
    return pd.DataFrame(
        {"user_index": np.array(index, np.int64), "user_id": np.array([user_ids[i] for i in index], np.int64)}
    )


def samples_table(user: list[int], loc_hist: list[list[int]], target_loc: list[int]) -> pa.Table:
    """A samples table with the schema of :func:`nextloc.preprocessing.sequences.build_samples` (distinct non-id values)."""
    lengths = [len(h) for h in loc_hist]
    n = len(user)

    def lists(start: int) -> pa.Array:
        return pa.array([[start + i * 10 + j for j in range(k)] for i, k in enumerate(lengths)], LIST32)

    return pa.table(
        {
            "staypoint_id": pa.array(range(1000, 1000 + n), pa.int64()),
            "user_id": pa.array([500 + u for u in user], pa.int32()),
            "user": pa.array(user, pa.int32()),
            "loc_hist": pa.array(loc_hist, LIST32),
            "user_hist": pa.array([[u] * k for u, k in zip(user, lengths, strict=True)], LIST32),
            "weekday_hist": lists(1),
            "start_min_hist": lists(100),
            "duration_hist": lists(300),
            "diff_hist": lists(5),
            "target_loc": pa.array(target_loc, pa.int32()),
            "target_weekday": pa.array([i % 7 for i in range(n)], pa.int32()),
            "target_start_min": pa.array([60 * i for i in range(n)], pa.int32()),
            "target_day": pa.array([10 + i for i in range(n)], pa.int32()),
            "hist_len": pa.array(lengths, pa.int32()),
        }
    )


def flat(table: pa.Table, column: str) -> list[int]:
    return pc.list_flatten(table.column(column)).to_pylist()


# --------------------------------------------------------------------------- #
# location_vocabulary / user_vocabulary
# --------------------------------------------------------------------------- #


@pytest.fixture(params=["Int64", "int64"])
def located(request) -> pd.DataFrame:
    """Located staypoints of 3 raw locations (nullable Int64 as DBSCAN gives them, int64 as parquet may)."""
    return pd.DataFrame(
        {
            "user_id": [7, 7, 7, 9, 9, 9, 9],
            "location_id": pd.array([30, 10, 10, 20, 30, 30, 40], dtype=request.param),
            "latitude": [40.3, 40.0, 40.2, 41.0, 40.4, 40.8, 42.0],
            "longitude": [116.6, 116.0, 116.2, 117.0, 116.5, 117.0, 118.0],
        }
    )


@pytest.fixture
def encoded() -> pd.DataFrame:
    """Final (merged, encoded) staypoints: raw 10 -> 2, 20 -> 3, 30 -> 4; raw 40 only outside train -> 1."""
    return pd.DataFrame(
        {
            "user_id": [9, 9, 7, 7, 7, 9, 9],
            "user": [2, 2, 1, 1, 1, 2, 2],
            "location_id": [4, 3, 4, 2, 2, 1, 4],
            "raw_location_id": [30, 20, 30, 10, 10, 40, 30],
            "split": ["train", "train", "train", "train", "val", "test", "test"],
            "started_at": pd.to_datetime(
                [
                    "2008-10-01 08:00",
                    "2008-10-01 18:00",
                    "2008-10-02 09:00",
                    "2008-10-02 13:00",
                    "2008-12-01 09:00",
                    "2009-01-05 08:00",
                    "2009-01-05 19:00",
                ],
                utc=True,
            ),
        }
    ).assign(finished_at=lambda f: f["started_at"] + pd.Timedelta(hours=2))


class TestVocabularies:
    def test_location_vocabulary(self, located, encoded):
        vocab = location_vocabulary(located, encoded)
        assert list(vocab.columns) == LOCATION_COLUMNS
        assert vocab["loc_index"].tolist() == [2, 3, 4]
        assert vocab["raw_location_id"].tolist() == [10, 20, 30]
        np.testing.assert_allclose(vocab["latitude"], [40.1, 41.0, 40.5])  # means, not medians
        np.testing.assert_allclose(vocab["longitude"], [116.1, 117.0, 116.7])
        assert vocab["n_staypoints"].tolist() == [2, 1, 3]
        assert vocab["n_train_visits"].tolist() == [1, 1, 2]  # train split only: loc 2's val visit is not
        assert vocab.index.tolist() == [0, 1, 2]

    def test_location_vocabulary_leaves_out_pad_and_unseen(self, located, encoded):
        vocab = location_vocabulary(located, encoded)
        assert 40 not in vocab["raw_location_id"].tolist()
        assert vocab["loc_index"].min() >= 2

    def test_location_vocabulary_does_not_depend_on_row_order(self, located, encoded):
        shuffled = location_vocabulary(
            located.sample(frac=1, random_state=1), encoded.sample(frac=1, random_state=2)
        )
        pd.testing.assert_frame_equal(shuffled, location_vocabulary(located, encoded))

    def test_user_vocabulary(self, encoded):
        vocab = user_vocabulary(encoded)
        assert list(vocab.columns) == USER_COLUMNS
        assert vocab[["user_index", "user_id"]].to_dict("list") == {"user_index": [1, 2], "user_id": [7, 9]}
        assert vocab.index.tolist() == [0, 1]
        assert vocab["data_fingerprint"].str.fullmatch("[0-9a-f]{16}").all()
        assert vocab["data_fingerprint"].nunique() == 2

    def test_user_fingerprint_changes_with_the_users_own_staypoints_only(self, encoded):
        before = user_vocabulary(encoded)
        later = encoded.copy()
        row = later.index[later["user_id"] == 7][0]
        later.loc[row, "finished_at"] = later.loc[row, "finished_at"] + pd.Timedelta(minutes=5)
        later["location_id"] = later["location_id"][::-1].to_numpy()  # ids moved: not the user's data
        after = user_vocabulary(later)
        assert user_data_groups(after, before) == {7: "changed", 9: "unchanged"}
        assert user_data_groups(after, before[before["user_id"] == 9]) == {7: "new_user", 9: "unchanged"}
        assert user_data_groups(after, before[["user_index", "user_id"]]) == {7: "unknown", 9: "unknown"}


# --------------------------------------------------------------------------- #
# location_mapping
# --------------------------------------------------------------------------- #

A, B, C, D = BASE, north(1_000), north(2_000), north(50_000)


class TestLocationMapping:
    def test_identical_vocabularies_map_to_themselves(self):
        vocab = locations({2: A, 3: B, 4: C, 5: D})
        mapping = location_mapping(vocab, vocab, radius_m=50)
        assert mapping.tolist() == [0, 1, 2, 3, 4, 5]
        assert mapping[PAD] == PAD
        assert mapping[UNSEEN] == UNSEEN

    def test_shifted_indices_follow_the_centres(self):
        source = locations({2: A, 3: B, 4: C})
        target = locations({2: C, 3: A, 4: D, 5: B}, raw_offset=900)  # other order, other raw ids
        assert location_mapping(source, target, radius_m=50).tolist() == [0, 1, 3, 5, 2]

    def test_a_location_farther_than_the_radius_is_unseen(self):
        source = locations({2: A, 3: north(100)})
        target = locations({2: A})
        assert location_mapping(source, target, radius_m=50).tolist() == [0, 1, 2, 1]
        assert location_mapping(source, target, radius_m=150).tolist() == [0, 1, 2, 2]

    def test_the_radius_is_in_metres(self):
        source = locations({2: north(40)})
        target = locations({2: A})
        assert location_mapping(source, target, radius_m=39.5).tolist() == [0, 1, 1]
        assert location_mapping(source, target, radius_m=40.5).tolist() == [0, 1, 2]

    @pytest.mark.parametrize("order", ["near first", "near last"])
    def test_the_nearest_of_several_within_the_radius_wins(self, order):
        near, far = north(-10), north(30)
        target = locations({2: near, 3: far} if order == "near first" else {2: far, 3: near})
        source = locations({2: A})
        expected = 2 if order == "near first" else 3
        assert location_mapping(source, target, radius_m=50).tolist() == [0, 1, expected]

    def test_empty_vocabularies(self):
        empty = locations({})
        some = locations({2: A, 3: B})
        assert location_mapping(empty, some, radius_m=50).tolist() == [0, 1]
        assert location_mapping(some, empty, radius_m=50).tolist() == [0, 1, 1, 1]


# --------------------------------------------------------------------------- #
# translate_samples
# --------------------------------------------------------------------------- #

SOURCE_LOCS = locations({2: A, 3: B, 4: C, 5: D})
TARGET_LOCS = locations({2: C, 3: A, 4: B}, raw_offset=900)  # D is not in the target: unseen there
LOC_MAP = {0: 0, 1: 1, 2: 3, 3: 4, 4: 2, 5: 1}
SOURCE_USERS = users({1: 11, 2: 73, 3: 112})
TARGET_USERS = users({1: 73, 2: 112, 3: 150})  # 11 is unknown to the target
USER_MAP = {0: 0, 1: 0, 2: 1, 3: 2}


@pytest.fixture
def samples() -> pa.Table:
    return samples_table(
        user=[1, 2, 3, 2],
        loc_hist=[[2, 3], [4, 1, 5], [5, 5, 2, 2], []],
        target_loc=[3, 1, 5, 2],
    )


class TestTranslateSamples:
    def test_identical_vocabularies_give_the_same_table(self, samples):
        out, stats = translate_samples(samples, SOURCE_LOCS, SOURCE_LOCS, SOURCE_USERS, SOURCE_USERS)
        assert out.equals(samples)
        assert out.schema == samples.schema
        assert stats == {
            "history_matched_pct": 100.0,
            "targets_matched_pct": 100.0,
            "users_matched_pct": 100.0,
        }

    def test_ids_are_translated(self, samples):
        out, _ = translate_samples(samples, SOURCE_LOCS, TARGET_LOCS, SOURCE_USERS, TARGET_USERS)
        assert out.column("loc_hist").to_pylist() == [
            [LOC_MAP[i] for i in row] for row in samples.column("loc_hist").to_pylist()
        ]
        assert out.column("loc_hist").to_pylist() == [[3, 4], [2, 1, 1], [1, 1, 3, 3], []]
        assert out.column("target_loc").to_pylist() == [4, 1, 1, 3]
        assert out.column("user").to_pylist() == [0, 1, 2, 1]  # user 11 is unknown to the target: 0
        assert out.column("user_hist").to_pylist() == [[0, 0], [1, 1, 1], [2, 2, 2, 2], []]

    def test_other_columns_and_the_schema_are_kept(self, samples):
        out, _ = translate_samples(samples, SOURCE_LOCS, TARGET_LOCS, SOURCE_USERS, TARGET_USERS)
        assert out.schema == samples.schema
        assert out.column_names == samples.column_names
        for name in samples.column_names:
            if name not in ID_COLUMNS:
                assert out.column(name).equals(samples.column(name)), name
        assert out.column("user_id").to_pylist() == samples.column("user_id").to_pylist()

    def test_list_columns_keep_their_row_lengths(self, samples):
        out, _ = translate_samples(samples, SOURCE_LOCS, TARGET_LOCS, SOURCE_USERS, TARGET_USERS)
        for name in ("loc_hist", "user_hist"):
            before = samples.column(name).combine_chunks()
            after = out.column(name).combine_chunks()
            assert after.offsets.equals(before.offsets), name
            assert pc.list_value_length(after).equals(pc.list_value_length(before)), name
            assert pc.list_value_length(after).to_pylist() == samples.column("hist_len").to_pylist()

    def test_stats(self, samples):
        _, stats = translate_samples(samples, SOURCE_LOCS, TARGET_LOCS, SOURCE_USERS, TARGET_USERS)
        # history entries >= 2: 2,3,4,5,5,5,2,2 -> matched 2,3,4,2,2 (5 is nowhere in the target)
        assert stats["history_matched_pct"] == pytest.approx(100 * 5 / 8)
        # targets >= 2: 3,5,2 -> matched 3,2
        assert stats["targets_matched_pct"] == pytest.approx(100 * 2 / 3)
        # rows: users 1 (unknown),2,3,2
        assert stats["users_matched_pct"] == pytest.approx(100 * 3 / 4)

    def test_with_no_known_location_the_shares_are_100(self):
        table = samples_table(user=[1, 2], loc_hist=[[1, 1], [0]], target_loc=[1, 1])
        _, stats = translate_samples(table, SOURCE_LOCS, TARGET_LOCS, SOURCE_USERS, TARGET_USERS)
        assert stats["history_matched_pct"] == 100.0
        assert stats["targets_matched_pct"] == 100.0

    @pytest.mark.parametrize("layout", ["sliced", "chunked"])
    def test_sliced_and_chunked_tables(self, samples, layout):
        table = (
            samples.slice(1, 3)
            if layout == "sliced"
            else pa.concat_tables([samples.slice(0, 2), samples.slice(2)])
        )
        whole, _ = translate_samples(samples, SOURCE_LOCS, TARGET_LOCS, SOURCE_USERS, TARGET_USERS)
        out, _ = translate_samples(table, SOURCE_LOCS, TARGET_LOCS, SOURCE_USERS, TARGET_USERS)
        expected = whole.slice(1, 3) if layout == "sliced" else whole
        assert out.to_pydict() == expected.to_pydict()
        assert out.schema == samples.schema

    @pytest.mark.parametrize("how", ["empty lists", "slice", "schema.empty_table"])
    def test_an_empty_table(self, samples, how):
        if how == "empty lists":
            table = samples_table(user=[], loc_hist=[], target_loc=[])
        elif how == "slice":
            table = samples.slice(4, 0)
        else:
            table = samples.schema.empty_table()
        assert table.num_rows == 0
        out, stats = translate_samples(table, SOURCE_LOCS, TARGET_LOCS, SOURCE_USERS, TARGET_USERS)
        assert out.num_rows == 0
        assert out.schema == samples.schema
        assert stats == {
            "history_matched_pct": 100.0,
            "targets_matched_pct": 100.0,
            "users_matched_pct": 100.0,
        }


# --------------------------------------------------------------------------- #
# end to end on the GeoLife sample
# --------------------------------------------------------------------------- #


class SampleDataset:
    """The sample's located staypoints, dataset and vocabularies, built as ``tasks/preprocess.py`` does."""

    def __init__(self, staypoints: pd.DataFrame, extents: pd.DataFrame) -> None:
        config = PreprocessConfig()
        self.located = locate_staypoints(staypoints, extents, config).staypoints
        self.dataset = build_dataset(self.located, config)
        self.locations = location_vocabulary(self.located, self.dataset.staypoints)
        self.users = user_vocabulary(self.dataset.staypoints)


@pytest.fixture(scope="module")
def sample(sample_staypoints) -> SampleDataset:
    return SampleDataset(*sample_staypoints)


@pytest.fixture(scope="module")
def sample_without_first_user(sample_staypoints, sample) -> SampleDataset:
    """The same sample without the first kept user: DBSCAN and the encoders give other ids."""
    dropped = int(sample.users["user_id"].iloc[0])
    staypoints, extents = sample_staypoints
    return SampleDataset(
        staypoints[staypoints["user_id"] != dropped].reset_index(drop=True),
        extents[extents["user_id"] != dropped].reset_index(drop=True),
    )


class TestOnTheSample:
    def test_vocabularies_describe_every_encoded_id(self, sample):
        stats, locs, users_ = sample.dataset.stats, sample.locations, sample.users
        assert locs["loc_index"].tolist() == list(range(2, stats["total_loc_num"]))
        assert len(locs) == stats["n_train_locations"] > 0
        assert users_["user_index"].tolist() == list(range(1, stats["total_user_num"]))
        assert users_["user_id"].is_monotonic_increasing
        assert not locs.isna().any().any()
        # each index is the one the encoder gave its raw id in the final staypoints
        pairs = sample.dataset.staypoints.loc[
            lambda d: d["location_id"] >= 2, ["location_id", "raw_location_id"]
        ]
        assert dict(zip(locs["loc_index"], locs["raw_location_id"], strict=True)) == dict(
            pairs.drop_duplicates().itertuples(index=False, name=None)
        )

    def test_location_centres_are_the_mean_of_their_staypoints(self, sample):
        located = sample.located.assign(location_id=sample.located["location_id"].astype(np.int64))
        for row in sample.locations.itertuples():
            members = located[located["location_id"] == row.raw_location_id]
            assert row.n_staypoints == len(members) > 0
            assert row.latitude == pytest.approx(members["latitude"].mean(), abs=1e-12)
            assert row.longitude == pytest.approx(members["longitude"].mean(), abs=1e-12)

    @pytest.mark.parametrize("split", SPLITS)
    def test_translating_into_its_own_vocabulary_changes_nothing(self, sample, split):
        table = sample.dataset.samples[split]
        assert table.num_rows > 0
        out, stats = translate_samples(table, sample.locations, sample.locations, sample.users, sample.users)
        assert out.equals(table)
        assert stats == {
            "history_matched_pct": 100.0,
            "targets_matched_pct": 100.0,
            "users_matched_pct": 100.0,
        }

    def test_a_relabelled_vocabulary_is_followed(self, sample):
        rng = np.random.default_rng(0)
        perm = rng.permutation(len(sample.locations))
        relabelled = sample.locations.assign(loc_index=sample.locations["loc_index"].to_numpy()[perm])
        users_relabelled = sample.users.assign(user_index=sample.users["user_index"].to_numpy()[::-1])
        table = sample.dataset.samples["test"]
        out, stats = translate_samples(table, sample.locations, relabelled, sample.users, users_relabelled)
        locs = np.arange(len(sample.locations) + 2)
        locs[sample.locations["loc_index"].to_numpy()] = relabelled["loc_index"].to_numpy()
        assert flat(out, "loc_hist") == locs[flat(table, "loc_hist")].tolist()
        assert out.column("target_loc").to_pylist() == locs[table.column("target_loc").to_numpy()].tolist()
        by_id = dict(zip(users_relabelled["user_id"], users_relabelled["user_index"], strict=True))
        assert out.column("user").to_pylist() == [by_id[u] for u in table.column("user_id").to_pylist()]
        assert stats["history_matched_pct"] == stats["targets_matched_pct"] == 100.0

    def test_into_the_vocabulary_of_a_dataset_without_one_user(self, sample, sample_without_first_user):
        other = sample_without_first_user
        table = sample.dataset.samples["test"]
        out, stats = translate_samples(table, sample.locations, other.locations, sample.users, other.users)
        assert out.schema == table.schema
        assert out.column("hist_len").equals(table.column("hist_len"))

        # users go by GeoLife id; the dropped user is unknown (0)
        by_id = dict(zip(other.users["user_id"], other.users["user_index"], strict=True))
        expected_users = [by_id.get(u, 0) for u in table.column("user_id").to_pylist()]
        assert out.column("user").to_pylist() == expected_users
        assert 0 in expected_users
        assert stats["users_matched_pct"] == pytest.approx(100 * np.mean(np.array(expected_users) > 0))

        # a matched location's new centre lies within 50 m of its old one; an unmatched one has none there
        src = sample.locations.set_index("loc_index")
        dst = other.locations.set_index("loc_index")
        before = flat(table, "loc_hist") + table.column("target_loc").to_pylist()
        after = flat(out, "loc_hist") + out.column("target_loc").to_pylist()
        for old, new in zip(before, after, strict=True):
            if old < 2:
                assert new == old
                continue
            dist = _metres(src.loc[old], dst)
            if new >= 2:
                assert dist[new] <= 50.0
                assert dist[new] == dist.min()
            else:
                assert new == UNSEEN
                assert dist.min() > 50.0
        hist_before, hist_after = np.array(flat(table, "loc_hist")), np.array(flat(out, "loc_hist"))
        assert stats["history_matched_pct"] == pytest.approx(100 * np.mean(hist_after[hist_before >= 2] >= 2))
        assert 0 < stats["history_matched_pct"] < 100  # some old locations are gone, most are not


def _metres(centre: pd.Series, vocab: pd.DataFrame) -> pd.Series:
    """Haversine distance (m) from one centre to every location of ``vocab`` (indexed by loc_index)."""
    lat1, lon1 = np.radians(centre["latitude"]), np.radians(centre["longitude"])
    lat2, lon2 = np.radians(vocab["latitude"]), np.radians(vocab["longitude"])
    a = np.sin((lat2 - lat1) / 2) ** 2 + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
    return 2 * 6_371_000.0 * np.arcsin(np.sqrt(a))
