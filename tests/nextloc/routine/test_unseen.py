"""Places outside the vocabulary told apart (:mod:`nextloc.routine.unseen`): their ids and centres, the share
the new-place head reads, the tally a registered model keeps, nothing read after now."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nextloc.routine.answerer import RoutineAnswerer
from nextloc.routine.features import EXPLORE_FEATURES, Routine
from nextloc.routine.ranking import CandidateSet, RoutineRule
from nextloc.routine.tally import StoredTally
from nextloc.routine.unseen import (
    REQUEST_CAPACITY,
    UnseenPlaces,
    join_tallies,
    split_tally,
    unseen_centres,
    unseen_share,
)
from nextloc.routine.visits import MINUTES_PER_DAY, VisitLog, queries_after_last, queries_for_targets

NUM_PLACES = 8  # 0 pad, 1 outside the vocabulary, 2..7 known
CENTRES = np.column_stack([np.linspace(39.9, 40.0, NUM_PLACES), np.linspace(116.3, 116.4, NUM_PLACES)])


def make_log(
    rows: list[tuple[int, int, int]], user: int = 1, first_raw: int = 100, located: bool = False
) -> VisitLog:
    """``(start, place, raw)`` rows of one user (an hour each): ``raw`` tells places outside the vocabulary
    (``place`` 1) apart (``first_raw + raw``), a known place's raw id is its own. ``located``: each visit
    with coordinates of its own, jittered around its place's."""
    frame = (
        pd.DataFrame(rows, columns=["start", "place", "raw"]).drop_duplicates("start").sort_values("start")
    )
    place = frame["place"].to_numpy(np.int64)
    raw = np.where(place == 1, first_raw + frame["raw"].to_numpy(np.int64), place)
    jitter = np.random.default_rng(len(frame)).normal(0.0, 3e-3, (2, len(frame)))
    return VisitLog(
        user=np.full(len(frame), user, dtype=np.int64),
        start=frame["start"].to_numpy(np.int64),
        end=frame["start"].to_numpy(np.int64) + 60,
        place=place,
        raw_place=raw,
        staypoint=np.arange(len(frame), dtype=np.int64),
        latitude=40.0 + raw / 1e3 + jitter[0] if located else None,
        longitude=116.0 + raw / 1e3 + jitter[1] if located else None,
    )


def centres_of(log: VisitLog) -> np.ndarray:
    """Each unseen place of ``log`` somewhere of its own (by its raw id)."""
    visits = pd.DataFrame({"place": log.place, "raw_place": log.raw_place})
    return unseen_centres(
        visits.assign(latitude=40.0 + log.raw_place / 1e3, longitude=116.0 + log.raw_place / 1e3)
    )


def shares(places: UnseenPlaces, queries) -> np.ndarray:
    """The share of the routine rule's softmax over the extended routine's candidates (moves not read: a
    request's first visit is reached by a move from the tally's last, which neither counts)."""
    candidates = CandidateSet.build(places.routine, queries)
    rule = RoutineRule({"n_window": 1.0, "share_place": 1.0, "share_slot": 1.0, "is_current": 1.0})
    return places.share(candidates, rule.scores(candidates))


def distance_shares(places: UnseenPlaces, queries) -> np.ndarray:
    """The share of a scorer that reads ``log_km`` (the rule minus the distance from the current place)."""
    candidates = CandidateSet.build(places.routine, queries)
    rule = RoutineRule({"n_window": 1.0, "share_place": 1.0, "is_current": 1.0})
    return places.share(candidates, rule.scores(candidates) - 5.0 * candidates.column("log_km"))


def test_the_share_is_the_softmax_mass_of_the_unseen_candidates() -> None:
    query, scores = np.array([0, 0, 0, 1, 2]), np.array([1.0, 0.0, 1.0, 2.0, -3.0])
    share = unseen_share(query, scores, np.array([False, False, True, False, True]), 4, temperature=2.0)
    e = math.exp(0.5)
    np.testing.assert_allclose(share, [e / (e + 1.0 + e), 0.0, 1.0, 0.0])
    assert unseen_share(np.zeros(0, int), np.zeros(0), np.zeros(0, bool), 2).tolist() == [0, 0]


def test_each_unseen_place_is_a_candidate_of_its_own_with_its_centre() -> None:
    # home, new place A, home, new place B, new place A, home: A twice, B once, both after the vocabulary
    log = make_log([(0, 2, 0), (100, 1, 0), (200, 2, 0), (300, 1, 1), (400, 1, 0), (500, 2, 0)])
    places = UnseenPlaces.build(log, NUM_PLACES, CENTRES, centres_of(log))
    assert places.held == 2
    assert places.log.place.tolist() == [2, NUM_PLACES, 2, NUM_PLACES + 1, NUM_PLACES, 2]
    candidates = CandidateSet.build(places.routine, queries_after_last(places.log))
    assert candidates.place.tolist() == [2, NUM_PLACES, NUM_PLACES + 1]
    assert candidates.column("n_place").tolist() == [3.0, 2.0, 1.0]
    # the moves out of the current place count each unseen place apart: home -> A once, home -> B once
    assert candidates.column("n_transition").tolist() == [0.0, 1.0, 1.0]
    # their distances from home are known: each has the centre of its visits
    assert np.isfinite(candidates.column("log_km")).all()
    # visits without coordinates give no centres: the distances to those places are unknown (NaN)
    assert unseen_centres(pd.DataFrame({"place": [1], "raw_place": [100]})) is None


unseen_rows = st.lists(
    st.tuples(st.integers(0, 30 * MINUTES_PER_DAY), st.sampled_from([1, 1, 2, 3]), st.integers(0, 3)),
    min_size=2,
    max_size=20,
)


@settings(max_examples=40, deadline=None)
@given(rows=unseen_rows)
def test_no_share_reads_the_target_or_a_visit_after_it(rows) -> None:
    """Each question's share is the same when its target and every visit after it are removed: every
    visit has coordinates of its own, each place's centre (known or not) comes from the log, and the
    scorer reads ``log_km``."""
    log = make_log(rows, located=True)
    targets = log.staypoint[1:]
    places = UnseenPlaces.build(log, NUM_PLACES)
    queries = queries_for_targets(places.log, targets)
    whole = distance_shares(places, queries)
    assert np.isfinite(CandidateSet.build(places.routine, queries).column("log_km")).all()
    for i in range(len(targets)):  # target i is visit i + 1: the visits up to i are kept
        past = log.take(np.arange(len(log)) <= i)
        past_places = UnseenPlaces.build(past, NUM_PLACES)
        alone = distance_shares(past_places, queries_after_last(past_places.log, queries.now[[i]]))
        np.testing.assert_allclose(alone, whole[i : i + 1], rtol=1e-12, atol=0)


def test_a_registered_model_keeps_the_centres_of_all_its_visits() -> None:
    """The tally holds each unseen place's centre over all the visits it was built on (what an answer
    reads: a deployed answer has no future), the mean of their coordinates."""
    log = make_log([(0, 2, 0), (100, 1, 0), (200, 2, 0), (300, 1, 1), (400, 1, 0)], located=True)
    _, stored = split_tally(
        join_tallies(Routine(log, NUM_PLACES).tally(), UnseenPlaces.build(log, NUM_PLACES).tally())
    )
    unseen = log.place == 1
    expected = (
        pd.DataFrame({"raw": log.raw_place, "lat": log.latitude, "lon": log.longitude})[unseen]
        .groupby("raw")
        .mean()
        .to_numpy()
    )
    np.testing.assert_allclose(stored.centres, expected, rtol=1e-14)


@settings(max_examples=60, deadline=None)
@given(past=unseen_rows, later=unseen_rows)
def test_a_profile_and_a_request_share_like_the_whole_log(past, later) -> None:
    """The stored tally of the past plus a request of later visits (its places outside the vocabulary its
    own) gives the share of the whole log. The past ends more than 7 days before the request: a request
    that repeats the tally's last days would bring its unseen places under ids of its own (docs/routine.md)."""
    cut = 38 * MINUTES_PER_DAY
    before = make_log(past)
    after = make_log([(cut + s, p, r) for s, p, r in later], first_raw=200)
    fields = [f for f in VisitLog.__dataclass_fields__ if getattr(before, f) is not None]
    whole_log = VisitLog(**{f: np.concatenate([getattr(before, f), getattr(after, f)]) for f in fields})
    stored_places = UnseenPlaces.build(before, NUM_PLACES, CENTRES, centres_of(before))
    _, stored = split_tally(join_tallies(Routine(before, NUM_PLACES).tally(), stored_places.tally()))
    now = np.array([int(whole_log.end.max()) + 60])
    served_places = UnseenPlaces.build(after, NUM_PLACES, CENTRES, centres_of(after), stored=stored)
    whole_places = UnseenPlaces.build(whole_log, NUM_PLACES, CENTRES, centres_of(whole_log))
    served = shares(served_places, queries_after_last(served_places.log, now))
    whole = shares(whole_places, queries_after_last(whole_places.log, now))
    np.testing.assert_allclose(served, whole)


def test_a_profile_keeps_its_unseen_places_and_centres_apart_and_an_old_one_has_none() -> None:
    log = make_log([(0, 2, 0), (100, 1, 0), (200, 1, 1)])
    routine_table = Routine(log, NUM_PLACES).tally()
    places = UnseenPlaces.build(log, NUM_PLACES, CENTRES, centres_of(log))
    tally, stored = split_tally(join_tallies(routine_table, places.tally()))
    pd.testing.assert_frame_equal(tally, routine_table)
    assert stored is not None
    assert stored.held == 2
    np.testing.assert_allclose(stored.centres, centres_of(log))
    old, none = split_tally(routine_table)
    assert none is None
    assert old is routine_table


def test_a_tally_file_reads_back_as_split_tally_stores_it_however_its_rows_are_grouped(tmp_path) -> None:
    """``read_tally`` (what a bundle is loaded with: a row group at a time) gives every index's counts, the
    users and the unseen places' centres that ``split_tally`` of the whole table gives: from a file written
    index by index (``tally_parts``, as a bundle is now) and from one written as one table (older bundles);
    a tally without unseen places reads back without them."""
    from nextloc.routine.tally import TALLY_SCHEMA
    from nextloc.routine.unseen import read_tally
    from nextloc.storage import write_parquet, write_parquet_parts

    log = make_log([(0, 2, 0), (100, 1, 0), (200, 1, 1), (300, 3, 0), (400, 1, 1)], located=True)
    routine, places = Routine(log, NUM_PLACES), UnseenPlaces.build(log, NUM_PLACES, CENTRES, centres_of(log))
    table, expected = split_tally(join_tallies(routine.tally(), places.tally()))
    want = StoredTally.from_frame(table)
    parts = [*routine.tally_parts(), *places.tally_parts()]
    write_parquet_parts(iter(parts), TALLY_SCHEMA, tmp_path / "parts.parquet")
    write_parquet(join_tallies(routine.tally(), places.tally()), tmp_path / "one.parquet")
    write_parquet(routine.tally(), tmp_path / "routine_only.parquet")
    for name in ("parts.parquet", "one.parquet"):
        got, unseen = read_tally(tmp_path / name)
        assert unseen is not None
        assert expected is not None
        for stored, reference in ((got, want), (unseen.tally, expected.tally)):
            assert set(stored.bases) == set(reference.bases), name
            for index, base in reference.bases.items():
                for column in ("key", "count", "total", "last"):
                    np.testing.assert_array_equal(getattr(stored.bases[index], column), getattr(base, column))
            np.testing.assert_array_equal(stored.users, reference.users)
            np.testing.assert_array_equal(stored.user_end, reference.user_end)
        np.testing.assert_array_equal(unseen.centres, expected.centres)
    _, none = read_tally(tmp_path / "routine_only.parquet")
    assert none is None


def test_a_request_with_too_many_unseen_places_is_refused() -> None:
    log = make_log([(i * 100, 1, i) for i in range(REQUEST_CAPACITY + 1)])
    _, stored = split_tally(UnseenPlaces.build(log, NUM_PLACES, CENTRES).tally())
    with pytest.raises(ValueError, match="outside the vocabulary in one request"):
        UnseenPlaces.build(log, NUM_PLACES, CENTRES, stored=stored)


def test_an_answer_reads_the_share_only_with_the_unseen_places_tally() -> None:
    """A registered model answers with ``unseen_return_share`` after its explore features when its tally
    holds the unseen places' routine; one registered before it answers with the explore features alone."""
    past = make_log([(0, 2, 0), (100, 1, 0), (200, 2, 0), (300, 1, 0)])
    past_places = UnseenPlaces.build(past, NUM_PLACES, CENTRES, centres_of(past))
    tally, unseen = split_tally(join_tallies(Routine(past, NUM_PLACES).tally(), past_places.tally()))
    start = pd.to_datetime(40 * MINUTES_PER_DAY + np.array([0, 100]), unit="m", utc=True)
    visits = pd.DataFrame(
        {"history": [0, 0], "started_at": start, "finished_at": start + pd.Timedelta(minutes=60)}
    ).assign(place=[2, 1], raw_place=[2, -1], latitude=[39.95, 40.2], longitude=[116.35, 116.6])
    args = dict(
        model=RoutineRule(),
        tally=StoredTally.from_frame(tally),
        num_places=NUM_PLACES,
        centres=CENTRES,
        popularity=np.ones(NUM_PLACES),
        timezone="UTC",
    )
    at = pd.Series([start[-1] + pd.Timedelta(minutes=120)])
    _, with_share = RoutineAnswerer(**args, unseen=unseen).answer(visits, np.array([1]), at)
    _, without = RoutineAnswerer(**args).answer(visits, np.array([1]), at)
    assert with_share.shape == (1, len(EXPLORE_FEATURES) + 1)
    np.testing.assert_array_equal(with_share[:, :-1], without)
    # the tally's unseen place and the request's are both candidates beside home: a share above 0
    assert 0.0 < with_share[0, -1] < 1.0
