"""nextloc.routine.counts: the group helpers against the pandas they replace."""

from __future__ import annotations

import numpy as np
import pandas as pd

from nextloc.routine.counts import EventCounts, first_of_pairs, rank_within


def test_rank_within_is_pandas_min_rank():
    rng = np.random.default_rng(5)
    group = rng.integers(0, 6, 400)
    value = rng.integers(0, 5, 400).astype(np.float64)
    value[rng.random(400) < 0.1] = np.inf
    expected = pd.Series(value).groupby(group).rank(method="min").to_numpy(np.float64)
    np.testing.assert_array_equal(rank_within(group, value), expected)
    assert len(rank_within(np.zeros(0, dtype=np.int64), np.zeros(0))) == 0


def test_first_of_pairs_is_pandas_groupby_min():
    rng = np.random.default_rng(6)
    user, raw, start = rng.integers(0, 4, 300), rng.integers(0, 9, 300), rng.integers(0, 10**6, 300)
    first = pd.DataFrame({"u": user, "r": raw, "s": start}).groupby(["u", "r"], sort=True)["s"].min()
    u, r, s = first_of_pairs(user, raw, start)
    assert u.tolist() == first.index.get_level_values("u").tolist()
    assert r.tolist() == first.index.get_level_values("r").tolist()
    assert s.tolist() == first.tolist()


def test_a_sum_before_a_time_reads_nothing_later_to_the_last_bit():
    """Coordinates summed per place (a centre as of now): the sums before each time are bit-identical
    when every later event, of any key, is removed."""
    rng = np.random.default_rng(8)
    keys, times = rng.integers(0, 5, 500), rng.integers(0, 10**5, 500)
    values = 39.9 + rng.random(500) * 0.2
    whole = EventCounts(keys, times, values)
    for cut in (1, 10**3, 5 * 10**4, 10**5):
        early = times < cut
        past = EventCounts(keys[early], times[early], values[early])
        asked = np.arange(5)
        at = np.full(5, cut)
        np.testing.assert_array_equal(past.total(asked, at), whole.total(asked, at))
        expected = [values[early & (keys == k)].sum() for k in asked]
        np.testing.assert_allclose(whole.total(asked, at), expected, rtol=1e-12)
