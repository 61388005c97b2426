"""Answers on a map (:mod:`nextloc.maps.png`): what is drawn is read back from the figure's artists and compared
with the history and the answer; the PNG is checked as a PNG of the expected size. The histories come from
the real encoder (:func:`nextloc.predict.histories.encode_visits`) with a small real bundle (most-frequent baseline,
three places in Beijing); the choice of test users for a champion's maps is checked on small frames."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nextloc.bundle import ModelBundle
from nextloc.config import PreprocessConfig
from nextloc.io.visits import validate_visits
from nextloc.maps.labels import boxes_overlap
from nextloc.maps.png import (
    EARTH_RADIUS_M,
    draw_answer,
    draw_answers,
    draw_predictions,
    map_questions,
    project,
)
from nextloc.models.baselines import BaselineModule, MostFrequentBaseline
from nextloc.models.scorer import PackedScorer
from nextloc.predict.answer import predict
from nextloc.predict.histories import encode_visits, history_visits, sample_histories
from nextloc.routine.novelty import NewPlaceHead

BASE = (39.98, 116.33)  # Beijing
M_PER_DEG_LAT = EARTH_RADIUS_M * np.pi / 180


def north(metres: float, origin: tuple[float, float] = BASE) -> tuple[float, float]:
    return origin[0] + metres / M_PER_DEG_LAT, origin[1]


def bundle() -> ModelBundle:
    """Places 2, 3, 4 at BASE, 500 m and 1 km north; P(new place) 0.2; user 153 known."""
    config = PreprocessConfig()
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
    scorer = PackedScorer(BaselineModule(MostFrequentBaseline(5)), False, config.samples.duration_cap_min)
    return ModelBundle("most_frequent", scorer, config, NewPlaceHead.constant(0.2), locations, users, 50.0)


FAR = north(5000)  # a place the model never saw
VISITS = [  # (start, end, (lat, lon)), user 153
    ("2008-10-20T01:00:00Z", "2008-10-20T09:00:00Z", BASE),
    ("2008-10-20T10:00:00Z", "2008-10-20T11:00:00Z", north(500)),
    ("2008-10-20T12:00:00Z", "2008-10-20T14:00:00Z", FAR),
    ("2008-10-21T01:00:00Z", "2008-10-21T09:00:00Z", north(20)),  # within 50 m of place 2
]


def visits(rows=VISITS, user_id: int = 153) -> pd.DataFrame:
    return validate_visits(
        pd.DataFrame(
            {
                "user_id": [user_id] * len(rows),
                "started_at": [r[0] for r in rows],
                "finished_at": [r[1] for r in rows],
                "latitude": [r[2][0] for r in rows],
                "longitude": [r[2][1] for r in rows],
            }
        )
    )


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (after checking the signature)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def answered(rows=VISITS):
    model = bundle()
    histories = encode_visits(visits(rows), model)
    (answer,) = predict(model, histories, k=3)
    return model, histories, answer


def test_the_history_is_what_the_model_read_with_the_requests_own_coordinates() -> None:
    model, histories, answer = answered()
    drawn = history_visits(histories, 0, model.locations)
    assert len(drawn) == answer["visits_used"] == 4
    assert drawn["place"].tolist() == [2, 3, 1, 2]  # 1: the new place
    lat = [r[2][0] for r in VISITS]
    assert drawn["latitude"].to_numpy() == pytest.approx(lat)  # the visits' own, not the centres
    assert drawn["started_at"].is_monotonic_increasing


def test_the_map_draws_the_history_and_the_places(tmp_path: Path) -> None:
    model, histories, answer = answered()
    path = tmp_path / "answer.png"
    drawn = draw_answer(history_visits(histories, 0, model.locations), answer, path, actual=north(500))
    assert png_size(path) == (drawn.width_px, drawn.height_px) == (640, 640)
    (panel,) = drawn.panels
    assert panel.unit_m == 1000  # 5 km: kilometres
    lat = [r[2][0] for r in VISITS]
    lon = [r[2][1] for r in VISITS]
    assert panel.history == pytest.approx(project(np.array(lat), np.array(lon), panel.origin, 1000))
    assert panel.history[2, 1] - panel.history[0, 1] == pytest.approx(5.0, abs=1e-3)  # 5 km north
    places = answer["places"]
    expected = project(
        np.array([p["latitude"] for p in places]),
        np.array([p["longitude"] for p in places]),
        panel.origin,
        1000,
    )
    assert panel.places == pytest.approx(expected)
    assert panel.probabilities.tolist() == [p["probability"] for p in places]
    assert np.all(np.diff(panel.place_sizes) <= 0)  # rank 1 (most probable) is the largest
    assert panel.actual == pytest.approx(project(*np.array([north(500)]).T, panel.origin, 1000))
    assert panel.in_view.all()
    assert list(panel.place_lines) == [f"#{p['rank']}  p {p['probability']:.3f}" for p in places]
    assert "user 153" in panel.title
    assert "P(new place) 0.20" in panel.title
    assert "set" not in panel.title  # without --coverage


def test_the_answer_set_is_a_line_of_the_title(tmp_path: Path) -> None:
    model, histories, answer = answered(VISITS)
    with_set = predict(model, histories, k=3, coverage=0.9)[0]
    drawn = draw_answer(history_visits(histories, 0, model.locations), with_set, tmp_path / "set.png")
    (panel,) = drawn.panels
    assert (
        panel.title.splitlines()[:2]
        == draw_answer(history_visits(histories, 0, model.locations), answer, tmp_path / "plain.png")
        .panels[0]
        .title.splitlines()
    )
    assert panel.title.splitlines()[2].startswith("90% set, total ")


def test_a_far_place_is_listed_not_framed(tmp_path: Path) -> None:
    """A place 20 km south of a history of a few hundred metres stays off the view, named in the key with
    its distance and direction; the view frames the rest."""
    model, histories, answer = answered(VISITS[:2])
    far = {
        "rank": 3,
        "location_id": 9,
        "latitude": north(-20_000)[0],
        "longitude": BASE[1],
        "probability": 0.01,
    }
    answer = {**answer, "places": [*answer["places"][:2], far]}
    drawn = draw_answer(history_visits(histories, 0, model.locations), answer, tmp_path / "far.png")
    (panel,) = drawn.panels
    assert panel.in_view.tolist() == [True, True, False]
    assert panel.unit_m == 1  # the view: 500 m, in metres
    assert panel.place_lines[2].startswith("#3  p 0.010  off the map: 20.")
    assert panel.place_lines[2].endswith("km S")
    assert panel.places[2, 1] == pytest.approx(panel.places[0, 1] - 20_000, abs=1)  # drawn where it is


def test_a_small_history_is_drawn_in_metres(tmp_path: Path) -> None:
    model, histories, answer = answered(VISITS[:2])
    drawn = draw_answer(history_visits(histories, 0, model.locations), answer, tmp_path / "small.png")
    (panel,) = drawn.panels
    assert panel.unit_m == 1
    assert panel.history[1, 1] - panel.history[0, 1] == pytest.approx(500, abs=0.5)
    assert panel.actual.shape == (0, 2)


def test_many_histories_one_panel_each_first_four(tmp_path: Path) -> None:
    model = bundle()
    rows = pd.concat([visits(VISITS, user_id=u) for u in (153, 7, 8, 9, 10)], ignore_index=True)
    histories = encode_visits(rows, model)
    answers = predict(model, histories, k=2)
    drawn = draw_predictions(histories, answers, model.locations, tmp_path / "many.png")
    assert [p.title.split(" at ")[0] for p in drawn.panels] == ["user 153", "user 7", "user 8", "user 9"]
    assert png_size(drawn.path) == (1280, 1280)
    three = draw_answers(
        [(history_visits(histories, i, None), answers[i], None) for i in range(3)], tmp_path / "3.png"
    )
    assert png_size(three.path) == (1280, 1280)
    assert len(three.panels) == 3


def test_a_samples_history_is_drawn_at_the_centres_without_its_new_places(
    tmp_path: Path, make_samples
) -> None:
    model = bundle()
    samples = make_samples(users=[1], histories=[[2, 1, 3, 2]], targets=[4])
    histories = sample_histories(samples.table)
    drawn = history_visits(histories, 0, model.locations)
    assert drawn["place"].tolist() == [2, 3, 2]
    assert drawn["latitude"].tolist() == pytest.approx([BASE[0], north(500)[0], BASE[0]])
    with pytest.raises(ValueError, match="needs the model's vocabulary"):
        history_visits(histories, 0, None)


def test_labels_of_close_places_and_visits_never_cover_each_other(tmp_path: Path) -> None:
    """User 163's map had ``#3`` and ``#5`` on top of each other: five places within 60 m of each other on a
    5 km map, and visits beside them. Every rank and visit label is drawn, no two boxes meet, and the same
    answer draws the same bytes."""
    model, histories, answer = answered()
    close = [
        {
            "rank": r,
            "location_id": 20 + r,
            "latitude": north(15 * r)[0],
            "longitude": BASE[1],
            "probability": p,
        }
        for r, p in zip(range(1, 6), (0.4, 0.2, 0.1, 0.05, 0.02), strict=True)
    ]
    answer = {**answer, "places": close}
    history = history_visits(histories, 0, model.locations)
    drawn = draw_answer(history, answer, tmp_path / "close.png", actual=north(30))
    (panel,) = drawn.panels
    texts = [label.text for label in panel.labels]
    assert texts[:5] == ["#1", "#2", "#3", "#4", "#5"]
    assert len(texts) == 5 + 3  # the visits at BASE and 20 m north share a label: "1,4"
    assert all(label.ring >= 1 for label in panel.labels)
    for a, b in itertools.combinations(panel.labels, 2):
        assert not boxes_overlap(a.box, b.box), (a, b)
    again = draw_answer(history, answer, tmp_path / "again.png", actual=north(30))
    assert again.panels[0].labels == panel.labels
    assert (tmp_path / "again.png").read_bytes() == (tmp_path / "close.png").read_bytes()


def test_nothing_to_draw_is_an_error(tmp_path: Path) -> None:
    empty = pd.DataFrame({"latitude": [], "longitude": []})
    with pytest.raises(ValueError, match="nothing to draw"):
        draw_answer(empty, {"user_id": 1, "places": []}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_map_questions_pick_the_users_with_most_samples_at_their_last_target() -> None:
    """Users 5 and 9 have 3 samples, 2 has 1; ties go to the lower id. Each is asked at the target of their
    last sample, from their visits at known places before it."""
    t = pd.Timestamp("2008-10-20T00:00:00Z")
    rows = []  # (id, user, location, start hour)
    for user in (2, 5, 9):
        for i, loc in enumerate([2, 3, 1, 2, 4]):
            rows.append((len(rows), user, loc, 10 * i))
    sp = pd.DataFrame(rows, columns=["id", "user_id", "location_id", "hour"])
    sp["started_at"] = t + pd.to_timedelta(sp["hour"], unit="h")
    sp["finished_at"] = sp["started_at"] + pd.Timedelta(hours=2)
    by_user = sp.groupby("user_id")["id"]
    samples = pd.DataFrame(
        {
            "user_id": [2, 5, 5, 5, 9, 9, 9],
            "staypoint_id": [by_user.max()[2], 7, 8, 9, 12, 13, 14],
        }
    )
    questions = map_questions(samples, sp, bundle().locations, n_users=2)
    assert [q.user_id for q in questions] == [5, 9]
    five = questions[0]
    assert five.at == sp.loc[9, "started_at"]  # staypoint 9: user 5's last target
    assert five.actual == pytest.approx(north(1000))  # place 4
    assert five.visits["latitude"].tolist() == pytest.approx(
        [BASE[0], north(500)[0], BASE[0]]
    )  # no new place
    assert set(five.visits["user_id"]) == {5}
