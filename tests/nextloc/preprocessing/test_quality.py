"""nextloc's user-quality filter against the reference computation on trackintel triplegs and trips.

The reference (mie-lab/location-prediction ``preprocessing/geolife.py``) generates triplegs
(``generate_triplegs(sp)``, gap 15 min), activity flags (25 min), trips (``generate_trips(sp, tpls,
add_geometry=False)``) and keeps the users returned by ``calculate_user_quality(sp, trips, ...,
{"day_filter": 50, "window_size": 10})`` (``preprocessing/utils.py``). That function and its helper
``_get_tracking_quality`` are ported below verbatim (minus prints and the CSV side file) as the oracle.

nextloc needs no triplegs or trips: :func:`nextloc.preprocessing.quality.filter_users_by_quality` works on per-user
extents built from the staypoints and the tripleg extents that
:func:`nextloc.preprocessing.staypoints.generate_staypoints` reports.
"""

from __future__ import annotations

import datetime
import re
import warnings

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import trackintel as ti
from trackintel.analysis.tracking_quality import _split_overlaps, temporal_tracking_quality

from nextloc.config import QualityConfig
from nextloc.preprocessing.quality import filter_users_by_quality, user_extents
from nextloc.preprocessing.staypoints import create_activity_flag, generate_staypoints

# From the sample's description: who passes the reference quality filter and who does not.
QUALITY_USERS = {11, 73, 92, 99, 112, 155, 174, 181}
FAILING_USERS = {60, 87, 178}
QUALITY_FILTER = {"day_filter": 50, "window_size": 10}

# Expected warnings: trackintel's own, and pandas' about the reference code's groupby-apply on the
# grouping column (``_get_tracking_quality`` reads ``df["user_id"]``, so the reference relies on it).
TI_DUPLICATES_DROPPED = "ignore:.*duplicates were dropped from your positionfixes:UserWarning"
TI_INVALID_TRIPLEGS = "ignore:The positionfixes with ids .* lead to invalid tripleg geometries:UserWarning"
TI_NO_STAYPOINTS = "ignore:No staypoints can be generated:UserWarning"
PD_APPLY_ON_GROUPING = "ignore:DataFrameGroupBy.apply operated on the grouping columns:FutureWarning"
# the reference's per-user sliding-window apply returns an empty frame for users without a window
PD_CONCAT_EMPTY = "ignore:The behavior of DataFrame concatenation with empty or all-NA entries:FutureWarning"
EXPECTED_REFERENCE_WARNINGS = [
    r"^2 duplicates were dropped from your positionfixes",  # user 112's two exact duplicates
    r"lead to invalid tripleg geometries",  # a tripleg of two identical points
    r"^DataFrameGroupBy\.apply operated on the grouping columns",
    r"^The behavior of DataFrame concatenation with empty or all-NA entries",
]


# --------------------------------------------------------------------------- #
# the reference quality computation (preprocessing/utils.py), ported faithfully
# --------------------------------------------------------------------------- #


def ref_calculate_user_quality(sp, trips, quality_filter):
    """Reference ``calculate_user_quality``; returns the kept user ids (prints / CSV output dropped)."""
    trips["started_at"] = pd.to_datetime(trips["started_at"]).dt.tz_localize(None)
    trips["finished_at"] = pd.to_datetime(trips["finished_at"]).dt.tz_localize(None)
    sp["started_at"] = pd.to_datetime(sp["started_at"]).dt.tz_localize(None)
    sp["finished_at"] = pd.to_datetime(sp["finished_at"]).dt.tz_localize(None)

    # merge trips and staypoints
    sp["type"] = "sp"
    trips["type"] = "tpl"
    df_all = pd.concat([sp, trips])
    df_all = _split_overlaps(df_all, granularity="day")
    df_all["duration"] = (df_all["finished_at"] - df_all["started_at"]).dt.total_seconds()

    if "min_thres" in quality_filter:
        end_period = datetime.datetime(2017, 12, 26)
        df_all = df_all.loc[df_all["finished_at"] < end_period]

    # get quality
    total_quality = temporal_tracking_quality(df_all, granularity="all")
    # get tracking days
    total_quality["days"] = (
        df_all.groupby("user_id")
        .apply(lambda x: (x["finished_at"].max() - x["started_at"].min()).days)
        .values
    )
    # filter based on days
    user_filter_day = (
        total_quality.loc[(total_quality["days"] > quality_filter["day_filter"])]
        .reset_index(drop=True)["user_id"]
        .unique()
    )

    sliding_quality = (
        df_all.groupby("user_id")
        .apply(_ref_get_tracking_quality, window_size=quality_filter["window_size"])
        .reset_index(drop=True)
    )

    filter_after_day = sliding_quality.loc[sliding_quality["user_id"].isin(user_filter_day)]

    if "min_thres" in quality_filter:
        # filter based on quanlity
        filter_after_day = (
            filter_after_day.groupby("user_id")
            .apply(
                _ref_filter_user,
                min_thres=quality_filter["min_thres"],
                mean_thres=quality_filter["mean_thres"],
            )
            .reset_index(drop=True)
            .dropna()
        )

    filter_after_user_quality = filter_after_day.groupby("user_id", as_index=False)["quality"].mean()
    return filter_after_user_quality["user_id"].values


def _ref_filter_user(df, min_thres, mean_thres):
    consider = df.loc[df["quality"] != 0]
    if (consider["quality"].min() > min_thres) and (consider["quality"].mean() > mean_thres):
        return df


def _ref_get_tracking_quality(df, window_size):
    weeks = (df["finished_at"].max() - df["started_at"].min()).days // 7
    start_date = df["started_at"].min().date()

    quality_list = []
    # construct the sliding week gdf
    for i in range(0, weeks - window_size + 1):
        curr_start = datetime.datetime.combine(start_date + datetime.timedelta(weeks=i), datetime.time())
        curr_end = datetime.datetime.combine(
            curr_start + datetime.timedelta(weeks=window_size), datetime.time()
        )

        # the total df for this time window
        cAll_gdf = df.loc[(df["started_at"] >= curr_start) & (df["finished_at"] < curr_end)]
        if cAll_gdf.shape[0] == 0:
            continue
        total_sec = (curr_end - curr_start).total_seconds()

        quality_list.append([i, cAll_gdf["duration"].sum() / total_sec])
    ret = pd.DataFrame(quality_list, columns=["timestep", "quality"])
    ret["user_id"] = df["user_id"].unique()[0]
    return ret


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def reference_pipeline(pfs_by_user: dict[int, pd.DataFrame]):
    """The reference steps 1-3 with trackintel on all users at once: (sp, tpls, trips, kept users)."""
    df = pd.concat(pfs_by_user.values(), ignore_index=True)
    pfs = gpd.GeoDataFrame(
        df[["user_id", "tracked_at", "elevation"]],
        geometry=gpd.points_from_xy(df["longitude"], df["latitude"]),
        crs="EPSG:4326",
    ).rename_geometry("geom")
    pfs, sp = pfs.as_positionfixes.generate_staypoints(
        method="sliding",
        distance_metric="haversine",
        dist_threshold=200,
        time_threshold=30,
        gap_threshold=24 * 60,
        include_last=True,
        exclude_duplicate_pfs=True,
        n_jobs=1,
    )
    sp = sp.as_staypoints.create_activity_flag(method="time_threshold", time_threshold=25)
    pfs, tpls = pfs.as_positionfixes.generate_triplegs(sp)
    sp, tpls, trips = ti.preprocessing.generate_trips(sp, tpls, add_geometry=False)
    kept = ref_calculate_user_quality(sp.copy(), trips.copy(), QUALITY_FILTER)
    return sp, tpls, trips, kept


def records(user_id: int, spans: list[tuple[str, str]]) -> pd.DataFrame:
    """Staypoint-like rows of one user from (start, end) UTC strings."""
    return pd.DataFrame(
        {
            "user_id": user_id,
            "started_at": pd.to_datetime([s for s, _ in spans], utc=True),
            "finished_at": pd.to_datetime([e for _, e in spans], utc=True),
        }
    )


def no_triplegs() -> pd.DataFrame:
    """Tripleg extents of nobody (typed like real ones)."""
    return pd.DataFrame(
        {
            "user_id": np.array([], dtype=np.int64),
            "tripleg_start": pd.to_datetime([], utc=True),
            "tripleg_end": pd.to_datetime([], utc=True),
        }
    )


@pytest.fixture(scope="module")
def ours(sample_staypoints):
    """All users' staypoints and the per-user tripleg extents, from nextloc alone (the session's parse)."""
    return sample_staypoints


@pytest.fixture(scope="module")
def reference(sample_positionfixes):
    """The reference pipeline on the sample; it must raise only the warnings known for this data."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = reference_pipeline(sample_positionfixes)
    unexpected = [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if not any(re.search(pattern, str(w.message)) for pattern in EXPECTED_REFERENCE_WARNINGS)
    ]
    assert not unexpected
    return out


# --------------------------------------------------------------------------- #
# tests
# --------------------------------------------------------------------------- #


class TestQualityFilterOnSample:
    def test_kept_users_equal_reference(self, ours, reference):
        sp, extents = ours
        kept = filter_users_by_quality(user_extents(sp, extents))
        assert set(kept["user_id"]) == {int(u) for u in reference[3]}

    def test_kept_users_are_the_documented_ones(self, ours, reference):
        sp, extents = ours
        kept = set(filter_users_by_quality(user_extents(sp, extents))["user_id"])
        assert kept == QUALITY_USERS
        assert {int(u) for u in reference[3]} == QUALITY_USERS
        assert set(extents["user_id"]) - kept == FAILING_USERS

    def test_tripleg_extents_equal_trackintel_triplegs(self, ours, reference):
        _, extents = ours
        tpls = reference[1]
        ti_ext = tpls.groupby("user_id").agg(
            tripleg_start=("started_at", "min"), tripleg_end=("finished_at", "max")
        )
        ours_ext = extents.dropna(subset=["tripleg_start"]).set_index("user_id").sort_index()
        assert list(ours_ext.index) == list(ti_ext.index)
        for col in ("tripleg_start", "tripleg_end"):
            np.testing.assert_array_equal(
                ours_ext[col].to_numpy("datetime64[ns]"),
                ti_ext[col].dt.tz_convert("UTC").to_numpy("datetime64[ns]"),
            )

    def test_user_extents_equal_staypoints_and_trips(self, ours, reference):
        """The extent over staypoints + tripleg extents is the extent over the reference's sp + trips."""
        sp, extents = ours
        ti_sp, _, ti_trips, _ = reference
        both = pd.concat(
            [
                ti_sp[["user_id", "started_at", "finished_at"]],
                ti_trips[["user_id", "started_at", "finished_at"]],
            ]
        )
        expected = both.groupby("user_id").agg(
            started_at=("started_at", "min"), finished_at=("finished_at", "max")
        )
        got = user_extents(sp, extents).set_index("user_id")
        assert list(got.index) == list(expected.index)
        for col in ("started_at", "finished_at"):
            np.testing.assert_array_equal(
                got[col].to_numpy("datetime64[ns]"),
                expected[col].dt.tz_convert("UTC").to_numpy("datetime64[ns]"),
            )

    def test_nextloc_staypoints_match_the_reference_staypoints(self, ours, reference):
        sp, _ = ours
        ti_sp = reference[0].sort_values(["user_id", "started_at"])
        np.testing.assert_array_equal(sp["user_id"].to_numpy(), ti_sp["user_id"].to_numpy())
        np.testing.assert_array_equal(
            sp["started_at"].to_numpy("datetime64[ns]"),
            ti_sp["started_at"].dt.tz_convert("UTC").to_numpy("datetime64[ns]"),
        )
        np.testing.assert_array_equal(
            create_activity_flag(sp, 25)["is_activity"].to_numpy(), ti_sp["is_activity"].to_numpy()
        )


class TestQualityFilterBoundaries:
    """Synthetic users around the two rules, checked against the ported reference on the same records."""

    @staticmethod
    def _reference_kept(rows: pd.DataFrame) -> set[int]:
        sp = rows.copy()
        trips = rows.iloc[:0].copy()
        return {int(u) for u in ref_calculate_user_quality(sp, trips, QUALITY_FILTER)}

    @staticmethod
    def _ours_kept(rows: pd.DataFrame, config: QualityConfig | None = None) -> set[int]:
        return set(filter_users_by_quality(user_extents(rows, no_triplegs()), config)["user_id"])

    @pytest.mark.filterwarnings(PD_APPLY_ON_GROUPING, PD_CONCAT_EMPTY)
    def test_day_and_window_rules(self):
        """Expected: 1 (50 days: not > 50) out, 2 (55 days: > 50 but 7 weeks < 10) out, 3 (69 days
        23 h: 9 weeks) out, 4 (exactly 70 days: one window) kept, 5 (200 days, two records) kept, and 6
        (one record spanning 80 days, cut at midnights by the reference) kept."""
        rows = pd.concat(
            [
                records(
                    1, [("2008-01-01 10:00", "2008-01-01 11:00"), ("2008-02-20 09:00", "2008-02-20 11:00")]
                ),
                records(
                    2, [("2008-01-01 10:00", "2008-01-01 11:00"), ("2008-02-25 10:00", "2008-02-25 11:00")]
                ),
                records(
                    3, [("2008-01-01 10:00", "2008-01-01 11:00"), ("2008-03-11 08:00", "2008-03-11 09:59")]
                ),
                records(
                    4, [("2008-01-01 10:00", "2008-01-01 11:00"), ("2008-03-11 09:00", "2008-03-11 10:00")]
                ),
                records(
                    5, [("2008-01-01 10:00", "2008-01-01 11:00"), ("2008-07-19 10:00", "2008-07-19 11:00")]
                ),
                records(6, [("2008-01-01 10:00", "2008-03-21 10:00")]),
            ],
            ignore_index=True,
        )
        expected = {4, 5, 6}
        assert self._reference_kept(rows) == expected
        assert self._ours_kept(rows) == expected

    @pytest.mark.filterwarnings(PD_APPLY_ON_GROUPING, PD_CONCAT_EMPTY)
    def test_day_filter_alone(self):
        """With a 1-week window the day filter decides: 50 days (user 1) is out, 51 days (user 2) is in --
        for the reference with ``window_size=1`` and for nextloc with ``window_weeks=1`` alike."""
        rows = pd.concat(
            [
                records(
                    1, [("2008-01-01 10:00", "2008-01-01 11:00"), ("2008-02-20 09:00", "2008-02-20 11:00")]
                ),
                records(
                    2, [("2008-01-01 10:00", "2008-01-01 11:00"), ("2008-02-21 10:00", "2008-02-21 11:00")]
                ),
            ],
            ignore_index=True,
        )
        reference = {
            int(u)
            for u in ref_calculate_user_quality(
                rows.copy(), rows.iloc[:0].copy(), {"day_filter": 50, "window_size": 1}
            )
        }
        assert reference == {2}
        assert self._ours_kept(rows, QualityConfig(day_filter=50, window_weeks=1)) == {2}

    def test_days_and_weeks_columns(self):
        rows = records(
            4, [("2008-01-01 10:00", "2008-01-01 11:00"), ("2008-03-11 09:00", "2008-03-11 10:00")]
        )
        no_tpls = pd.DataFrame(
            {
                "user_id": [4],
                "tripleg_start": pd.to_datetime([pd.NaT], utc=True),
                "tripleg_end": pd.to_datetime([pd.NaT], utc=True),
            }
        )
        kept = filter_users_by_quality(user_extents(rows, no_tpls))
        assert kept[["user_id", "days", "weeks"]].to_dict("records") == [
            {"user_id": 4, "days": 70, "weeks": 10}
        ]

    def test_triplegs_extend_the_extent(self):
        """A user whose staypoints span 10 days is kept when its triplegs stretch the span to 80 days."""
        rows = records(
            7, [("2008-01-01 10:00", "2008-01-01 11:00"), ("2008-01-11 10:00", "2008-01-11 11:00")]
        )
        tpls = pd.DataFrame(
            {
                "user_id": [7],
                "tripleg_start": pd.to_datetime(["2007-12-30 08:00"], utc=True),
                "tripleg_end": pd.to_datetime(["2008-03-20 08:00"], utc=True),
            }
        )
        ext = user_extents(rows, tpls)
        assert ext[["started_at", "finished_at"]].iloc[0].tolist() == [
            pd.Timestamp("2007-12-30 08:00", tz="UTC"),
            pd.Timestamp("2008-03-20 08:00", tz="UTC"),
        ]
        assert set(filter_users_by_quality(ext)["user_id"]) == {7}
        assert self._ours_kept(rows) == set()

    def test_missing_columns_raise(self):
        with pytest.raises(ValueError, match="finished_at"):
            filter_users_by_quality(
                pd.DataFrame({"user_id": [1], "started_at": [pd.Timestamp("2008-01-01", tz="UTC")]})
            )


class TestTriplegExtents:
    @pytest.mark.filterwarnings(TI_INVALID_TRIPLEGS)
    def test_invalid_and_split_triplegs(self):
        """Fixes (minutes: place): 0: A, 1: A | 20 min gap | 21, 31, 41, 61: B | 71: C, 72: C, 73: D.

        Staypoint: [21, 71] (the B fixes; C at 71 is the first fix outside). Tripleg candidates: {A, A}
        (cut off by the 20-min gap > 15 and by the staypoint) is two identical points, an invalid
        LineString that trackintel drops; {C, C, D} is valid. Expected tripleg extent: [71, 73] -- not 0.
        """
        a, b = (39.90, 116.30), (39.92, 116.30)
        c, d = (39.94, 116.30), (39.96, 116.30)
        fixes = [(0, a), (1, a), (21, b), (31, b), (41, b), (61, b), (71, c), (72, c), (73, d)]
        t0 = pd.Timestamp("2008-05-01 08:00", tz="UTC")
        pfs = pd.DataFrame(
            {
                "user_id": np.full(len(fixes), 1, dtype=np.int32),
                "tracked_at": [t0 + pd.Timedelta(minutes=m) for m, _ in fixes],
                "latitude": [p[0] for _, p in fixes],
                "longitude": [p[1] for _, p in fixes],
                "elevation": np.zeros(len(fixes)),
            }
        )
        result = generate_staypoints(pfs)
        assert len(result.staypoints) == 1
        assert (result.tripleg_start, result.tripleg_end) == (
            t0 + pd.Timedelta(minutes=71),
            t0 + pd.Timedelta(minutes=73),
        )

        ti_pfs = gpd.GeoDataFrame(
            pfs[["user_id", "tracked_at", "elevation"]],
            geometry=gpd.points_from_xy(pfs["longitude"], pfs["latitude"]),
            crs="EPSG:4326",
        ).rename_geometry("geom")
        ti_pfs, ti_sp = ti_pfs.as_positionfixes.generate_staypoints(
            dist_threshold=200, time_threshold=30, gap_threshold=24 * 60, include_last=True
        )
        _, tpls = ti_pfs.as_positionfixes.generate_triplegs(ti_sp)
        assert (tpls["started_at"].min(), tpls["finished_at"].max()) == (
            result.tripleg_start,
            result.tripleg_end,
        )
