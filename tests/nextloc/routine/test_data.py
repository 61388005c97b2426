"""A dataset's routine (:mod:`nextloc.routine.data`): nothing after a question's now reaches its inputs (end to
end, on a synthetic dataset; ``tests/test_full_data.py`` on GeoLife), the window the new-place head reads,
``ranker_refit``'s user-time blocks, and the DBSCAN effect's share."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from causal_build import causal_mismatches, one_split
from hypothesis import given, settings
from hypothesis import strategies as st

from nextloc.routine import data as routine_data
from nextloc.routine.data import RoutineData, neighbours, user_time_blocks
from nextloc.routine.ranking import CandidateSet, RoutineRanker
from nextloc.routine.visits import (
    MINUTES_PER_DAY,
    Queries,
    VisitLog,
    queries_for_targets,
    wall_minutes,
    window_places,
)

TIMEZONE = "Asia/Shanghai"


def synthetic_dataset(seed: int = 0, users: int = 3, visits: int = 150):
    """Staypoints of a few users among 30 places, 16 of them only after train (each visit's coordinates jittered around its place),
    split 60/20/20 by each user's days, encoded as preprocessing does; their locations table and each
    split's samples (every visit but a user's first)."""
    rng = np.random.default_rng(seed)
    base = np.column_stack([39.9 + rng.random(30) * 0.1, 116.3 + rng.random(30) * 0.1])
    frames = []
    for user in range(1, users + 1):
        gaps = rng.integers(60, 20 * 60, visits)
        start = pd.Timestamp("2008-03-01", tz="UTC") + pd.to_timedelta(np.cumsum(gaps), "min")
        raw = rng.choice(14, visits, p=np.r_[np.full(4, 0.2), np.full(10, 0.02)])
        later = (np.arange(visits) > 0.6 * visits) & (rng.random(visits) < 0.15)
        raw[later] = rng.integers(14, 30, later.sum())  # places first visited after train, some once
        frames.append(
            pd.DataFrame(
                {
                    "user": user,
                    "raw_location_id": raw,
                    "started_at": start,
                    "finished_at": start + pd.to_timedelta(rng.integers(30, 50, visits), "min"),
                    "latitude": base[raw, 0] + rng.normal(0, 2e-4, visits),
                    "longitude": base[raw, 1] + rng.normal(0, 2e-4, visits),
                }
            )
        )
    sp = pd.concat(frames, ignore_index=True)
    sp.insert(0, "id", np.arange(len(sp)))
    day = (sp["started_at"] - sp.groupby("user")["started_at"].transform("min")).dt.days
    share = day / day.groupby(sp["user"]).transform("max")
    sp["split"] = np.where(share < 0.6, "train", np.where(share < 0.8, "val", "test"))
    vocab = np.unique(sp.loc[sp["split"] == "train", "raw_location_id"])
    known = np.isin(sp["raw_location_id"], vocab)
    sp["location_id"] = np.where(known, np.searchsorted(vocab, sp["raw_location_id"]) + 2, 1)
    train_visits = sp[sp["split"] == "train"].groupby("location_id").size()
    locations = pd.DataFrame({"loc_index": np.arange(2, len(vocab) + 2), "raw_location_id": vocab})
    locations["n_train_visits"] = locations["loc_index"].map(train_visits).fillna(0).to_numpy()
    first = ~sp["user"].duplicated()
    samples = {
        split: pd.DataFrame({"staypoint_id": sp["id"], "target_loc": sp["location_id"]})[
            (sp["split"] == split) & ~first
        ]
        for split in ("train", "val", "test")
    }
    import pyarrow as pa

    tables = {s: pa.Table.from_pandas(f, preserve_index=False) for s, f in samples.items()}
    return sp, locations, tables, len(vocab) + 2


def test_a_build_reads_nothing_after_a_questions_now() -> None:
    """Every candidate feature (``log_km`` from centres of each visit's own coordinates), explore feature,
    share, unseen place and window of sampled questions equals that of a build on the staypoints that
    started before the question's now (the target itself poisoned)."""
    staypoints, locations, samples, num_places = synthetic_dataset()
    assert causal_mismatches(staypoints, locations, samples, num_places, TIMEZONE, picks_of(samples)) == []


def picks_of(samples: dict, per_split: int = 8) -> list[tuple[str, int]]:
    """Questions spread over every split, train's included."""
    return [
        (s, int(i))
        for s in ("train", "val", "test")
        for i in np.linspace(0, len(samples[s]) - 1, per_split).astype(int)
    ]


def mutant_queries(now: str = "leaving", dwell: str = "current"):
    """:func:`queries_for_targets` gone wrong: ``now`` taken at the arrival at the target (``"arrival"``)
    or at the target's end (``"target_end"``); or the dwell feature (``log_dwell_current``, now minus
    ``arrived``) made to read the target: the time until it starts (``"until_target"``) or how long it
    lasts, an ongoing stay's end (``"target_length"``)."""

    def queries(log: VisitLog, staypoint_ids: np.ndarray) -> Queries:
        right = queries_for_targets(log, staypoint_ids)
        order = np.argsort(log.staypoint, kind="stable")
        rows = order[np.searchsorted(log.staypoint[order], np.asarray(staypoint_ids, np.int64))]
        times = {"leaving": right.now, "arrival": log.start[rows], "target_end": log.end[rows]}
        dwells = {
            "current": right.now - right.arrived,
            "until_target": log.start[rows] - right.now,
            "target_length": log.end[rows] - log.start[rows],
        }
        return dataclasses.replace(right, now=times[now], arrived=times[now] - dwells[dwell])

    return queries


@pytest.mark.parametrize(
    ("mutant", "caught"),
    [
        ({"now": "arrival"}, "now"),
        ({"now": "target_end"}, "now"),
        ({"dwell": "until_target"}, "features"),
        ({"dwell": "target_length"}, "features"),
    ],
)
def test_the_causal_check_catches_a_question_that_sees_the_future(monkeypatch, mutant, caught) -> None:
    """The check above fails on mutated copies: now set to the arrival at the target or to the target's
    end, a feature reading the target's start or its end (the stay ongoing at the answer); in train
    questions as well. The real code passes the same check (the tests above)."""
    staypoints, locations, samples, num_places = synthetic_dataset()
    monkeypatch.setattr(routine_data, "queries_for_targets", mutant_queries(**mutant))
    wrong = causal_mismatches(staypoints, locations, samples, num_places, TIMEZONE, picks_of(samples, 4))
    for split in ("train", "val", "test"):
        assert any(w.startswith(f"{split} question") and w.endswith(caught) for w in wrong), (split, wrong)


def located_staypoints(staypoints: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Located staypoints behind the final ones, as preprocessing has them before merging: each final
    staypoint's own, a second one 10 minutes later for a third of them (merged away), each with its own
    coordinates, and those of a user the dataset dropped, at the same places any time."""
    rng = np.random.default_rng(seed)
    columns = ["raw_location_id", "started_at", "latitude", "longitude"]
    second = staypoints[rng.random(len(staypoints)) < 1 / 3][columns].copy()
    second["started_at"] += pd.Timedelta(minutes=10)
    dropped = staypoints[columns].sample(frac=0.3, random_state=seed).copy()
    dropped["started_at"] = dropped["started_at"].sample(frac=1, random_state=seed + 1).to_numpy()
    located = pd.concat([staypoints[columns], second, dropped], ignore_index=True)
    located[["latitude", "longitude"]] += rng.normal(0, 1e-4, (len(located), 2))
    return located.rename(columns={"raw_location_id": "location_id"})


def test_a_build_on_located_staypoints_reads_nothing_after_a_questions_now() -> None:
    """As above, the centres from the located staypoints (every user's, before merging)."""
    staypoints, locations, samples, num_places = synthetic_dataset(seed=2)
    located = located_staypoints(staypoints)
    picks = picks_of(samples)
    assert causal_mismatches(staypoints, locations, samples, num_places, TIMEZONE, picks, located) == []


def test_centres_are_those_of_the_located_staypoints_before_now() -> None:
    """Given the located staypoints, a place's centre as of now is the mean of theirs there before now
    (every user's, known places and unseen ones alike), and at the end of time the vocabulary's centre."""
    staypoints, locations, samples, num_places = synthetic_dataset(seed=3)
    located = located_staypoints(staypoints, seed=3)
    splits = {
        s: one_split(t.column("staypoint_id"), t.column("target_loc").to_numpy()) for s, t in samples.items()
    }
    data = RoutineData.build(staypoints, locations, splits, num_places, TIMEZONE, located=located)
    started = wall_minutes(located["started_at"], TIMEZONE)
    queries, places = data.queries["test"], data.unseen_places
    raw_of = dict(zip(places.log.place.tolist(), places.log.raw_place.tolist(), strict=False))
    checked = 0
    for i in np.linspace(0, len(queries) - 1, 20).astype(int):
        now = queries.now[i : i + 1]
        for place, raw in raw_of.items():
            rows = (located["location_id"].to_numpy() == raw) & (started < now[0])
            expected = located.loc[rows, ["latitude", "longitude"]].mean().to_numpy()
            got = places.routine.centre(np.array([place]), now)[0]
            np.testing.assert_allclose(got, expected, rtol=1e-12)
            checked += rows.any()
            if place < num_places:  # a known place: the same centre in the routine over encoded ids
                np.testing.assert_allclose(
                    data.routine.centre(np.array([place]), now)[0], expected, rtol=1e-12
                )
    assert checked > 100
    end = np.full(len(locations), np.iinfo(np.int64).max // 2)
    means = located.groupby("location_id")[["latitude", "longitude"]].mean()
    expected = means.loc[locations["raw_location_id"]].to_numpy()
    np.testing.assert_allclose(
        data.routine.centre(locations["loc_index"].to_numpy(), end), expected, rtol=1e-12
    )


def test_centres_are_those_of_the_visits_before_now() -> None:
    """``log_km`` is the distance between the means of the current place's and the candidate's visits
    before now, every user's."""
    staypoints, locations, samples, num_places = synthetic_dataset(seed=1)
    splits = {
        s: one_split(t.column("staypoint_id"), t.column("target_loc").to_numpy()) for s, t in samples.items()
    }
    data = RoutineData.build(staypoints, locations, splits, num_places, TIMEZONE)
    log = data.routine.log
    candidates, queries = data.candidates["test"], data.queries["test"]
    for row in np.linspace(0, len(candidates.query) - 1, 25).astype(int):
        i = candidates.query[row]
        now, current, place = queries.now[i], queries.current[i], candidates.place[row]

        def centre(p, now=now):
            seen = (log.place == p) & (log.start < now)
            return np.radians([log.latitude[seen].mean(), log.longitude[seen].mean()])

        (lat1, lon1), (lat2, lon2) = centre(current), centre(place)
        h = np.sin((lat2 - lat1) / 2) ** 2 + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
        km = 2 * 6371.0088 * np.arcsin(np.sqrt(h))
        assert candidates.column("log_km")[row] == np.float64(np.log1p(km)).round(12) or np.isclose(
            candidates.column("log_km")[row], np.log1p(km), rtol=1e-12, atol=1e-15
        )


visit_rows = st.lists(
    st.tuples(st.integers(1, 3), st.integers(0, 20 * MINUTES_PER_DAY), st.integers(2, 6)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(
    rows=visit_rows,
    asked=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 21 * MINUTES_PER_DAY)), min_size=1),
)
def test_a_window_is_the_visits_of_the_7_days_before_now(rows, asked) -> None:
    frame = pd.DataFrame(rows, columns=["user", "start", "place"]).drop_duplicates(["user", "start"])
    frame = frame.sort_values(["user", "start"])
    n = len(frame)
    log = VisitLog(
        *(frame[c].to_numpy(np.int64) for c in ("user", "start")),
        frame["start"].to_numpy(np.int64) + 30,
        frame["place"].to_numpy(np.int64),
        frame["place"].to_numpy(np.int64),
        np.arange(n),
    )
    user = np.array([a[0] for a in asked])
    now = np.array([a[1] for a in asked])
    zeros = np.zeros(len(asked), dtype=np.int64)
    windows = window_places(log, Queries(user, now, zeros, zeros, zeros), previous_days=7)
    for i, (u, t) in enumerate(asked):
        day = t // MINUTES_PER_DAY
        expected = [
            p
            for lu, s, p in zip(log.user, log.start, log.place, strict=True)
            if lu == u and s < t and s // MINUTES_PER_DAY >= day - 7
        ]
        got = windows[i]
        assert got[got > 0].tolist() == expected


def test_user_time_blocks_cut_each_user_in_time_and_neighbours_are_near_the_held_block() -> None:
    user = np.array([1, 2, 1, 1, 2, 1, 1, 2, 1, 1])
    now = np.array([50, 10, 10, 30, 20, 40, 20, 30, 60, 5000]) * MINUTES_PER_DAY // 10
    queries = Queries(user, now, user * 0, user * 0, user * 0)
    block = user_time_blocks(queries, folds=2)
    # user 1 in time: 10 20 30 40 50 60 5000 -> blocks 0 0 0 0 1 1 1 (7 questions); user 2: 10 20 30 -> 0 0 1
    order = np.lexsort((now, user))
    assert block[order].tolist() == [0, 0, 0, 0, 1, 1, 1, 0, 0, 1]
    held = block == 1
    near = neighbours(queries, held, gap=MINUTES_PER_DAY)  # ten tenths of a day
    # user 1's held span is 50..5000: 40 is within the gap; user 2's is 30: 20 is
    assert sorted(now[near] * 10 // MINUTES_PER_DAY) == [20, 40]
    assert user[near & (now * 10 // MINUTES_PER_DAY == 20)].tolist() == [2]
    assert not (near & held).any()


def test_the_past_places_share_leaves_out_unseen_places_visited_once_before_now() -> None:
    staypoints, locations, samples, num_places = synthetic_dataset(seed=2)
    splits = {
        s: one_split(t.column("staypoint_id"), t.column("target_loc").to_numpy()) for s, t in samples.items()
    }
    data = RoutineData.build(staypoints, locations, splits, num_places, TIMEZONE)
    model = RoutineRanker(0).fit(
        data.candidates["train"], data.targets["train"], data.candidates["val"], data.targets["val"]
    )
    unseen = data.unseen["test"]
    visits = np.rint(np.expm1(unseen.column("log_popularity")))
    once = (unseen.place >= data.unseen_places.num_places) & (visits < 2)
    assert once.any()
    kept = data.explore(model, "test", min_past_visits=2)[:, -1]
    expected = data.unseen_places.share(unseen.candidates_where(~once), model.scores(unseen)[~once])
    np.testing.assert_array_equal(kept, expected)
    with_once = np.bincount(unseen.query[once], minlength=unseen.n) > 0
    assert (data.explore(model, "test")[with_once, -1] >= kept[with_once]).all()


def test_a_refit_block_is_answered_by_trees_chosen_and_fit_without_it() -> None:
    """Changing the targets of one user-time block of validation (and so the ranker chosen on all of
    validation) changes none of that block's cross-fitted scores."""
    staypoints, locations, samples, num_places = synthetic_dataset(seed=3, users=4, visits=300)
    splits = {
        s: one_split(t.column("staypoint_id"), t.column("target_loc").to_numpy()) for s, t in samples.items()
    }
    data = RoutineData.build(staypoints, locations, splits, num_places, TIMEZONE)
    held = user_time_blocks(data.queries["val"], 5) == 2
    val: CandidateSet = data.candidates["val"]
    changed = data.targets["val"].copy()
    rng = np.random.default_rng(0)
    for i in np.flatnonzero(held):  # another of the question's candidates, or none
        options = val.place[(val.query == i) & (val.place != changed[i])]
        changed[i] = rng.choice(options) if len(options) else 1
    other = RoutineData(**{**data.__dict__, "targets": {**data.targets, "val": changed}})
    _, (scores, unseen_scores) = data.refit(data.fit("ranker", seed=0))
    _, (scores2, unseen_scores2) = other.refit(other.fit("ranker", seed=0))
    np.testing.assert_array_equal(scores[held[val.query]], scores2[held[val.query]])
    np.testing.assert_array_equal(
        unseen_scores[held[data.unseen["val"].query]], unseen_scores2[held[data.unseen["val"].query]]
    )
