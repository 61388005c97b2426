"""Dataset-level DBSCAN locations and staypoint merging against sklearn and trackintel 1.4.2.

The reference (mie-lab/location-prediction ``preprocessing/geolife.py``) runs, on the activity staypoints of
the quality-filtered users::

    sp.as_staypoints.generate_locations(epsilon=20, num_samples=2, distance_metric="haversine",
                                        agg_level="dataset")
    sp = sp.loc[~sp["location_id"].isna()]
    sp.as_staypoints.merge_staypoints(triplegs=pd.DataFrame([]), max_time_gap="1min",
                                      agg={"location_id": "first"})
"""

from __future__ import annotations

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import trackintel  # noqa: F401  (registers the .as_staypoints accessor)
from sklearn.cluster import DBSCAN
from sklearn.metrics.pairwise import haversine_distances

from nextloc.config import LocationConfig, PreprocessConfig
from nextloc.io.visits import EARTH_RADIUS_M
from nextloc.preprocessing.dataset import locate_staypoints
from nextloc.preprocessing.locations import (
    generate_locations,
    make_tiles,
    merge_runs,
    merge_staypoints,
    partitioned_dbscan,
)
from nextloc.preprocessing.quality import filter_users_by_quality, user_extents
from nextloc.preprocessing.staypoints import activity_mask, create_activity_flag, to_ns

BEIJING = (39.984702, 116.318417)  # (lat, lon)
T0 = pd.Timestamp("2008-10-23 02:00:00", tz="UTC")
# trackintel's merge_staypoints concatenates the staypoints with the empty triplegs frame the reference passes
TI_CONCAT_EMPTY = "ignore:The behavior of DataFrame concatenation with empty or all-NA entries:FutureWarning"


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def reference_dbscan_input(sp: pd.DataFrame, extents: pd.DataFrame) -> pd.DataFrame:
    """The reference's DBSCAN input: activity staypoints (> 25 min) of the users passing the quality filter."""
    sp = create_activity_flag(sp, 25)
    kept = filter_users_by_quality(user_extents(sp, extents))["user_id"]
    return sp[sp["user_id"].isin(kept) & sp["is_activity"]].reset_index(drop=True)


def to_trackintel_sp(sp: pd.DataFrame) -> gpd.GeoDataFrame:
    """trackintel staypoints (index ``id`` = row order, geometry Point(lon, lat) in EPSG:4326)."""
    cols = ["user_id", "started_at", "finished_at"] + (["location_id"] if "location_id" in sp else [])
    gdf = gpd.GeoDataFrame(
        sp[cols].copy(),
        geometry=gpd.points_from_xy(sp["longitude"], sp["latitude"]),
        crs="EPSG:4326",
    ).rename_geometry("geom")
    gdf.index = pd.RangeIndex(len(gdf), name="id")
    return gdf


def trackintel_locations(sp: pd.DataFrame, epsilon: float = 20, num_samples: int = 2) -> pd.Series:
    """trackintel's location_id (Int64, <NA> = noise) for the rows of ``sp`` (aligned by position)."""
    ti_sp, _ = to_trackintel_sp(sp).as_staypoints.generate_locations(
        method="dbscan",
        epsilon=epsilon,
        num_samples=num_samples,
        distance_metric="haversine",
        agg_level="dataset",
    )
    return ti_sp["location_id"].sort_index()


def sklearn_labels(sp: pd.DataFrame, order: str = "lon_lat", epsilon_m: float = 20, min_samples: int = 2):
    """DBSCAN called directly, as trackintel does: radians of [lon, lat] (or [lat, lon])."""
    cols = ["longitude", "latitude"] if order == "lon_lat" else ["latitude", "longitude"]
    db = DBSCAN(eps=epsilon_m / 6371000, min_samples=min_samples, algorithm="ball_tree", metric="haversine")
    return db.fit_predict(np.deg2rad(sp[cols].to_numpy()))


def labels_of(located: pd.DataFrame) -> np.ndarray:
    return located["location_id"].fillna(-1).to_numpy(np.int64)


def points(coords: list[tuple[float, float]], user_id: int = 1) -> pd.DataFrame:
    """Staypoints at (lat, lon), one hour apart."""
    n = len(coords)
    start = T0 + pd.to_timedelta(np.arange(n) * 60, unit="min")
    return pd.DataFrame(
        {
            "user_id": np.full(n, user_id, dtype=np.int32),
            "started_at": start,
            "finished_at": start + pd.Timedelta(minutes=40),
            "latitude": [c[0] for c in coords],
            "longitude": [c[1] for c in coords],
        }
    )


def offset(north_m: float = 0.0, east_m: float = 0.0, origin: tuple[float, float] = BEIJING):
    """A point ``north_m`` metres north and ``east_m`` metres east of ``origin`` (exact on the sphere's
    meridian / parallel)."""
    lat, lon = origin
    return (
        lat + np.rad2deg(north_m / EARTH_RADIUS_M),
        lon + np.rad2deg(east_m / (EARTH_RADIUS_M * np.cos(np.deg2rad(lat)))),
    )


def stays(rows: list[tuple[int, str, str, int]]) -> pd.DataFrame:
    """Staypoints from (user, start, end, location) with times as 'HH:MM:SS' on 2008-10-23 (UTC)."""
    day = "2008-10-23 "
    return pd.DataFrame(
        {
            "user_id": np.array([r[0] for r in rows], dtype=np.int32),
            "started_at": pd.to_datetime([day + r[1] for r in rows], utc=True),
            "finished_at": pd.to_datetime([day + r[2] for r in rows], utc=True),
            "location_id": pd.array([r[3] for r in rows], dtype="Int64"),
        }
    )


def trackintel_merge(sp: pd.DataFrame) -> pd.DataFrame:
    """The reference merge call on staypoints with ``location_id`` (and optionally coordinates)."""
    gdf = gpd.GeoDataFrame(
        sp[["user_id", "started_at", "finished_at", "location_id"]].copy(),
        geometry=gpd.points_from_xy(np.zeros(len(sp)), np.zeros(len(sp))),
        crs="EPSG:4326",
    ).rename_geometry("geom")
    gdf.index = pd.RangeIndex(len(gdf), name="id")
    gdf = gdf[["user_id", "started_at", "finished_at", "geom", "location_id"]]
    return gdf.as_staypoints.merge_staypoints(
        triplegs=pd.DataFrame([]), max_time_gap="1min", agg={"location_id": "first"}
    )


def assert_same_merge(ours: pd.DataFrame, theirs: pd.DataFrame) -> None:
    assert len(ours) == len(theirs)
    np.testing.assert_array_equal(ours["user_id"].to_numpy(np.int64), theirs["user_id"].to_numpy(np.int64))
    for col in ("started_at", "finished_at"):
        np.testing.assert_array_equal(
            ours[col].to_numpy("datetime64[ns]"), theirs[col].dt.tz_convert("UTC").to_numpy("datetime64[ns]")
        )
    np.testing.assert_array_equal(
        ours["location_id"].to_numpy(np.int64), theirs["location_id"].to_numpy(np.int64)
    )


@pytest.fixture(scope="module")
def dbscan_input(sample_staypoints) -> pd.DataFrame:
    return reference_dbscan_input(*sample_staypoints)


# --------------------------------------------------------------------------- #
# generate_locations
# --------------------------------------------------------------------------- #


class TestGenerateLocations:
    @pytest.mark.parametrize("selection", ["reference_input", "all_staypoints"])
    def test_identical_to_sklearn_and_trackintel_on_sample(self, sample_staypoints, dbscan_input, selection):
        sp = dbscan_input if selection == "reference_input" else sample_staypoints[0]
        ours = generate_locations(sp, LocationConfig(epsilon_m=20, min_samples=2))
        labels = labels_of(ours)

        np.testing.assert_array_equal(labels, sklearn_labels(sp))
        ti_labels = trackintel_locations(sp)
        np.testing.assert_array_equal(labels, ti_labels.fillna(-1).to_numpy(np.int64))
        # identical noise set, and a non-trivial clustering
        assert set(np.flatnonzero(ours["location_id"].isna())) == set(np.flatnonzero(ti_labels.isna()))
        assert 0 < ours["location_id"].isna().sum() < len(sp)
        assert ours["location_id"].nunique() > 10

    def test_output_is_a_copy_with_nullable_ids(self, dbscan_input):
        before = dbscan_input.copy(deep=True)
        ours = generate_locations(dbscan_input)
        pd.testing.assert_frame_equal(dbscan_input, before)
        assert str(ours["location_id"].dtype) == "Int64"
        pd.testing.assert_frame_equal(ours.drop(columns="location_id"), dbscan_input)

    def test_locate_staypoints_keeps_exactly_the_clustered_rows(self, sample_staypoints, dbscan_input):
        located = locate_staypoints(*sample_staypoints, PreprocessConfig()).staypoints
        clustered = generate_locations(dbscan_input)
        clustered = clustered[clustered["location_id"].notna()].reset_index(drop=True)
        pd.testing.assert_frame_equal(located, clustered)

    def test_reference_coordinate_order_is_not_a_true_radius(self):
        """sklearn's haversine wants [lat, lon]; the reference feeds [lon, lat].

        With longitude read as latitude (cos(116.3 deg) = -0.44) a north-south offset shrinks to 0.44x and
        an east-west offset grows by 1/cos(40 deg) = 1.30x. So in Beijing, with eps = 20 m:

        * pair A, 30 m apart north-south (truly farther than 20 m): one location with "lon_lat" (seen as
          13.3 m), two noise points with "lat_lon";
        * pair B, 17 m apart east-west (truly within 20 m): noise with "lon_lat" (seen as 22.2 m), one
          location with "lat_lon".
        """
        pair_a = [BEIJING, offset(north_m=30)]
        far = (BEIJING[0] + 0.1, BEIJING[1])  # 11 km north: pair B never touches pair A
        pair_b = [far, offset(east_m=17, origin=far)]
        sp = points(pair_a + pair_b)

        true_m = haversine_distances(np.deg2rad([pair_a[0], pair_a[1]]))[0, 1] * EARTH_RADIUS_M
        assert true_m == pytest.approx(30.0)
        assert haversine_distances(np.deg2rad([pair_b[0], pair_b[1]]))[
            0, 1
        ] * EARTH_RADIUS_M == pytest.approx(17.0)

        reference = generate_locations(sp, LocationConfig(coordinate_order="lon_lat"))
        corrected = generate_locations(sp, LocationConfig(coordinate_order="lat_lon"))
        assert labels_of(reference).tolist() == [0, 0, -1, -1]
        assert labels_of(corrected).tolist() == [-1, -1, 0, 0]
        np.testing.assert_array_equal(labels_of(reference), sklearn_labels(sp, "lon_lat"))
        np.testing.assert_array_equal(labels_of(corrected), sklearn_labels(sp, "lat_lon"))
        np.testing.assert_array_equal(
            labels_of(reference), trackintel_locations(sp).fillna(-1).to_numpy(np.int64)
        )

    def test_min_samples_and_epsilon_are_used(self):
        """Three points 10 m apart in a row (east-west, so the reference reads them as 13 m apart):
        eps 20 m / min_samples 2 -> one location; min_samples 4 -> all noise; eps 5 m -> all noise."""
        sp = points([BEIJING, offset(east_m=10), offset(east_m=20)])
        assert labels_of(generate_locations(sp)).tolist() == [0, 0, 0]
        assert labels_of(generate_locations(sp, LocationConfig(min_samples=4))).tolist() == [-1, -1, -1]
        assert labels_of(generate_locations(sp, LocationConfig(epsilon_m=5))).tolist() == [-1, -1, -1]
        for eps, n in ((20, 2), (20, 4), (5, 2)):
            ours = labels_of(generate_locations(sp, LocationConfig(epsilon_m=eps, min_samples=n)))
            np.testing.assert_array_equal(ours, sklearn_labels(sp, epsilon_m=eps, min_samples=n))

    @pytest.mark.parametrize("seed", range(8))
    def test_smaller_ball_tree_leaf_gives_sklearns_labels_at_the_radius(self, seed):
        """nextloc's ball tree has smaller leaves than sklearn's default (faster in dense places); the labels
        must not change, even for points placed within a few ulps of eps from a dense blob (about half of
        them fall inside). The points differ in the first coordinate only, where the haversine distance is
        that difference."""
        rng = np.random.default_rng(seed)
        eps = 20 / EARTH_RADIUS_M
        blob = np.deg2rad(BEIJING[::-1]) + rng.normal(0, [1e-7, 3e-7, 1e-6, 3e-6][seed % 4], (300, 2))
        base = blob[rng.integers(0, len(blob), 150)]
        x = base[:, 0] + rng.choice([-eps, eps], len(base))
        x = x + rng.integers(-8, 9, len(base)) * np.spacing(x)  # -8..8 ulps around the radius
        coords = np.vstack([blob, np.column_stack([x, base[:, 1]])])[rng.permutation(len(blob) + len(base))]
        sp = points([(np.rad2deg(lat), np.rad2deg(lon)) for lon, lat in coords])
        for min_samples in (2, 3):
            cfg = LocationConfig(epsilon_m=20, min_samples=min_samples)
            np.testing.assert_array_equal(
                labels_of(generate_locations(sp, cfg)), sklearn_labels(sp, min_samples=min_samples)
            )

    def test_empty_input(self):
        out = generate_locations(points([]))
        assert len(out) == 0
        assert str(out["location_id"].dtype) == "Int64"


# --------------------------------------------------------------------------- #
# merge_staypoints
# --------------------------------------------------------------------------- #


class TestMergeStaypoints:
    @pytest.mark.filterwarnings(TI_CONCAT_EMPTY)
    def test_identical_to_trackintel_on_sample(self, sample_staypoints):
        located = locate_staypoints(*sample_staypoints, PreprocessConfig()).staypoints
        sp = located[["user_id", "started_at", "finished_at", "location_id"]]
        ours = merge_staypoints(sp, 1.0)
        assert_same_merge(ours, trackintel_merge(sp))
        assert len(ours) < len(sp)  # the sample does contain merges

    @pytest.mark.filterwarnings(TI_CONCAT_EMPTY)
    def test_inline_fixture(self):
        """Expected (user, start, end, location) after merging with a 1-minute gap:

        * user 1, location 5: 08:00-09:00, 09:00:30-10:00, 10:01-11:00 (gaps 30 s and 60 s) chain into one
          staypoint 08:00-11:00 with location 5;
        * user 1, 11:01:01-12:00 at location 5: gap 61 s > 1 min, stays apart;
        * user 1, 12:00:10-13:00 at location 6: different location, stays apart;
        * user 2, 13:00:20-14:00 at location 6: different user (and it is the next row), stays apart;
        * user 2, 14:00:30-15:00 at location 6: merges with its predecessor -> 13:00:20-15:00.
        """
        sp = stays(
            [
                (1, "08:00:00", "09:00:00", 5),
                (1, "09:00:30", "10:00:00", 5),
                (1, "10:01:00", "11:00:00", 5),
                (1, "11:01:01", "12:00:00", 5),
                (1, "12:00:10", "13:00:00", 6),
                (2, "13:00:20", "14:00:00", 6),
                (2, "14:00:30", "15:00:00", 6),
            ]
        )
        expected = stays(
            [
                (1, "08:00:00", "11:00:00", 5),
                (1, "11:01:01", "12:00:00", 5),
                (1, "12:00:10", "13:00:00", 6),
                (2, "13:00:20", "15:00:00", 6),
            ]
        )
        ours = merge_staypoints(sp, 1.0)
        pd.testing.assert_frame_equal(ours, expected)
        assert_same_merge(ours, trackintel_merge(sp))

    @pytest.mark.filterwarnings(TI_CONCAT_EMPTY)
    def test_unsorted_input_is_sorted_first(self):
        """Rows are ordered by (user, start) before merging, as trackintel does."""
        sp = stays(
            [(1, "10:00:30", "11:00:00", 5), (2, "08:00:00", "09:00:00", 5), (1, "09:00:00", "10:00:00", 5)]
        )
        ours = merge_staypoints(sp, 1.0)
        expected = stays([(1, "09:00:00", "11:00:00", 5), (2, "08:00:00", "09:00:00", 5)])
        pd.testing.assert_frame_equal(ours, expected)
        assert_same_merge(ours, trackintel_merge(sp))

    def test_gap_parameter(self):
        """Breaks of 61 s and 9 min: nothing merges with a 1-minute gap, everything with a 10-minute gap."""
        sp = stays(
            [(1, "08:00:00", "09:00:00", 5), (1, "09:01:01", "10:00:00", 5), (1, "10:09:00", "11:00:00", 5)]
        )
        assert len(merge_staypoints(sp, 1.0)) == 3
        merged = merge_staypoints(sp, 10.0)
        pd.testing.assert_frame_equal(merged, stays([(1, "08:00:00", "11:00:00", 5)]))

    def test_empty_input(self):
        assert len(merge_staypoints(stays([]), 1.0)) == 0


# --------------------------------------------------------------------------- #
# DBSCAN by spatial tiles (the Dask path): the same labels as sklearn
# --------------------------------------------------------------------------- #


class TestPartitionedDbscan:
    @pytest.mark.parametrize("order", ["lon_lat", "lat_lon"])
    @pytest.mark.parametrize("tiles", [1, 2, 5, 16])
    def test_identical_to_single_machine_on_sample(self, sample_staypoints, dbscan_input, order, tiles):
        """The GeoLife sample (reference input and every staypoint): the same ids as sklearn, and the
        same located frame, byte for byte after the reference's noise drop."""
        cfg = LocationConfig(coordinate_order=order)
        for sp in (dbscan_input, sample_staypoints[0]):
            single = generate_locations(sp, cfg)
            tiled = generate_locations(sp, cfg, tiles=tiles)
            np.testing.assert_array_equal(labels_of(tiled), sklearn_labels(sp, order))
            pd.testing.assert_frame_equal(tiled, single)

    def test_locate_staypoints_with_tiles_is_identical(self, sample_staypoints):
        single = locate_staypoints(*sample_staypoints, PreprocessConfig())
        tiled = locate_staypoints(*sample_staypoints, PreprocessConfig(), dbscan_tiles=4)
        pd.testing.assert_frame_equal(tiled.staypoints, single.staypoints)
        assert tiled.stats == single.stats

    def test_border_point_between_two_clusters_goes_to_the_first_cluster(self):
        """A non-core point within epsilon of core points of two clusters: sklearn gives it to the cluster
        whose first core row comes first; the tiles (which put it in another tile than one of them) agree."""
        cfg = LocationConfig(epsilon_m=20, min_samples=4, coordinate_order="lat_lon")  # a true 20 m radius
        a = [offset(0), offset(0.5), offset(1)]  # 1 m is core: 0, 0.5, 1 and the border point (19.7 m)
        b = [offset(40.5), offset(41), offset(41.5)]  # 40.5 m is core: its 3 and the border point (19.8 m)
        border = [offset(20.7)]  # neighbours: itself, 1 m and 40.5 m only -> 3 < 4, not core
        far = [offset(-200), offset(-199.5), offset(-199), offset(-198.5)]
        for rows, first in ((a + b + border + far, a), (b + a + border + far, b), (border + far + b + a, b)):
            sp = points(rows)
            single = labels_of(generate_locations(sp, cfg))
            at = {row: i for i, row in enumerate(rows)}
            assert single[at[border[0]]] == single[at[first[0]]] != -1
            assert single[at[a[0]]] != single[at[b[0]]]
            for tiles in (1, 2, 3, 6):
                np.testing.assert_array_equal(labels_of(generate_locations(sp, cfg, tiles=tiles)), single)

    @pytest.mark.parametrize("seed", range(6))
    def test_random_clusters_with_ambiguous_border_points(self, seed):
        """Dense and sparse blobs, duplicates and near-boundary points, every min_samples: equal labels."""
        rng = np.random.default_rng(seed)
        n = int(rng.integers(200, 2000))
        centres = np.deg2rad(np.array(BEIJING)) + rng.random((int(rng.integers(2, 15)), 2)) * 2e-5
        coords = centres[rng.integers(0, len(centres), n)] + rng.normal(
            0, [1e-7, 1e-6, 3e-6][seed % 3], (n, 2)
        )
        if seed % 2:
            coords = np.round(coords, 8)  # many exact duplicates
        eps = 20 / EARTH_RADIUS_M
        for min_samples in (1, 2, 3, 5):
            ref = DBSCAN(eps=eps, min_samples=min_samples, algorithm="ball_tree", metric="haversine")
            expected = ref.fit_predict(coords)
            for tiles in (2, 7, 40):
                np.testing.assert_array_equal(partitioned_dbscan(coords, eps, min_samples, tiles), expected)

    def test_halo_holds_every_neighbour_of_owned_points(self, dbscan_input):
        coords = np.deg2rad(dbscan_input[["longitude", "latitude"]].to_numpy())
        eps = 20 / EARTH_RADIUS_M
        tiles = make_tiles(coords, eps, 6)
        assert len(tiles) == 6
        owners = np.concatenate([t.index[t.owned] for t in tiles])
        assert sorted(owners) == list(range(len(coords)))  # each point owned once
        for tile in tiles:
            near = haversine_distances(coords[tile.index[tile.owned]], coords) <= eps
            assert set(np.flatnonzero(near.any(axis=0))) <= set(tile.index)

    def test_tiles_run_through_the_given_map(self, dbscan_input):
        calls = []

        def recording_map(fn, *iterables):
            items = list(zip(*iterables, strict=True))
            calls.append(len(items))
            return [fn(*args) for args in items]

        tiled = generate_locations(dbscan_input, tiles=3, map_fn=recording_map)
        assert calls == [3, 3]  # neighbour counts, then links
        np.testing.assert_array_equal(labels_of(tiled), sklearn_labels(dbscan_input))

    def test_points_across_90_degrees_stay_in_one_tile(self):
        """lon_lat feeds longitudes as the formula's latitude: across 90 degrees the strip bound fails
        (two points 180 degrees apart in that slot can be close), so no split, and still sklearn's labels."""
        rng = np.random.default_rng(7)
        x = np.deg2rad(90) + rng.normal(0, 2e-6, 500)
        coords = np.column_stack([x, np.deg2rad(30) + rng.normal(0, 2e-6, 500)])
        eps = 20 / EARTH_RADIUS_M
        assert len(make_tiles(coords, eps, 8)) == 1
        expected = DBSCAN(eps=eps, min_samples=3, algorithm="ball_tree", metric="haversine").fit_predict(
            coords
        )
        np.testing.assert_array_equal(partitioned_dbscan(coords, eps, 3, 8), expected)
        assert len(make_tiles(coords[x < np.deg2rad(90)], eps, 8)) == 8  # one side only: split
        across = np.deg2rad([[-179.99999, 30.0], [179.99999, 30.0], [-100.0, 30.0]])
        assert len(make_tiles(across, eps, 3)) == 1  # the antimeridian: 2 m apart, 360 degrees by value
        np.testing.assert_array_equal(partitioned_dbscan(across, eps, 2, 3), [0, 0, -1])

    def test_bad_tile_counts_and_empty_input(self):
        with pytest.raises(ValueError, match="n_tiles must be at least 1, got 0"):
            make_tiles(np.zeros((3, 2)), 1e-6, 0)
        assert len(partitioned_dbscan(np.zeros((0, 2)), 1e-6, 2, 4)) == 0
        one_place = np.zeros((5, 2))  # equal coordinates stay in one tile
        assert len(make_tiles(one_place, 1e-6, 4)) == 1
        np.testing.assert_array_equal(partitioned_dbscan(one_place, 1e-6, 2, 4), np.zeros(5, np.int64))


def test_merge_runs_joins_same_user_same_place_within_the_gap():
    minute = 60 * 10**9
    user = np.array([1, 1, 1, 1, 2, 2])
    place = np.array([5, 5, 5, 6, 6, 6])
    start = np.array([0, 11, 30, 40, 50, 61]) * minute
    end = np.array([10, 20, 35, 45, 60, 70]) * minute
    first, last = merge_runs(user, place, start, end, 1.0)
    # 0+1 (gap 1 min), 2 alone (gap 10), 3 alone (another place), 4 (another user) + 5 (gap 1)
    assert first.tolist() == [True, False, True, True, True, False]
    assert last.tolist() == [False, True, True, True, False, True]
    empty = merge_runs(*(np.zeros(0, dtype=np.int64),) * 4, 1.0)
    assert [len(a) for a in empty] == [0, 0]


def test_activity_mask_is_create_activity_flags_rule():
    start = pd.Series(
        pd.to_datetime(["2008-01-01 00:00:00", "2008-01-01 00:00:00", "2008-01-01 00:00:00", None], utc=True)
    )
    end = pd.Series(
        pd.to_datetime(
            ["2008-01-01 00:25:00", "2008-01-01 00:25:00.000000001", None, None], utc=True, format="ISO8601"
        )
    )
    frame = pd.DataFrame({"started_at": start, "finished_at": end})
    expected = create_activity_flag(frame, 25.0)["is_activity"].to_numpy()
    assert expected.tolist() == [False, True, False, False]
    assert activity_mask(to_ns(start), to_ns(end), 25.0).tolist() == expected.tolist()
    with pytest.raises(TypeError, match="tz-aware"):
        to_ns(pd.Series(pd.to_datetime(["2008-01-01"])))
