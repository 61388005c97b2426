"""The routine layer: counts before a time, candidate and explore features, no leakage, tallies.

Every count is checked against a plain loop over the visits; the leakage property removes every visit that
started at or after a question's target and checks that no feature moves.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nextloc.routine.counts import EventCounts
from nextloc.routine.features import CANDIDATE_FEATURES, EXPLORE_FEATURES, SLOT_MIN, Routine, song_explore
from nextloc.routine.ranking import CandidateSet
from nextloc.routine.visits import (
    MINUTES_PER_DAY,
    Queries,
    VisitLog,
    queries_after_last,
    queries_for_targets,
    wall_minutes,
    window_places,
)

NUM_PLACES = 8  # 0 pad, 1 outside the vocabulary, 2..7 known


def make_log(rows: list[tuple[int, int, int, int]], located: bool = False) -> VisitLog:
    """``(user, start, duration, place)`` rows -> a log sorted by (user, start); raw place = place, except
    that each visit outside the vocabulary is a place of its own. ``located``: each visit with coordinates
    of its own, jittered around its place's."""
    frame = pd.DataFrame(rows, columns=["user", "start", "duration", "place"])
    frame = frame.sort_values(["user", "start"], kind="stable").reset_index(drop=True)
    frame = frame[~frame.duplicated(["user", "start"])].reset_index(drop=True)
    raw = np.where(frame["place"] == 1, 1000 + np.arange(len(frame)), frame["place"])
    jitter = np.random.default_rng(len(frame)).normal(0.0, 3e-3, (2, len(frame)))
    return VisitLog(
        user=frame["user"].to_numpy(np.int64),
        start=frame["start"].to_numpy(np.int64),
        end=(frame["start"] + frame["duration"]).to_numpy(np.int64),
        place=frame["place"].to_numpy(np.int64),
        raw_place=raw.astype(np.int64),
        staypoint=np.arange(len(frame), dtype=np.int64),
        latitude=39.9 + frame["place"].to_numpy() / 100 + jitter[0] if located else None,
        longitude=116.3 + frame["place"].to_numpy() / 100 + jitter[1] if located else None,
    )


# visits of 1-3 users over about 40 days; starts are unique per user after the dedup in make_log
visit_rows = st.lists(
    st.tuples(
        st.integers(1, 3),
        st.integers(0, 40 * MINUTES_PER_DAY),
        st.integers(30, 600),
        st.integers(1, NUM_PLACES - 1),
    ),
    min_size=3,
    max_size=60,
)


def targets_of(log: VisitLog) -> np.ndarray:
    """Every visit that is not its user's first."""
    return log.staypoint[np.r_[False, log.user[1:] == log.user[:-1]]]


# --------------------------------------------------------------------------- #
# counts before a time
# --------------------------------------------------------------------------- #


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(st.tuples(st.integers(0, 4), st.integers(-50, 50), st.integers(0, 9)), max_size=40),
    questions=st.lists(st.tuples(st.integers(0, 5), st.integers(-60, 60)), min_size=1, max_size=20),
)
def test_event_counts_equal_a_loop(events, questions) -> None:
    keys = np.array([e[0] for e in events], dtype=np.int64)
    times = np.array([e[1] for e in events], dtype=np.int64)
    values = np.array([e[2] for e in events], dtype=np.float64)
    index = EventCounts(keys, times, values)
    qk = np.array([q[0] for q in questions], dtype=np.int64)
    qt = np.array([q[1] for q in questions], dtype=np.int64)
    for i, (k, t) in enumerate(zip(qk, qt, strict=True)):
        before = [(time, value) for key, time, value in events if key == k and time < t]
        assert index.count(qk, qt)[i] == len(before)
        assert index.total(qk, qt)[i] == sum(v for _, v in before)
        last = index.last(qk, qt)[i]
        assert (np.isnan(last) and not before) or last == max(time for time, _ in before)


@settings(max_examples=100, deadline=None)
@given(
    events=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 100), st.integers(0, 9)), max_size=40),
    split=st.integers(0, 100),
    questions=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 120)), min_size=1, max_size=20),
)
def test_a_snapshot_base_stands_for_the_events_it_holds(events, split, questions) -> None:
    """Events before ``split`` as a snapshot, the rest as events: the same answers after ``split``."""
    keys, times, values = (np.array([e[i] for e in events], dtype=np.int64) for i in range(3))
    early = times < split
    whole = EventCounts(keys, times, values)
    base = EventCounts(keys[early], times[early], values[early]).snapshot()
    extended = EventCounts(keys[~early], times[~early], values[~early], base=base)
    qk = np.array([q[0] for q in questions], dtype=np.int64)
    qt = np.maximum(np.array([q[1] for q in questions], dtype=np.int64), split)
    np.testing.assert_array_equal(extended.count(qk, qt), whole.count(qk, qt))
    np.testing.assert_array_equal(extended.total(qk, qt), whole.total(qk, qt))
    np.testing.assert_array_equal(extended.last(qk, qt), whole.last(qk, qt))


def test_a_cutoff_keeps_windows_and_does_not_count_the_base_twice() -> None:
    """Events at 10, 20 (in the base) and 30; the request repeats 20 and brings 30."""
    base = EventCounts(np.array([1, 1]), np.array([10, 20])).snapshot()
    request = EventCounts(np.array([1, 1]), np.array([20, 30]), base=base)
    key, cutoff = np.array([1]), np.array([21])
    assert request.count(key, np.array([40]), cutoff)[0] == 3
    window = request.count(key, np.array([40]), cutoff) - request.count(key, np.array([15]), cutoff)
    assert window[0] == 2  # 20 and 30: the request's visits inside the window still count there


# --------------------------------------------------------------------------- #
# features against loops
# --------------------------------------------------------------------------- #


def loop_features(log: VisitLog, user: int, now: int, current: int, place: int) -> dict[str, float]:
    """A few candidate features the slow way."""
    mine = [i for i in range(len(log)) if log.user[i] == user and log.start[i] < now]
    places = [int(log.place[i]) for i in mine]
    slot = (now % MINUTES_PER_DAY) // SLOT_MIN
    in_slot = [i for i in mine if (log.start[i] % MINUTES_PER_DAY) // SLOT_MIN == slot]
    moves = [(places[j - 1], places[j]) for j in range(1, len(places))]
    out_of_current = [b for a, b in moves if a == current]
    window = [i for i in mine if log.start[i] >= now - 7 * MINUTES_PER_DAY]
    last = max(log.start[i] for i in mine if log.place[i] == place)
    return {
        "n_place": places.count(place),
        "share_place": places.count(place) / len(places),
        "share_slot": sum(log.place[i] == place for i in in_slot) / len(in_slot) if in_slot else 0.0,
        "n_window": sum(log.place[i] == place for i in window),
        "share_transition": out_of_current.count(place) / len(out_of_current) if out_of_current else 0.0,
        "log_days_since": np.log1p((now - last) / MINUTES_PER_DAY),
    }


@settings(max_examples=60, deadline=None)
@given(rows=visit_rows)
def test_candidate_features_equal_loops(rows) -> None:
    log = make_log(rows)
    targets = targets_of(log)
    if not len(targets):
        return
    queries = queries_for_targets(log, targets)
    q, place, features = Routine(log, NUM_PLACES).candidate_features(queries)
    for row in range(len(q)):
        i = q[row]
        expected = loop_features(log, queries.user[i], queries.now[i], queries.current[i], place[row])
        for name, value in expected.items():
            assert features[row, CANDIDATE_FEATURES.index(name)] == pytest.approx(value), name
    # every known place the user visited before now is a candidate, and nothing else
    for i in range(len(queries)):
        seen = {
            int(log.place[j])
            for j in range(len(log))
            if log.user[j] == queries.user[i] and log.start[j] < queries.now[i] and log.place[j] >= 2
        }
        assert set(place[q == i].tolist()) == seen


@settings(max_examples=40, deadline=None)
@given(rows=visit_rows)
def test_features_in_chunks_and_answerable_questions_alone_equal_the_whole_sets(rows) -> None:
    """Features computed two questions at a time, and a training split's answerable questions built alone
    (the others' features never computed), equal the whole set's to the last bit."""
    log = make_log(rows, located=True)
    targets = targets_of(log)
    if not len(targets):
        return
    routine = Routine(log, NUM_PLACES)
    queries = queries_for_targets(log, targets)
    q, place, features = routine.candidate_features(queries)
    chunks = list(routine.feature_chunks(queries, q, place, chunk=2))
    np.testing.assert_array_equal(np.concatenate([features[:0], *chunks]), features)
    target = log.place[targets]  # make_log's staypoint ids are the log's rows
    alone = CandidateSet.build(routine, queries, target)
    answerable = CandidateSet.build(routine, queries).answerable(target)
    for name in ("query", "place", "features", "explore"):
        np.testing.assert_array_equal(getattr(alone, name), getattr(answerable, name))


@settings(max_examples=80, deadline=None)
@given(rows=visit_rows)
def test_no_feature_reads_the_target_or_anything_after_it(rows) -> None:
    """The leakage property: removing every visit that started at or after a question's target time (its
    own user's and everyone else's) changes none of that question's features, to the last bit; every visit
    has coordinates of its own, so ``log_km`` reads centres computed from the log."""
    log = make_log(rows, located=True)
    targets = targets_of(log)
    if not len(targets):
        return
    routine = Routine(log, NUM_PLACES)
    queries = queries_for_targets(log, targets)
    q, place, features = routine.candidate_features(queries)
    explore = routine.explore_features(queries)
    for i in np.unique(np.linspace(0, len(targets) - 1, 6).astype(int)):  # a few questions, spread out
        cut = log.start[log.staypoint == targets[i]][0]
        past = log.take(log.start < cut)
        alone = Queries(*(np.asarray(getattr(queries, f))[[i]] for f in Queries.__dataclass_fields__))
        routine_past = Routine(past, NUM_PLACES)
        q2, place2, features2 = routine_past.candidate_features(alone)
        np.testing.assert_array_equal(place2, place[q == i])
        np.testing.assert_array_equal(features2, features[q == i])
        np.testing.assert_array_equal(routine_past.explore_features(alone), explore[[i]])
        assert np.isfinite(features2[:, CANDIDATE_FEATURES.index("log_km")]).all()
        window, whole_window = window_places(past, alone)[0], window_places(log, queries)[i]
        np.testing.assert_array_equal(window[window > 0], whole_window[whole_window > 0])


def test_a_routine_given_centres_reads_them_and_one_without_reads_the_log() -> None:
    """A registered model's routine answers with the centres it is given; without them, a place's centre
    is the mean of every user's visits there before now (NaN before its first)."""
    log = make_log(
        [(1, 0, 60, 2), (1, 100, 60, 3), (2, 150, 60, 3), (1, 300, 60, 2), (1, 400, 60, 3)], located=True
    )
    routine = Routine(log, NUM_PLACES)
    now = np.array([50, 200, 350, 500])
    expected = [
        [
            log.latitude[(log.place == 3) & (log.start < t)].mean(),
            log.longitude[(log.place == 3) & (log.start < t)].mean(),
        ]
        if t > 100
        else [np.nan, np.nan]
        for t in now
    ]
    np.testing.assert_allclose(routine.centre(np.full(4, 3), now), expected, rtol=1e-14)
    fixed = np.arange(NUM_PLACES * 2, dtype=np.float64).reshape(NUM_PLACES, 2)
    np.testing.assert_array_equal(
        Routine(log, NUM_PLACES, fixed).centre(np.full(4, 3), now), np.tile(fixed[3], (4, 1))
    )


def test_a_question_leaves_the_visit_before_the_target() -> None:
    log = make_log([(1, 0, 60, 2), (1, 100, 60, 3), (1, 300, 60, 2), (2, 50, 60, 4), (2, 500, 60, 5)])
    queries = queries_for_targets(log, np.array([2, 4]))
    assert queries.user.tolist() == [1, 2]
    assert queries.now.tolist() == [160, 110]  # the end of the visit before the target
    assert queries.current.tolist() == [3, 4]
    assert queries.previous.tolist() == [2, 0]
    with pytest.raises(ValueError, match="first visit"):
        queries_for_targets(log, np.array([0]))
    with pytest.raises(ValueError, match="not in the visit log"):
        queries_for_targets(log, np.array([99]))


def test_explore_features_count_new_places() -> None:
    # user 1: places 2, 3, 2, then two visits outside the vocabulary (each its own place), then 2
    log = make_log(
        [(1, 0, 60, 2), (1, 100, 60, 3), (1, 200, 60, 2), (1, 300, 60, 1), (1, 400, 60, 1), (1, 500, 60, 2)]
    )
    queries = queries_after_last(log)
    explore = dict(zip(EXPLORE_FEATURES, Routine(log, NUM_PLACES).explore_features(queries)[0], strict=True))
    assert explore["log_distinct"] == pytest.approx(np.log1p(4))  # 2, 3 and the two new places
    assert explore["new_share"] == pytest.approx(4 / 6)
    assert explore["unseen_share"] == pytest.approx(2 / 6)
    assert explore["song_explore"] == pytest.approx(song_explore(np.array([4.0]))[0])
    assert explore["move_unseen_share"] == pytest.approx(0.5)  # out of place 2: to 3 and to 1
    assert explore["log_current_visits"] == pytest.approx(np.log1p(3))


def test_wall_minutes_read_the_dataset_timezone() -> None:
    times = pd.Series(pd.to_datetime(["1970-01-01T00:30:00Z", "2008-10-20T23:00:00Z"], utc=True))
    assert wall_minutes(times, "UTC").tolist()[0] == 30
    shanghai = wall_minutes(times, "Asia/Shanghai")
    assert shanghai[0] == 30 + 8 * 60
    assert (shanghai[1] % MINUTES_PER_DAY) == 7 * 60  # 23:00 UTC is 07:00 the next day in Beijing


# --------------------------------------------------------------------------- #
# a tally stands for the visits it counted
# --------------------------------------------------------------------------- #


@settings(max_examples=60, deadline=None)
@given(rows=visit_rows, cut_day=st.integers(10, 30))
def test_a_profile_and_a_request_answer_like_the_whole_log(rows, cut_day) -> None:
    """The tally of the visits before a cut, plus a request that repeats the 7 days before the question
    (or before the cut) and brings the rest, gives the same candidates and candidate features as the whole log, for a question
    after everything."""
    log = make_log(rows)
    cut = cut_day * MINUTES_PER_DAY
    tally = Routine(log.take(log.start < cut), NUM_PLACES).tally()
    now = int(log.end.max()) + 60
    request = log.take(log.start >= min(cut, now) - 7 * MINUTES_PER_DAY)
    if not len(request):
        return
    users = np.unique(request.user)
    queries = queries_after_last(request, np.full(len(users), now))
    whole = Routine(log, NUM_PLACES).candidate_features(queries)
    served = Routine(request, NUM_PLACES, tally=tally).candidate_features(queries)
    np.testing.assert_array_equal(served[0], whole[0])
    np.testing.assert_array_equal(served[1], whole[1])
    # moves into the request's first visit come from before it: the tally counted those already
    exact = [n for n in CANDIDATE_FEATURES if "transition" not in n]
    columns = [CANDIDATE_FEATURES.index(n) for n in exact]
    np.testing.assert_allclose(served[2][:, columns], whole[2][:, columns], equal_nan=True)


def test_a_profile_holds_counts_not_visits() -> None:
    log = make_log([(1, 0, 60, 2), (1, 100, 60, 3), (1, 200, 60, 2)])
    tally = Routine(log, NUM_PLACES).tally()
    assert set(tally.columns) == {"index", "key", "count", "total", "last"}
    # one row per key: the user's two visits to place 2 are one row with count 2
    place = tally[tally["index"] == "place"]
    assert sorted(place["count"].tolist()) == [1.0, 2.0]
    # the latest time is kept only where a feature reads it
    assert tally.loc[tally["index"] == "slot", "last"].isna().all()


def test_a_stored_profile_reads_as_the_table() -> None:
    """The tally split by index once (what a loaded model keeps) gives each index's counts, the users it
    holds and when each one's tally ends exactly as filtering the table does; a user it lacks ends before
    any time, and a Routine built on it answers as one built on the table."""
    from nextloc.routine.tally import NO_TALLY_END, StoredTally

    log = make_log([(1, 0, 60, 2), (1, 100, 60, 3), (1, 200, 60, 2), (2, 50, 30, 4), (2, 400, 30, 1)])
    table = Routine(log, NUM_PLACES).tally()
    stored = StoredTally.from_frame(table.sample(frac=1.0, random_state=0))  # any row order
    for name, part in table.groupby("index"):
        expected = part.sort_values("key")
        base = stored.base(name)
        np.testing.assert_array_equal(base.key, expected["key"].to_numpy(np.int64))
        for column in ("count", "total", "last"):
            np.testing.assert_array_equal(getattr(base, column), expected[column].to_numpy(np.float64))
    assert len(stored.base("no such index").key) == 0
    users = table[table["index"] == "user"]
    ends = pd.Series(users["last"].to_numpy(), index=users["key"].to_numpy())
    asked = np.array([2, 9, 1, 1])
    expected_end = ends.reindex(asked).fillna(NO_TALLY_END).to_numpy(np.int64)
    np.testing.assert_array_equal(stored.end_of(asked), expected_end)
    request = make_log([(1, 300, 60, 3), (2, 500, 60, 4), (3, 100, 60, 2)])
    queries = queries_after_last(request)
    for a, b in zip(
        Routine(request, NUM_PLACES, tally=table).candidate_features(queries),
        Routine(request, NUM_PLACES, tally=stored).candidate_features(queries),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_visit_log_of_arrays_is_from_staypoints():
    rng = np.random.default_rng(7)
    n = 200
    starts = pd.to_datetime("2008-03-01", utc=True) + pd.to_timedelta(rng.integers(0, 10**7, n) * 10**9, "ns")
    frame = pd.DataFrame(
        {
            "id": rng.permutation(n),
            "user": rng.integers(0, 5, n),
            "location_id": rng.integers(1, NUM_PLACES, n),
            "raw_location_id": rng.integers(0, 50, n),
            "started_at": starts,
            "finished_at": starts + pd.Timedelta(minutes=30),
        }
    )
    frame.loc[:20, "started_at"] = frame.loc[0, "started_at"]  # ties: the staypoint id breaks them
    expected = frame.sort_values(["user", "started_at", "id"], kind="stable")
    log = VisitLog.from_staypoints(frame, "America/New_York")
    assert log.staypoint.tolist() == expected["id"].tolist()
    local = expected["started_at"].dt.tz_convert("America/New_York").dt.tz_localize(None)
    assert log.start.tolist() == local.to_numpy("datetime64[m]").astype(np.int64).tolist()
