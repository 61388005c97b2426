"""Places outside the vocabulary told apart (:mod:`nextloc.routine.unseen`): their ids, the share the head reads,
the profile a registered model keeps, nothing read after now."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nextloc.routine.features import (
    MINUTES_PER_DAY,
    Routine,
    VisitLog,
    queries_after_last,
    queries_for_targets,
)
from nextloc.routine.ranking import CandidateSet, RoutineRule
from nextloc.routine.unseen import REQUEST_CAPACITY, UnseenPlaces, join_profiles, split_profile, unseen_share

NUM_PLACES = 8  # 0 pad, 1 outside the vocabulary, 2..7 known


def make_log(rows: list[tuple[int, int, int]], user: int = 1, first_raw: int = 100) -> VisitLog:
    """``(start, place, raw)`` rows of one user (an hour each): ``raw`` tells places outside the vocabulary
    (``place`` 1) apart (``first_raw + raw``), a known place's raw id is its own."""
    frame = (
        pd.DataFrame(rows, columns=["start", "place", "raw"]).drop_duplicates("start").sort_values("start")
    )
    place = frame["place"].to_numpy(np.int64)
    raw = np.where(place == 1, first_raw + frame["raw"].to_numpy(np.int64), place)
    return VisitLog(
        user=np.full(len(frame), user, dtype=np.int64),
        start=frame["start"].to_numpy(np.int64),
        end=frame["start"].to_numpy(np.int64) + 60,
        place=place,
        raw_place=raw,
        staypoint=np.arange(len(frame), dtype=np.int64),
    )


def shares(places: UnseenPlaces, routine: Routine, queries_known, queries_unseen) -> np.ndarray:
    """The share of the routine rule's softmax over both kinds of candidate (moves not read: a request's
    first visit is reached by a move from the profile's last, which neither counts)."""
    known = CandidateSet.build(routine, queries_known)
    unseen = CandidateSet.of_unseen(places, queries_unseen)
    rule = RoutineRule({"n_window": 1.0, "share_place": 1.0, "share_slot": 1.0, "is_current": 1.0})
    return unseen_share((known.query, rule.scores(known)), (unseen.query, rule.scores(unseen)), known.n)


def test_the_share_is_the_softmax_mass_of_the_unseen_candidates() -> None:
    known = (np.array([0, 0, 1]), np.array([1.0, 0.0, 2.0]))
    unseen = (np.array([0, 2]), np.array([1.0, -3.0]))
    share = unseen_share(known, unseen, 4, temperature=2.0)
    e = math.exp(0.5)
    np.testing.assert_allclose(share, [e / (e + 1.0 + e), 0.0, 1.0, 0.0])
    assert unseen_share((np.zeros(0, int), np.zeros(0)), (np.zeros(0, int), np.zeros(0)), 2).tolist() == [
        0,
        0,
    ]


def test_each_unseen_place_is_a_candidate_of_its_own() -> None:
    # home, new place A, home, new place B, new place A, home: A twice, B once, both after the vocabulary
    log = make_log([(0, 2, 0), (100, 1, 0), (200, 2, 0), (300, 1, 1), (400, 1, 0), (500, 2, 0)])
    places = UnseenPlaces.build(log, NUM_PLACES)
    assert places.held == 2
    assert places.log.place.tolist() == [2, NUM_PLACES, 2, NUM_PLACES + 1, NUM_PLACES, 2]
    candidates = CandidateSet.of_unseen(places, queries_after_last(places.log))
    assert candidates.place.tolist() == [NUM_PLACES, NUM_PLACES + 1]
    assert candidates.column("n_place").tolist() == [2.0, 1.0]
    assert candidates.explore.shape == (1, 0)
    # the moves out of the current place count each unseen place apart: home -> A once, home -> B once
    assert candidates.column("n_transition").tolist() == [1.0, 1.0]


unseen_rows = st.lists(
    st.tuples(st.integers(0, 30 * MINUTES_PER_DAY), st.sampled_from([1, 1, 2, 3]), st.integers(0, 3)),
    min_size=2,
    max_size=20,
)


@settings(max_examples=25, deadline=None)
@given(rows=unseen_rows)
def test_no_share_reads_a_visit_after_its_question(rows) -> None:
    """Each question's share is the same when every visit after its target is removed."""
    log = make_log(rows)
    places = UnseenPlaces.build(log, NUM_PLACES)
    routine = Routine(log, NUM_PLACES)
    targets = log.staypoint[1:]
    whole = shares(
        places, routine, queries_for_targets(log, targets), queries_for_targets(places.log, targets)
    )
    for i, target in enumerate(targets):
        past = log.take(np.arange(len(log)) <= i + 1)
        past_places = UnseenPlaces.build(past, NUM_PLACES)
        one = np.array([target])
        alone = shares(
            past_places,
            Routine(past, NUM_PLACES),
            queries_for_targets(past, one),
            queries_for_targets(past_places.log, one),
        )
        np.testing.assert_allclose(alone, whole[i : i + 1])


@settings(max_examples=60, deadline=None)
@given(past=unseen_rows, later=unseen_rows)
def test_a_profile_and_a_request_share_like_the_whole_log(past, later) -> None:
    """The stored profile of the past plus a request of later visits (its places outside the vocabulary its
    own) gives the share of the whole log. The past ends more than 7 days before the request: a request
    that repeats the profile's last days would bring its unseen places under ids of its own (docs/routine.md)."""
    cut = 38 * MINUTES_PER_DAY
    before = make_log(past)
    after = make_log([(cut + s, p, r) for s, p, r in later], first_raw=200)
    whole_log = VisitLog(
        *(np.concatenate([getattr(before, f), getattr(after, f)]) for f in VisitLog.__dataclass_fields__)
    )
    table = join_profiles(
        Routine(before, NUM_PLACES).profile(), UnseenPlaces.build(before, NUM_PLACES).profile()
    )
    profile, stored = split_profile(table)
    now = np.array([int(whole_log.end.max()) + 60])
    served_places = UnseenPlaces.build(after, NUM_PLACES, stored=stored)
    served = shares(
        served_places,
        Routine(after, NUM_PLACES, profile=profile),
        queries_after_last(after, now),
        queries_after_last(served_places.log, now),
    )
    whole_places = UnseenPlaces.build(whole_log, NUM_PLACES)
    whole = shares(
        whole_places,
        Routine(whole_log, NUM_PLACES),
        queries_after_last(whole_log, now),
        queries_after_last(whole_places.log, now),
    )
    np.testing.assert_allclose(served, whole)


def test_a_profile_keeps_its_unseen_places_apart_and_an_old_one_has_none() -> None:
    log = make_log([(0, 2, 0), (100, 1, 0), (200, 1, 1)])
    routine_table = Routine(log, NUM_PLACES).profile()
    profile, stored = split_profile(
        join_profiles(routine_table, UnseenPlaces.build(log, NUM_PLACES).profile())
    )
    pd.testing.assert_frame_equal(profile, routine_table)
    assert stored is not None
    assert stored[1] == 2
    old, none = split_profile(routine_table)
    assert none is None
    assert old is routine_table


def test_a_request_with_too_many_unseen_places_is_refused() -> None:
    log = make_log([(i * 100, 1, i) for i in range(REQUEST_CAPACITY + 1)])
    stored = split_profile(
        join_profiles(Routine(log, NUM_PLACES).profile(), UnseenPlaces.build(log, NUM_PLACES).profile())
    )[1]
    with pytest.raises(ValueError, match="outside the vocabulary in one request"):
        UnseenPlaces.build(log, NUM_PLACES, stored=stored)


def test_an_answer_reads_the_share_only_with_the_unseen_places_profile() -> None:
    """A registered model answers with ``unseen_return_share`` after its explore features when its profile
    holds the unseen places' routine; one registered before it answers with the explore features alone."""
    from nextloc.routine.answerer import RoutineAnswerer
    from nextloc.routine.features import EXPLORE_FEATURES
    from nextloc.routine.profile import StoredProfile

    past = make_log([(0, 2, 0), (100, 1, 0), (200, 2, 0), (300, 1, 0)])
    profile, unseen = split_profile(
        join_profiles(Routine(past, NUM_PLACES).profile(), UnseenPlaces.build(past, NUM_PLACES).profile())
    )
    start = pd.to_datetime(40 * MINUTES_PER_DAY + np.array([0, 100]), unit="m", utc=True)
    visits = pd.DataFrame(
        {"history": [0, 0], "started_at": start, "finished_at": start + pd.Timedelta(minutes=60)}
    ).assign(place=[2, 1], raw_place=[2, -1])
    args = dict(
        model=RoutineRule(),
        profile=StoredProfile.from_frame(profile),
        num_places=NUM_PLACES,
        centres=np.full((NUM_PLACES, 2), np.nan),
        popularity=np.ones(NUM_PLACES),
        timezone="UTC",
    )
    at = pd.Series([start[-1] + pd.Timedelta(minutes=120)])
    _, with_share = RoutineAnswerer(**args, unseen=unseen).answer(visits, np.array([1]), at)
    _, without = RoutineAnswerer(**args).answer(visits, np.array([1]), at)
    assert with_share.shape == (1, len(EXPLORE_FEATURES) + 1)
    np.testing.assert_array_equal(with_share[:, :-1], without)
    # the profile's unseen place and the request's are both candidates beside home: a share above 0
    assert 0.0 < with_share[0, -1] < 1.0
