"""Tests for :mod:`nextloc.predict.answer` (a user's visits or GPS fixes -> named next places) and the model bundle
of :mod:`nextloc.bundle` (weights and config as plain data).

The encoding is checked against preprocessing itself: the GeoLife sample's dataset is built the way
``tasks/preprocess.py`` does, every test sample's history is handed back as raw visits (times, centres) and
must come out exactly as the sample's history (locations, minutes, weekdays, capped durations, day
differences, user), in both timezone rules. Small synthetic frames pin the matching radius and the errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from nextloc.bundle import BUNDLE_FILE, WEIGHTS_FILE, ModelBundle, load_bundle, save_bundle
from nextloc.config import PreprocessConfig
from nextloc.io.geolife import list_plt_files, read_user
from nextloc.io.visits import validate_visits
from nextloc.models import build_model
from nextloc.models.baselines import BaselineModule, MarkovBaseline, MostFrequentBaseline
from nextloc.models.batch import SampleTensors
from nextloc.models.ensemble import SeedEnsemble
from nextloc.models.packed import packed_batch
from nextloc.models.scorer import PackedScorer
from nextloc.predict.answer import predict
from nextloc.predict.answer_set import describe_set
from nextloc.predict.histories import encode_visits, sample_histories
from nextloc.predict.history_reader import read_history
from nextloc.preprocessing.dataset import build_dataset, locate_staypoints
from nextloc.preprocessing.sequences import UNSEEN
from nextloc.preprocessing.staypoints import generate_staypoints
from nextloc.preprocessing.vocabulary import location_vocabulary, user_vocabulary
from nextloc.routine.novelty import NewPlaceHead

M_PER_DEG_LAT = 6_371_000.0 * np.pi / 180
BASE = (39.98, 116.33)  # Beijing


def north(metres: float, origin: tuple[float, float] = BASE) -> tuple[float, float]:
    return origin[0] + metres / M_PER_DEG_LAT, origin[1]


def small_bundle(config: PreprocessConfig | None = None, model=None) -> ModelBundle:
    """Locations 2, 3, 4 at BASE, 500 m and 1 km north of it; user 153 is user index 1."""
    config = config or PreprocessConfig()
    centres = [BASE, north(500), north(1000)]
    locations = pd.DataFrame(
        {
            "loc_index": np.array([2, 3, 4], np.int64),
            "raw_location_id": np.array([10, 11, 12], np.int64),
            "latitude": [c[0] for c in centres],
            "longitude": [c[1] for c in centres],
            "n_staypoints": np.array([7, 3, 1], np.int64),
        }
    )
    users = pd.DataFrame({"user_index": [1], "user_id": [153], "data_fingerprint": ["x"]})
    model = model if model is not None else BaselineModule(MostFrequentBaseline(5))
    return ModelBundle(
        "most_frequent",
        PackedScorer(model, False, config.samples.duration_cap_min),
        config,
        NewPlaceHead.constant(0.2),
        locations,
        users,
        50.0,
    )


def visits(rows: list[tuple]) -> pd.DataFrame:
    """``(user_id, start, end, (lat, lon))`` rows -> a visits frame (times as ISO text)."""
    return pd.DataFrame(
        {
            "user_id": [r[0] for r in rows],
            "started_at": [r[1] for r in rows],
            "finished_at": [r[2] for r in rows],
            "latitude": [r[3][0] for r in rows],
            "longitude": [r[3][1] for r in rows],
        }
    )


DAY1 = [
    (153, "2008-10-20T01:00:00Z", "2008-10-20T09:00:00Z", BASE),
    (153, "2008-10-20T10:00:00Z", "2008-10-20T11:00:00Z", north(500)),
    (153, "2008-10-21T01:00:00Z", "2008-10-21T09:00:00Z", BASE),
]


# --------------------------------------------------------------------------- #
# bundles: weights and config as data
# --------------------------------------------------------------------------- #


class TestBundle:
    def test_neural_round_trip(self, tmp_path: Path) -> None:
        torch.manual_seed(0)
        model = build_model("pointer_plus", 6, 3, d_model=16, nhead=2, max_seq_len=12).eval()
        config = PreprocessConfig.model_validate({"samples": {"duration_cap_min": 600}})
        bundle = small_bundle(config)
        save_bundle(
            tmp_path, "pointer_plus", model, config, bundle.head, bundle.locations, bundle.users, 40.0
        )
        assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
            BUNDLE_FILE,
            "locations.parquet",
            "users.parquet",
            WEIGHTS_FILE,
        ]
        spec = json.loads((tmp_path / BUNDLE_FILE).read_text())
        assert spec["model"]["config"]["max_seq_len"] == 12
        assert spec["preprocess"]["samples"]["duration_cap_min"] == 600

        loaded = load_bundle(tmp_path)
        assert loaded.kind == "pointer_plus"
        assert loaded.max_history == 12
        assert loaded.match_radius_m == 40.0
        assert loaded.scorer.duration_cap_min == 600  # the configured cap, not 2879
        assert loaded.head == bundle.head
        pd.testing.assert_frame_equal(loaded.locations, bundle.locations)
        packed = torch.tensor([[[2, 480, 0, 900, 1, 1], [3, 600, 0, 60, 0, 1]]])
        with torch.no_grad():
            expected = PackedScorer(model, True, 600)(packed)
            torch.testing.assert_close(loaded.scorer(packed), expected, rtol=0, atol=0)

    def test_ensemble_round_trip(self, tmp_path: Path) -> None:
        """A seed ensemble is stored as its members' configs and weights, and reloads to the same scores."""
        members = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            members.append(build_model("pointer_plus", 6, 3, d_model=16, nhead=2, max_seq_len=12).eval())
        ensemble = SeedEnsemble(members, log_prob_output=True).eval()
        save_bundle(tmp_path, "pointer_plus_ensemble", ensemble, PreprocessConfig())
        spec = json.loads((tmp_path / BUNDLE_FILE).read_text())
        assert [m["max_seq_len"] for m in spec["model"]["config"]["members"]] == [12, 12]
        loaded = load_bundle(tmp_path)
        assert isinstance(loaded.scorer.model, SeedEnsemble)
        assert loaded.max_history == 12
        packed = torch.tensor([[[2, 480, 0, 900, 1, 1], [3, 600, 0, 60, 0, 1]]])
        with torch.no_grad():
            expected = PackedScorer(ensemble, True)(packed)
            torch.testing.assert_close(loaded.scorer(packed), expected, rtol=0, atol=0)

    def test_the_configured_duration_cap_is_applied(self) -> None:
        """A 900-minute stay reads as 600 under a 600-minute cap: the same as a 600-minute stay."""
        torch.manual_seed(0)
        model = build_model("mhsa", 6, 3, d_model=16, nhead=2).eval()
        capped = PackedScorer(model, False, duration_cap_min=600)
        long_stay = torch.tensor([[[2, 480, 0, 900, 1, 1]]])
        at_cap = torch.tensor([[[2, 480, 0, 600, 1, 1]]])
        with torch.no_grad():
            torch.testing.assert_close(capped(long_stay), capped(at_cap))
            assert not torch.equal(PackedScorer(model, False, 2879)(long_stay), capped(long_stay))

    def test_markov_round_trip(self, tmp_path: Path, make_samples) -> None:
        train = make_samples([1, 1, 2], [[2, 3, 2], [3, 4], [4, 2, 2]], [3, 2, 3])
        markov = BaselineModule(MarkovBaseline(6).fit(train))
        save_bundle(tmp_path, "markov", markov, PreprocessConfig())
        loaded = load_bundle(tmp_path)
        assert loaded.locations is None
        assert loaded.head is None
        batch = train.batch(torch.arange(len(train)))
        torch.testing.assert_close(loaded.scorer.model(batch), markov(batch), rtol=0, atol=0)

    def test_weights_of_another_model_are_refused(self, tmp_path: Path) -> None:
        save_bundle(tmp_path, "mhsa", build_model("mhsa", 6, 3, d_model=16, nhead=2), PreprocessConfig())
        spec = json.loads((tmp_path / BUNDLE_FILE).read_text())
        spec["model"]["config"]["d_model"] = 32
        (tmp_path / BUNDLE_FILE).write_text(json.dumps(spec))
        with pytest.raises(Exception, match="size|shape|weights"):
            load_bundle(tmp_path)

    def test_a_bundle_of_a_removed_kind_is_refused_in_one_line(self, tmp_path: Path) -> None:
        """pointer_plus_refit was removed (nextloc.models.registry.REMOVED_KINDS): a bundle of it names its
        file, the kind and why, in one line."""
        save_bundle(
            tmp_path, "pointer_plus", build_model("pointer_plus", 6, 3, max_seq_len=8), PreprocessConfig()
        )
        spec = json.loads((tmp_path / BUNDLE_FILE).read_text())
        spec["kind"] = "pointer_plus_refit"
        (tmp_path / BUNDLE_FILE).write_text(json.dumps(spec))
        with pytest.raises(ValueError, match="was removed") as err:
            load_bundle(tmp_path)
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith(f"{tmp_path / BUNDLE_FILE}: model kind 'pointer_plus_refit' was removed: ")

    def test_no_bundle(self, tmp_path: Path) -> None:
        with pytest.raises(FileNotFoundError, match=BUNDLE_FILE):
            load_bundle(tmp_path)


# --------------------------------------------------------------------------- #
# visits -> histories: exactly as preprocessing
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module", params=["UTC", "Asia/Shanghai"])
def sample_dataset(request, sample_staypoints):
    staypoints, extents = sample_staypoints
    config = PreprocessConfig(timezone=request.param)
    located = locate_staypoints(staypoints, extents, config)
    dataset = build_dataset(located.staypoints, config)
    bundle = small_bundle(config)
    n_loc = int(dataset.stats["total_loc_num"])
    bundle = ModelBundle(
        "most_frequent",
        PackedScorer(BaselineModule(MostFrequentBaseline(n_loc)), False, config.samples.duration_cap_min),
        config,
        None,
        location_vocabulary(located.staypoints, dataset.staypoints),
        user_vocabulary(dataset.staypoints),
    )
    return dataset, bundle


def test_visits_encode_exactly_as_the_samples(sample_dataset) -> None:
    """Each test sample's user and split, handed over as raw visits (a known place at its centre, a place
    never seen far from every centre) with the target's start as the prediction time, encodes to exactly
    the sample's history."""
    dataset, bundle = sample_dataset
    sp = dataset.staypoints.set_index("id")
    table = dataset.samples["test"]
    centres = bundle.locations.set_index("loc_index")
    frames = []
    for i, target_id in enumerate(table.column("staypoint_id").to_pylist()):
        target = sp.loc[target_id]
        rows = sp[
            (sp["user_id"] == target["user_id"])
            & (sp["split"] == target["split"])
            & (sp["started_at"] < target["started_at"])
        ]
        known = rows["location_id"].to_numpy() >= 2
        far = -45.0 + 0.01 * np.arange(len(rows))  # a new place: thousands of km from every centre
        lat = np.where(known, centres["latitude"].reindex(rows["location_id"]).to_numpy(), far)
        lon = np.where(known, centres["longitude"].reindex(rows["location_id"]).to_numpy(), 170.0)
        frames.append(
            pd.DataFrame(
                {
                    "history_id": str(i),
                    "user_id": rows["user_id"].to_numpy(),
                    "started_at": rows["started_at"].to_numpy(),
                    "finished_at": rows["finished_at"].to_numpy(),
                    "latitude": lat,
                    "longitude": lon,
                }
            )
        )
    raw = pd.concat(frames, ignore_index=True)
    assert (raw.groupby("history_id").size() > 0).all()
    # one call for every sample, each with its own prediction time: the target's start
    by_sample = []
    for i, target_id in enumerate(table.column("staypoint_id").to_pylist()):
        one = encode_visits(
            validate_visits(raw[raw["history_id"] == str(i)]), bundle, sp.loc[target_id, "started_at"]
        )
        by_sample.append(one.packed[0])
    expected = sample_histories(table).packed
    assert len(by_sample) == len(expected) > 20
    assert (raw["latitude"] < 0).any(), "no history holds a new place: the check would be weaker"
    for i, got in enumerate(by_sample):
        np.testing.assert_array_equal(got, expected[i, : len(got)], err_msg=f"sample {i}")
        assert (expected[i, len(got) :, 0] == 0).all(), f"sample {i}: history too short"


def test_many_histories_in_one_call_equal_one_by_one() -> None:
    """``history_id`` splits the input; answers come back in input order and equal one call per history
    (padding a short history in a batch changes nothing)."""
    torch.manual_seed(0)
    bundle = small_bundle(model=build_model("pointer_plus", 5, 2, d_model=16, nhead=2).eval())
    bundle = ModelBundle(**{**bundle.__dict__, "scorer": PackedScorer(bundle.scorer.model, True)})
    rows = visits(DAY1 + [(999, "2008-10-21T01:00:00Z", "2008-10-21T05:00:00Z", north(1000))])
    rows["history_id"] = ["a", "a", "a", "b"]
    together = predict(bundle, encode_visits(validate_visits(rows), bundle), k=2)
    alone = [
        predict(bundle, encode_visits(validate_visits(rows[rows["history_id"] == h]), bundle), k=2)[0]
        for h in ("a", "b")
    ]
    assert [a["history_id"] for a in together] == ["a", "b"]
    for batched, single in zip(together, alone, strict=True):
        assert [p["location_id"] for p in batched["places"]] == [p["location_id"] for p in single["places"]]
        assert [p["probability"] for p in batched["places"]] == pytest.approx(
            [p["probability"] for p in single["places"]], abs=2e-6
        )
        assert {k: v for k, v in batched.items() if k != "places"} == {
            k: v for k, v in single.items() if k != "places"
        }


def test_the_answer_names_places() -> None:
    bundle = small_bundle()
    (answer,) = predict(bundle, encode_visits(validate_visits(visits(DAY1)), bundle), k=3)
    assert answer["user_id"] == 153
    assert answer["known_user"] is True
    assert answer["at"] == "2008-10-21T09:00:00Z"  # the end of the last visit
    assert answer["visits_used"] == 3
    assert answer["new_place_visits"] == 0
    assert answer["p_new_place"] == pytest.approx(0.2)
    first = answer["places"][0]
    assert first == {
        "rank": 1,
        "location_id": 2,  # visited twice: most frequent
        "latitude": round(BASE[0], 6),
        "longitude": round(BASE[1], 6),
        "n_visits": 7,
        "probability": first["probability"],
    }
    assert all(p["location_id"] >= 2 for p in answer["places"])
    assert sum(p["probability"] for p in answer["places"]) == pytest.approx(1.0, abs=1e-5)  # 3 places


class TestAnswerSet:
    """``predict(..., coverage=P)``: the fewest places (and "a new place" when it belongs) holding P."""

    def answer(self, coverage: float | None, bundle: ModelBundle | None = None) -> dict:
        bundle = bundle or small_bundle()
        (answer,) = predict(
            bundle, encode_visits(validate_visits(visits(DAY1)), bundle), 2, coverage=coverage
        )
        return answer

    def test_the_top_k_answer_is_unchanged(self) -> None:
        plain, with_set = self.answer(None), self.answer(0.9)
        assert "answer_set" not in plain
        assert {k: v for k, v in with_set.items() if k != "answer_set"} == plain

    def test_the_fewest_members_most_likely_first(self) -> None:
        """The places share 1 - P(new) = 0.8 (a neural or baseline kind's places sum to 1 alone); P(new)
        0.2 puts "a new place" second, a member once 0.59 (place 2) is not enough."""
        plain = self.answer(None)
        p2 = plain["places"][0]["probability"]
        small = self.answer(0.5)["answer_set"]
        assert small["coverage"] == 0.5
        first = {k: v for k, v in plain["places"][0].items() if k != "rank"}
        assert small["members"] == [{**first, "probability": pytest.approx(0.8 * p2, abs=1e-6)}]
        assert small["total_probability"] == pytest.approx(0.8 * p2, abs=1e-6)
        large = self.answer(0.9)["answer_set"]
        assert [m.get("location_id", "new") for m in large["members"]] == [2, "new", 3]
        assert large["members"][1] == {"new_place": True, "probability": 0.2}
        held = [m["probability"] for m in large["members"]]
        assert held == sorted(held, reverse=True)
        assert large["total_probability"] == pytest.approx(sum(held), abs=1e-5)
        assert sum(held) >= 0.9 > sum(held[:-1])
        assert large["members"][2]["latitude"] == round(north(500)[0], 6)  # a member's place is named

    def test_no_new_place_without_a_head(self) -> None:
        headless = ModelBundle(**{**small_bundle().__dict__, "head": None})
        chosen = self.answer(0.99, headless)["answer_set"]
        assert all("location_id" in m for m in chosen["members"])
        assert chosen["total_probability"] >= 0.99

    @pytest.mark.parametrize("coverage", [0.0, 1.0, -0.5, 1.5, float("nan"), "often"])
    def test_a_coverage_outside_0_1_is_refused(self, coverage) -> None:
        with pytest.raises(ValueError, match="coverage must be a number strictly between 0 and 1"):
            self.answer(coverage)

    def test_a_set_in_one_line(self) -> None:
        assert describe_set(self.answer(None)) is None
        assert describe_set(self.answer(0.9)) == "90% set, total 0.962: places 2, 3 and a new place"
        many = {
            "answer_set": {
                "coverage": 0.8,
                "total_probability": 0.81,
                "members": [{"location_id": i, "probability": 0.1} for i in range(2, 10)],
            }
        }
        assert describe_set(many, most=3) == "80% set, total 0.810: 8 places (2, 3, 4, ...)"


def test_a_visit_far_from_every_known_place_is_new() -> None:
    """Within the 50 m radius of a centre: that place; 5 km away: new (1)."""
    bundle = small_bundle()
    rows = visits(
        [
            (153, "2008-10-20T01:00:00Z", "2008-10-20T09:00:00Z", north(30)),
            (153, "2008-10-20T10:00:00Z", "2008-10-20T11:00:00Z", north(5000)),
            (153, "2008-10-20T12:00:00Z", "2008-10-20T13:00:00Z", north(540)),
            (153, "2008-10-20T14:00:00Z", "2008-10-20T15:00:00Z", north(5000, (30.0, 120.0))),
        ]
    )
    histories = encode_visits(validate_visits(rows), bundle)
    assert histories.packed[0, :, 0].tolist() == [2, UNSEEN, 3, UNSEEN]
    assert histories.meta["new_place_visits"].tolist() == [2]


def test_time_features_window_and_cap() -> None:
    """Minutes, weekday and day differences in the dataset's timezone; the window is ``previous_days``
    before the prediction time; short visits are not activities; durations are capped."""
    config = PreprocessConfig.model_validate(
        {"timezone": "Asia/Shanghai", "samples": {"duration_cap_min": 600}}
    )
    bundle = small_bundle(config)
    rows = visits(
        [
            (153, "2008-10-01T01:00:00Z", "2008-10-01T09:00:00Z", BASE),  # 20 days before: outside
            (153, "2008-10-13T17:00:00Z", "2008-10-14T01:00:00Z", BASE),  # Tue 01:00 in Beijing, 7 days
            (153, "2008-10-20T02:00:00Z", "2008-10-20T02:20:00Z", north(500)),  # 20 min: not an activity
            (153, "2008-10-20T03:00:00Z", "2008-10-21T03:00:00Z", north(1000)),  # Mon 11:00, 1440 min
        ]
    )
    histories = encode_visits(validate_visits(rows), bundle, pd.Timestamp("2008-10-21T04:00:00Z"))
    assert histories.packed[0].tolist() == [
        [2, 60, 1, 480, 7, 1],  # location, start_min, weekday (Tue), duration, diff days, user
        [4, 660, 0, 600, 1, 1],  # capped at 600
    ]


def test_the_window_table_is_built_when_asked_for() -> None:
    """An answer needs the packed rows only: the window's table (what a map draws) waits for a map, then is
    built once; its rows are the packed visits with the request's own coordinates."""
    bundle = small_bundle()
    rows = visits(
        [
            (153, "2008-10-01T01:00:00Z", "2008-10-01T09:00:00Z", north(30)),  # 20 days before: outside
            (153, "2008-10-20T01:00:00Z", "2008-10-20T09:00:00Z", north(30)),
            (153, "2008-10-20T10:00:00Z", "2008-10-20T11:00:00Z", north(5000)),
        ]
    )
    histories = encode_visits(validate_visits(rows), bundle)
    assert "window" not in vars(histories)  # not built by encode_visits
    window = histories.window
    assert histories.window is window
    assert window.columns.tolist() == ["history", "started_at", "place", "latitude", "longitude"]
    assert window["place"].tolist() == histories.packed[0, :, 0].tolist() == [2, UNSEEN]
    assert window["latitude"].tolist() == [north(30)[0], north(5000)[0]]
    assert window["started_at"].tolist() == [
        pd.Timestamp(t) for t in ("2008-10-20T01:00Z", "2008-10-20T10:00Z")
    ]


def test_an_unknown_user_is_said_so() -> None:
    bundle = small_bundle()
    rows = visits([(42, *DAY1[0][1:])])
    histories = encode_visits(validate_visits(rows), bundle)
    assert histories.meta["known_user"].tolist() == [False]
    assert histories.packed[0, :, 5].tolist() == [0]  # user index 0: the model's "no user"


def test_histories_longer_than_the_model_takes_keep_the_latest() -> None:
    torch.manual_seed(0)
    model = build_model("pointer_plus", 5, 2, d_model=16, nhead=2, max_seq_len=2).eval()
    bundle = small_bundle(model=model)
    histories = encode_visits(validate_visits(visits(DAY1)), bundle)
    assert histories.packed[0, :, 0].tolist() == [3, 2]  # the last two visits
    assert len(predict(bundle, histories, k=2)) == 1


# --------------------------------------------------------------------------- #
# reading: formats and bad input
# --------------------------------------------------------------------------- #


def test_plt_fixes_become_the_datasets_staypoints(sample_dir: Path, sample_positionfixes) -> None:
    """A user's ``.plt`` folder reads as that user's staypoints, computed with the dataset's parameters."""
    user_dir = sample_dir / "Data" / "073"
    raw = read_history(user_dir / "Trajectory", PreprocessConfig())
    assert raw.kind == "visits"
    expected = generate_staypoints(sample_positionfixes[73]).staypoints
    assert raw.data["user_id"].unique().tolist() == [73]
    pd.testing.assert_series_equal(raw.data["started_at"], expected["started_at"], check_names=False)
    np.testing.assert_array_equal(raw.data["latitude"], expected["latitude"])
    last = list_plt_files(user_dir)[-1]  # a short trip: fixes but no stay
    with pytest.raises(ValueError, match=rf"{last.name}: empty history: no staypoint .* in \d+ GPS fixes"):
        read_history(last, PreprocessConfig())


def test_positionfixes_csv_equal_plt(tmp_path: Path, sample_dir: Path) -> None:
    files = list_plt_files(sample_dir / "Data" / "073")[-6:]
    table, _ = read_user(73, files)
    fixes = table.to_pandas()
    fixes["tracked_at"] = fixes["tracked_at"].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    fixes.drop(columns=["user_id"]).to_csv(tmp_path / "fixes.csv", index=False)
    from_csv = read_history(tmp_path / "fixes.csv", PreprocessConfig(), user_id=73).data
    trajectory = tmp_path / "Data" / "073" / "Trajectory"
    trajectory.mkdir(parents=True)
    for f in files:
        (trajectory / f.name).write_bytes(f.read_bytes())
    from_plt = read_history(trajectory, PreprocessConfig()).data
    pd.testing.assert_frame_equal(from_csv, from_plt)


def test_json_request_and_csv_read_the_same(tmp_path: Path) -> None:
    rows = visits(DAY1)
    rows.to_csv(tmp_path / "v.csv", index=False)
    (tmp_path / "v.json").write_text(json.dumps({"dataframe_records": rows.to_dict(orient="records")}))
    rows.to_parquet(tmp_path / "v.parquet")
    config = PreprocessConfig()
    csv = read_history(tmp_path / "v.csv", config).data
    pd.testing.assert_frame_equal(read_history(tmp_path / "v.json", config).data, csv)
    pd.testing.assert_frame_equal(read_history(tmp_path / "v.parquet", config).data, csv)
    pd.testing.assert_frame_equal(read_history(json.dumps(rows.to_dict(orient="records")), config).data, csv)


def _bad(frame: pd.DataFrame, tmp_path: Path) -> str:
    frame.to_csv(tmp_path / "visits.csv", index=False)
    with pytest.raises(ValueError, match="visits.csv") as err:
        read_history(tmp_path / "visits.csv", PreprocessConfig())
    return str(err.value)


class TestBadInput:
    def test_missing_column(self, tmp_path: Path) -> None:
        message = _bad(visits(DAY1).drop(columns=["finished_at"]), tmp_path)
        assert "visits lack column(s) ['finished_at']" in message

    def test_unparsable_time(self, tmp_path: Path) -> None:
        rows = visits(DAY1)
        rows.loc[1, "started_at"] = "yesterday at noon"
        message = _bad(rows, tmp_path)
        assert "visits.csv row 2: field 'started_at' is not a time: 'yesterday at noon'" in message

    def test_latitude_400(self, tmp_path: Path) -> None:
        rows = visits(DAY1)
        rows.loc[2, "latitude"] = 400.17
        message = _bad(rows, tmp_path)
        assert "visits.csv row 3: field 'latitude' = 400.17" in message

    def test_longitude_not_a_number(self, tmp_path: Path) -> None:
        rows = visits(DAY1)
        rows["longitude"] = rows["longitude"].astype(object)
        rows.loc[0, "longitude"] = "east"
        assert "row 1: field 'longitude' = 'east'" in _bad(rows, tmp_path)

    def test_a_boolean_is_not_a_coordinate(self) -> None:
        """JSON ``true`` is not latitude 1 (the ingest readers refuse it too)."""
        rows = visits(DAY1).astype({"latitude": object})
        rows.loc[0, "latitude"] = True
        with pytest.raises(ValueError, match="request row 1: field 'latitude' = True is not a latitude"):
            validate_visits(rows, "request")

    def test_visit_ending_before_it_starts(self, tmp_path: Path) -> None:
        rows = visits(DAY1)
        rows.loc[1, "finished_at"] = "2008-10-20T09:30:00Z"
        assert "row 2: field 'finished_at'" in _bad(rows, tmp_path)

    def test_user_id_not_an_integer(self, tmp_path: Path) -> None:
        rows = visits(DAY1)
        rows["user_id"] = rows["user_id"].astype(object)
        rows.loc[0, "user_id"] = "alice"
        assert "row 1: field 'user_id' = 'alice'" in _bad(rows, tmp_path)

    def test_empty_file(self, tmp_path: Path) -> None:
        assert "empty history" in _bad(visits(DAY1).iloc[:0], tmp_path)

    def test_empty_json(self) -> None:
        with pytest.raises(ValueError, match="empty history"):
            read_history("[]", PreprocessConfig())

    def test_no_visit_left_to_score(self) -> None:
        """Only a 10-minute visit: not an activity, so nothing to score; the error names the user."""
        bundle = small_bundle()
        rows = visits([(153, "2008-10-20T01:00:00Z", "2008-10-20T01:10:00Z", BASE)])
        with pytest.raises(ValueError, match=r"empty history: 1 of 1 histories .*user 153.*more than 25 min"):
            encode_visits(validate_visits(rows), bundle)

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(FileNotFoundError, match="nope.csv"):
            read_history(tmp_path / "nope.csv", PreprocessConfig())

    def test_plt_outside_a_user_folder_needs_the_user(self, tmp_path: Path, sample_dir: Path) -> None:
        plt = list_plt_files(sample_dir / "Data" / "073")[-1]
        (tmp_path / plt.name).write_bytes(plt.read_bytes())
        with pytest.raises(ValueError, match="give the user id"):
            read_history(tmp_path / plt.name, PreprocessConfig())


def test_sample_histories_read_as_the_training_batches(sample_dataset) -> None:
    """Packed sample histories are what training sees once binned (:func:`nextloc.models.packed.packed_batch`)."""
    dataset, bundle = sample_dataset
    table = dataset.samples["test"]
    data = SampleTensors(table)
    trained = data.batch(torch.arange(len(data)))
    served = packed_batch(torch.from_numpy(sample_histories(table).packed), bundle.scorer.duration_cap_min)
    for name in ("loc", "time", "weekday", "duration", "diff", "user", "lengths"):
        torch.testing.assert_close(getattr(served, name), getattr(trained, name), rtol=0, atol=0)
