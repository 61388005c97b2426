"""nextloc's compiled sliding-window staypoints against trackintel 1.4.2 itself.

The reference (mie-lab/location-prediction, ``preprocessing/geolife.py``) calls::

    pfs.as_positionfixes.generate_staypoints(gap_threshold=24 * 60, include_last=True,
                                             dist_threshold=200, time_threshold=30)

with trackintel's defaults ``method="sliding"``, ``distance_metric="haversine"`` and
``exclude_duplicate_pfs=True``. :func:`nextloc.preprocessing.staypoints.generate_staypoints` must give the very same
staypoints, bit for bit: same count, same ``started_at``/``finished_at``, same centroid and median elevation.
"""

from __future__ import annotations

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import trackintel  # noqa: F401  (registers the .as_positionfixes accessor)

from nextloc.config import StaypointConfig
from nextloc.preprocessing.staypoints import generate_staypoints

SAMPLE_USERS = [11, 60, 73, 87, 92, 99, 112, 155, 174, 178, 181]
USERS_WITH_EXACT_DUPLICATES = {112: 2}  # user -> number of exact duplicate positionfixes in the sample

# The reference parameters (trackintel names).
REFERENCE_KWARGS = {
    "method": "sliding",
    "distance_metric": "haversine",
    "dist_threshold": 200,
    "time_threshold": 30,
    "gap_threshold": 24 * 60,
    "include_last": True,
    "exclude_duplicate_pfs": True,
    "n_jobs": 1,
}

# trackintel's own warnings, each expected in exactly the situations named.
TI_DUPLICATES_DROPPED = "ignore:.*duplicates were dropped from your positionfixes:UserWarning"
TI_NO_STAYPOINTS = "ignore:No staypoints can be generated:UserWarning"

T0 = pd.Timestamp("2008-10-23 02:00:00", tz="UTC")
# Beijing; 0.01 degree of latitude is ~1.1 km, far beyond the 200 m leave radius.
HOME = (39.984702, 116.318417)
AWAY = (39.994702, 116.318417)


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def to_trackintel_pfs(pfs: pd.DataFrame) -> gpd.GeoDataFrame:
    """trackintel positionfixes from nextloc's table: Point(lon, lat) in EPSG:4326, index = row order."""
    return gpd.GeoDataFrame(
        {
            "user_id": pfs["user_id"].to_numpy(),
            "tracked_at": pfs["tracked_at"].to_numpy(),
            "elevation": pfs["elevation"].to_numpy(),
        },
        geometry=gpd.points_from_xy(pfs["longitude"], pfs["latitude"]),
        crs="EPSG:4326",
    ).rename_geometry("geom")


def trackintel_staypoints(pfs: pd.DataFrame, **overrides) -> tuple[gpd.GeoDataFrame, gpd.GeoDataFrame]:
    """(positionfixes with staypoint_id, staypoints) from trackintel with the reference parameters."""
    return to_trackintel_pfs(pfs).as_positionfixes.generate_staypoints(**{**REFERENCE_KWARGS, **overrides})


def assert_same_staypoints(ours: pd.DataFrame, theirs: gpd.GeoDataFrame) -> None:
    """Exact equality of nextloc's staypoints and trackintel's (count, times, centroid, elevation)."""
    assert len(ours) == len(theirs)
    if len(theirs) == 0:
        return
    np.testing.assert_array_equal(ours["user_id"].to_numpy(), theirs["user_id"].to_numpy())
    np.testing.assert_array_equal(
        ours["started_at"].to_numpy("datetime64[ns]"),
        theirs["started_at"].dt.tz_convert("UTC").to_numpy("datetime64[ns]"),
    )
    np.testing.assert_array_equal(
        ours["finished_at"].to_numpy("datetime64[ns]"),
        theirs["finished_at"].dt.tz_convert("UTC").to_numpy("datetime64[ns]"),
    )
    np.testing.assert_array_equal(ours["latitude"].to_numpy(), theirs.geometry.y.to_numpy())
    np.testing.assert_array_equal(ours["longitude"].to_numpy(), theirs.geometry.x.to_numpy())
    np.testing.assert_array_equal(ours["elevation"].to_numpy(), theirs["elevation"].to_numpy())


def make_pfs(
    rows: list[tuple[float, tuple[float, float]] | tuple[float, tuple[float, float], float]], user_id: int = 1
):
    """Positionfixes from ``(minutes after T0, (lat, lon)[, elevation])`` tuples, in the given order."""
    minutes = [r[0] for r in rows]
    return pd.DataFrame(
        {
            "user_id": np.full(len(rows), user_id, dtype=np.int32),
            "tracked_at": T0 + pd.to_timedelta(minutes, unit="min"),
            "latitude": [r[1][0] for r in rows],
            "longitude": [r[1][1] for r in rows],
            "elevation": [r[2] if len(r) > 2 else 50.0 for r in rows],
        }
    )


def spans(staypoints: pd.DataFrame) -> list[tuple[float, float]]:
    """(start, finish) of each staypoint in minutes after T0."""
    return [
        ((s - T0) / pd.Timedelta(minutes=1), (f - T0) / pd.Timedelta(minutes=1))
        for s, f in zip(staypoints["started_at"], staypoints["finished_at"], strict=True)
    ]


@pytest.fixture(scope="module")
def sample_pfs(sample_reads) -> dict[int, pd.DataFrame]:
    """nextloc's parse of every sample user, as pandas, in read order (no row may be skipped)."""
    out = {}
    for user_id, (pfs, report) in sample_reads.items():
        assert report.rows_skipped == 0, report.to_dict()
        out[user_id] = pfs
    return out


# --------------------------------------------------------------------------- #
# tests
# --------------------------------------------------------------------------- #


class TestGenerateStaypoints:
    """``generate_staypoints`` is trackintel's sliding method, row for row."""

    def test_sample_has_the_expected_users(self, sample_pfs):
        assert sorted(sample_pfs) == SAMPLE_USERS

    @pytest.mark.parametrize("user_id", SAMPLE_USERS)
    @pytest.mark.filterwarnings(TI_DUPLICATES_DROPPED, TI_NO_STAYPOINTS)
    def test_identical_to_trackintel_on_sample_user(self, sample_pfs, user_id):
        pfs = sample_pfs[user_id]
        ours = generate_staypoints(pfs)
        ti_pfs, ti_sp = trackintel_staypoints(pfs)

        assert ours.user_id == user_id
        assert ours.n_duplicates == USERS_WITH_EXACT_DUPLICATES.get(user_id, 0)
        assert ours.n_pfs == len(ti_pfs)
        assert_same_staypoints(ours.staypoints, ti_sp)
        # the number of fixes behind each staypoint is trackintel's pfs -> staypoint assignment
        ti_counts = ti_pfs["staypoint_id"].value_counts().sort_index()
        np.testing.assert_array_equal(ours.staypoints["n_pfs"].to_numpy(), ti_counts.to_numpy())

    def test_sample_covers_duplicates_and_users_without_staypoints(self, sample_pfs):
        """The sample exercises the edge cases: exact duplicates (112) and users with no staypoint."""
        for user_id, n_dup in USERS_WITH_EXACT_DUPLICATES.items():
            assert sample_pfs[user_id].duplicated().sum() == n_dup
        assert len(generate_staypoints(sample_pfs[60]).staypoints) == 0
        assert len(generate_staypoints(sample_pfs[178]).staypoints) == 0

    @pytest.mark.filterwarnings(TI_NO_STAYPOINTS)
    def test_gap_above_threshold_resets_the_anchor(self):
        """A gap > 24 h drops the open window (even one already 40 min long) and restarts after the gap.

        HOME at 0, 20, 40 min; 25 h of silence; HOME at 1500, 1540 min; AWAY at 1550 min. Expected: a single
        staypoint [1500, 1550] -- the 0-40 min window is never closed by a far fix, so it is not emitted.
        """
        pfs = make_pfs([(0, HOME), (20, HOME), (40, HOME), (1500, HOME), (1540, HOME), (1550, AWAY)])
        result = generate_staypoints(pfs)
        assert spans(result.staypoints) == [(1500.0, 1550.0)]
        assert_same_staypoints(result.staypoints, trackintel_staypoints(pfs)[1])

    def test_gap_equal_to_threshold_does_not_reset(self):
        """The gap test is strict (>): a gap of exactly 24 h keeps the anchor.

        HOME at 0 min and 1440 min, AWAY at 1450 min. Expected: one staypoint [0, 1450] spanning the gap.
        """
        pfs = make_pfs([(0, HOME), (1440, HOME), (1450, AWAY)])
        result = generate_staypoints(pfs)
        assert spans(result.staypoints) == [(0.0, 1450.0)]
        assert_same_staypoints(result.staypoints, trackintel_staypoints(pfs)[1])

    @pytest.mark.filterwarnings(TI_NO_STAYPOINTS)
    def test_include_last(self):
        """A trailing window that is never left becomes a staypoint only with include_last.

        HOME at 0, 10, 20, 30, 40 min, with elevations 10..50. Expected with include_last: one staypoint
        [0, 40] (finished_at = the last fix) whose elevation median covers all five fixes (30.0); without
        include_last: no staypoint.
        """
        pfs = make_pfs([(m, HOME, 10.0 + m) for m in (0, 10, 20, 30, 40)])
        result = generate_staypoints(pfs)
        assert spans(result.staypoints) == [(0.0, 40.0)]
        assert result.staypoints["elevation"].tolist() == [30.0]
        assert result.staypoints["n_pfs"].tolist() == [5]
        assert_same_staypoints(result.staypoints, trackintel_staypoints(pfs)[1])

        without = generate_staypoints(pfs, StaypointConfig(include_last=False))
        assert len(without.staypoints) == 0
        assert len(trackintel_staypoints(pfs, include_last=False)[1]) == 0

    @pytest.mark.filterwarnings(TI_NO_STAYPOINTS)
    def test_time_threshold_boundary(self):
        """Duration is measured to the first fix outside, with >=: exactly 30 min is a staypoint.

        HOME at 0 and 15 min, AWAY at 30 min: staypoint [0, 30] made of the two HOME fixes (AWAY is not
        part of its geometry). With AWAY at 29.5 min instead: no staypoint.
        """
        pfs = make_pfs([(0, HOME, 10.0), (15, HOME, 20.0), (30, AWAY, 1000.0)])
        result = generate_staypoints(pfs)
        assert spans(result.staypoints) == [(0.0, 30.0)]
        sp = result.staypoints.iloc[0]
        assert (sp["latitude"], sp["n_pfs"], sp["elevation"]) == (HOME[0], 2, 15.0)
        assert sp["longitude"] == pytest.approx(HOME[1], abs=1e-12)
        assert_same_staypoints(result.staypoints, trackintel_staypoints(pfs)[1])

        short = make_pfs([(0, HOME), (15, HOME), (29.5, AWAY)])
        assert len(generate_staypoints(short).staypoints) == 0
        assert len(trackintel_staypoints(short)[1]) == 0

    @pytest.mark.filterwarnings(TI_DUPLICATES_DROPPED)
    def test_exact_duplicates_are_dropped(self):
        """Exact duplicate fixes are removed first; same time with other values is not a duplicate.

        HOME at 0 (elev 10), 10 (elev 20), 20 (elev 30) and an exact copy of the 20-min fix, plus a fix at
        10 min with elevation 21 (same place and time, different elevation: kept); AWAY at 40 min.
        Expected: 1 duplicate dropped, one staypoint [0, 40] of 4 fixes with median elevation
        median(10, 20, 21, 30) = 20.5. Keeping the duplicate (exclude_duplicate_pfs=False) gives 5 fixes
        and median 21.0 -- trackintel agrees in both modes.
        """
        pfs = make_pfs(
            [
                (0, HOME, 10.0),
                (10, HOME, 20.0),
                (20, HOME, 30.0),
                (20, HOME, 30.0),
                (10, HOME, 21.0),
                (40, AWAY),
            ]
        )
        result = generate_staypoints(pfs)
        assert result.n_duplicates == 1
        assert result.n_pfs == 5
        assert spans(result.staypoints) == [(0.0, 40.0)]
        assert result.staypoints["n_pfs"].tolist() == [4]
        assert result.staypoints["elevation"].tolist() == [20.5]
        assert_same_staypoints(result.staypoints, trackintel_staypoints(pfs)[1])

        kept = generate_staypoints(pfs, StaypointConfig(exclude_duplicate_pfs=False))
        assert kept.n_duplicates == 0
        assert kept.staypoints["n_pfs"].tolist() == [5]
        assert kept.staypoints["elevation"].tolist() == [21.0]
        assert_same_staypoints(kept.staypoints, trackintel_staypoints(pfs, exclude_duplicate_pfs=False)[1])

    @pytest.mark.filterwarnings(TI_DUPLICATES_DROPPED)
    def test_input_not_mutated_and_order_independent(self, sample_pfs):
        """The input frame is left untouched; shuffled input gives the same staypoints as read order."""
        pfs = sample_pfs[112]
        shuffled = pfs.sample(frac=1.0, random_state=7)
        before = shuffled.copy(deep=True)
        result = generate_staypoints(shuffled)
        pd.testing.assert_frame_equal(shuffled, before)
        pd.testing.assert_frame_equal(result.staypoints, generate_staypoints(pfs).staypoints)

    def test_naive_timestamps_raise(self):
        pfs = make_pfs([(0, HOME), (40, AWAY)])
        pfs["tracked_at"] = pfs["tracked_at"].dt.tz_localize(None)
        with pytest.raises(ValueError, match="timezone-aware"):
            generate_staypoints(pfs)

    def test_several_users_raise(self):
        pfs = pd.concat(
            [make_pfs([(0, HOME)], user_id=1), make_pfs([(0, HOME)], user_id=2)], ignore_index=True
        )
        with pytest.raises(ValueError, match="per user"):
            generate_staypoints(pfs)

    def test_missing_column_raises(self):
        with pytest.raises(ValueError, match="elevation"):
            generate_staypoints(make_pfs([(0, HOME)]).drop(columns="elevation"))
