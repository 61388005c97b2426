"""nextloc.routine.counts: the group helpers against the pandas they replace."""

from __future__ import annotations

import numpy as np
import pandas as pd

from nextloc.routine.counts import first_of_pairs, rank_within


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
