"""Dataset-level DBSCAN locations and staypoint merging (trackintel semantics).

DBSCAN runs on one machine (sklearn, the default) or by spatial tiles (:func:`partitioned_dbscan`): the
staypoints are cut into strips along the first fed coordinate, each strip is clustered with an
epsilon-wide halo of its neighbours' points, and the strips' cluster ids are merged (union-find over the
core points the halos share). The labels are sklearn's, id for id (the rule is in
:func:`partitioned_dbscan`). The tiles are independent, so any ``map`` can run them: the builtin one, or a
Dask client's (the Dask runner, ``runtime/runners.py``); this module never imports Dask.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from nextloc.config import LocationConfig
from nextloc.io.visits import EARTH_RADIUS_M
from nextloc.preprocessing.staypoints import to_ns

logger = logging.getLogger(__name__)


MapFn = Callable[..., Iterable[Any]]  # map(fn, *iterables), like the builtin
# Ball-tree leaf size of both paths. trackintel leaves sklearn's default (30); 10 gives the same neighbour
# sets (the points within eps) and labels, and computes fewer haversines where places are dense: GeoLife's
# 28,871 activity staypoints cluster in 0.63 s instead of 1.53 s. A leaf size only decides which pairs a
# node's bounds settle and which are measured one by one; the two can disagree only for a pair whose
# distance is within a few ulps of eps (tested against sklearn's default with points placed at eps).
_LEAF_SIZE = 10


def generate_locations(
    staypoints: pd.DataFrame,
    config: LocationConfig | None = None,
    tiles: int = 0,
    map_fn: MapFn | None = None,
) -> pd.DataFrame:
    """Cluster all users' staypoints jointly into locations with haversine DBSCAN.

    Reproduces trackintel ``generate_locations(method="dbscan", distance_metric="haversine",
    agg_level="dataset")``: ``DBSCAN(eps=epsilon_m / 6371000, min_samples, algorithm="ball_tree",
    metric="haversine")`` fitted on the staypoints in the given order (with a smaller ball-tree leaf, the
    same labels: see ``_LEAF_SIZE``). With the reference
    ``coordinate_order="lon_lat"`` the radians are fed as ``[lon, lat]`` (sklearn expects ``[lat, lon]``),
    so the radius is really about 45 m north-south and 15 m east-west in Beijing.

    Args:
        staypoints: ``latitude`` and ``longitude`` columns (degrees), ordered by user then start time.
        config: ``epsilon_m``, ``min_samples`` and ``coordinate_order``.
        tiles: 0 (default) runs sklearn's DBSCAN on one machine; ``n > 0`` runs
            :func:`partitioned_dbscan` with ``n`` spatial tiles (the same labels).
        map_fn: runs the tiles (default: the builtin ``map``); e.g. a Dask client's map.

    Returns:
        A copy with ``location_id`` (nullable Int64; ``<NA>`` marks noise).

    Examples:
        >>> sp = generate_locations(sp, LocationConfig(epsilon_m=20, min_samples=2))  # doctest: +SKIP
    """
    cfg = config or LocationConfig()
    sp = staypoints.copy()
    if len(sp) == 0:
        sp["location_id"] = pd.array([], dtype="Int64")
        return sp
    lat = sp["latitude"].to_numpy(np.float64)
    lon = sp["longitude"].to_numpy(np.float64)
    coords = np.column_stack([lon, lat] if cfg.coordinate_order == "lon_lat" else [lat, lon])
    eps = cfg.epsilon_m / EARTH_RADIUS_M
    if tiles > 0:
        labels = partitioned_dbscan(np.deg2rad(coords), eps, cfg.min_samples, tiles, map_fn)
    else:
        from sklearn.cluster import DBSCAN  # sklearn: clustering only (answering merges staypoints, no more)

        db = DBSCAN(
            eps=eps,
            min_samples=cfg.min_samples,
            algorithm="ball_tree",
            metric="haversine",
            leaf_size=_LEAF_SIZE,
        )
        labels = db.fit_predict(np.deg2rad(coords))
    sp["location_id"] = pd.array(np.where(labels < 0, pd.NA, labels), dtype="Int64")
    logger.info(
        "DBSCAN: %d staypoints -> %d locations, %d noise", len(sp), labels.max() + 1, int((labels < 0).sum())
    )
    return sp


@dataclass(frozen=True)
class Tile:
    """One spatial strip: its points (owned ones first counted, halo ones only looked at).

    Attributes:
        index: global row numbers of the strip's points and its halo, ascending.
        coords: their coordinates in radians, as fed to the haversine metric.
        owned: True for the strip's own points (each point is owned by exactly one tile).
    """

    index: np.ndarray
    coords: np.ndarray
    owned: np.ndarray


@dataclass(frozen=True)
class TileLinks:
    """What one tile knows about the clusters, in global row numbers.

    Attributes:
        core: core points of the tile (owned and halo) that are linked to an owned core point.
        component: their connected component inside the tile (0..n-1, local to the tile).
        border: owned non-core points, one row per core neighbour (``border_core``).
        border_core: that core neighbour.
    """

    core: np.ndarray
    component: np.ndarray
    border: np.ndarray
    border_core: np.ndarray


def make_tiles(coords: np.ndarray, eps: float, n_tiles: int) -> list[Tile]:
    """Cut points into ``n_tiles`` strips of about equal counts along the first coordinate, with halos.

    The haversine distance is never smaller than the difference of the first coordinates (it is the
    latitude to the formula) when their cosines have the same sign, so every neighbour within ``eps`` of
    an owned point lies in the strip or its halo, which reaches ``eps`` (plus a rounding margin) beyond
    each edge. With the reference ``lon_lat`` order the first coordinate is a longitude, which may pass
    90 degrees; when the points lie on both sides of +-90 degrees, or span more than 180 degrees (across
    the antimeridian), that bound fails, and they stay in one tile (exact, not split; logged). Equal first coordinates stay in one strip, so there may be fewer
    tiles than asked.

    Args:
        coords: ``(n, 2)`` radians in the order fed to the metric.
        eps: the DBSCAN radius in radians.
        n_tiles: how many strips to aim for (at least 1).

    Raises:
        ValueError: if ``n_tiles`` is below 1 or ``coords`` is not ``(n, 2)``.
    """
    if n_tiles < 1:
        raise ValueError(f"n_tiles must be at least 1, got {n_tiles}")
    if coords.ndim != 2 or coords.shape[1] != 2:
        raise ValueError(f"coords must have shape (n, 2), got {coords.shape}")
    x = coords[:, 0]
    cos = np.cos(x)
    wraps = len(x) > 0 and float(x.max() - x.min()) > np.pi  # e.g. longitudes across the antimeridian
    if n_tiles > 1 and (((cos < 0).any() and (cos > 0).any()) or wraps):
        logger.warning(
            "DBSCAN tiles: first coordinates across +-90 degrees or spanning over 180; one tile, not %d",
            n_tiles,
        )
        n_tiles = 1
    edges = np.unique(np.quantile(x, np.linspace(0, 1, n_tiles + 1)[1:-1])) if len(x) else np.array([])
    strip = np.searchsorted(edges, x, side="right")  # strip t owns edges[t-1] <= x < edges[t]
    halo = eps * (1 + 1e-9) + 1e-15
    lows = np.r_[-np.inf, edges]
    highs = np.r_[edges, np.inf]
    tiles = []
    for t in range(len(edges) + 1):
        near = (x >= lows[t] - halo) & (x < highs[t] + halo)
        index = np.flatnonzero(near)
        if not (strip[index] == t).any():
            continue
        tiles.append(Tile(index, coords[index], strip[index] == t))
    return tiles


def tile_core_counts(tile: Tile, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Neighbour counts (itself included) of the tile's owned points: ``(global rows, counts)``."""
    from sklearn.neighbors import BallTree  # sklearn: clustering only

    tree = BallTree(tile.coords, leaf_size=_LEAF_SIZE, metric="haversine")
    counts = tree.query_radius(tile.coords[tile.owned], eps, count_only=True)
    return tile.index[tile.owned], counts


def tile_links(tile: Tile, is_core: np.ndarray, eps: float) -> TileLinks:
    """Connected components of the tile's core points and the core neighbours of its owned border points.

    Args:
        tile: the tile.
        is_core: for each of ``tile.index``, whether it is a core point (from every tile's counts).
        eps: the DBSCAN radius in radians.
    """
    from scipy.sparse import coo_matrix  # scipy, sklearn: clustering only
    from scipy.sparse.csgraph import connected_components
    from sklearn.neighbors import BallTree

    empty = np.array([], dtype=np.int64)
    core_local = np.flatnonzero(is_core)
    if len(core_local) == 0:
        return TileLinks(empty, empty, empty, empty)
    tree = BallTree(tile.coords[core_local], leaf_size=_LEAF_SIZE, metric="haversine")
    owned_core = np.flatnonzero(tile.owned[core_local])
    neighbours = tree.query_radius(tile.coords[core_local[owned_core]], eps) if len(owned_core) else []
    rows = np.repeat(owned_core, [len(nb) for nb in neighbours])
    cols = np.concatenate(neighbours) if len(neighbours) else empty
    graph = coo_matrix((np.ones(len(rows), np.int8), (rows, cols)), shape=(len(core_local),) * 2)
    _, component = connected_components(graph, directed=False)
    linked = np.zeros(len(core_local), dtype=bool)
    linked[rows] = True
    linked[cols] = True
    border_local = np.flatnonzero(tile.owned & ~is_core)
    near = tree.query_radius(tile.coords[border_local], eps) if len(border_local) else []
    border = np.repeat(tile.index[border_local], [len(nb) for nb in near])
    border_core = tile.index[core_local[np.concatenate(near)]] if len(border) else empty
    return TileLinks(
        tile.index[core_local[linked]].astype(np.int64),
        component[linked].astype(np.int64),
        border.astype(np.int64),
        border_core.astype(np.int64),
    )


def merge_tile_links(n: int, is_core: np.ndarray, links: list[TileLinks]) -> np.ndarray:
    """Merge the tiles' components into sklearn's DBSCAN labels (``-1`` noise).

    Components of different tiles sharing a core point are one cluster (union-find, done as connected
    components of a graph whose nodes are the tiles' components). Clusters are numbered by their
    smallest core row, and a border point takes the smallest label among its core neighbours' clusters:
    exactly the order in which sklearn's ``dbscan_inner`` (a depth-first search seeded by the rows in
    order, a border point labelled by the first cluster that reaches it) gives them.
    """
    from scipy.sparse import coo_matrix  # scipy: clustering only
    from scipy.sparse.csgraph import connected_components

    labels = np.full(n, -1, dtype=np.int64)
    offsets = np.cumsum([0] + [int(lk.component.max()) + 1 if len(lk.component) else 0 for lk in links])
    point = np.concatenate([lk.core for lk in links] + [np.array([], np.int64)])
    node = np.concatenate([lk.component + off for lk, off in zip(links, offsets, strict=False)] + [point[:0]])
    if len(point) == 0:
        return labels
    order = np.lexsort((node, point))
    point, node = point[order], node[order]
    same = point[1:] == point[:-1]
    n_nodes = int(offsets[-1])
    graph = coo_matrix(
        (np.ones(int(same.sum()), np.int8), (node[:-1][same], node[1:][same])), shape=(n_nodes, n_nodes)
    )
    _, cluster_of_node = connected_components(graph, directed=False)
    cluster = cluster_of_node[node]
    missing = np.flatnonzero(is_core & ~np.isin(np.arange(n), point))
    if len(missing):
        raise ValueError(f"{len(missing)} core points are in no tile's links (first: row {missing[0]})")
    first_row = np.full(cluster_of_node.max() + 1, n, dtype=np.int64)
    np.minimum.at(first_row, cluster, point)
    used = np.flatnonzero(first_row < n)
    rank = np.full(len(first_row), -1, dtype=np.int64)
    rank[used[np.argsort(first_row[used], kind="stable")]] = np.arange(len(used))
    labels[point] = rank[cluster]
    border = np.concatenate([lk.border for lk in links] + [point[:0]])
    border_core = np.concatenate([lk.border_core for lk in links] + [point[:0]])
    if len(border):
        best = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(best, border, labels[border_core])
        labels[border] = best[border]
    return labels


def partitioned_dbscan(
    coords: np.ndarray, eps: float, min_samples: int, n_tiles: int, map_fn: MapFn | None = None
) -> np.ndarray:
    """Haversine DBSCAN by spatial tiles; the labels equal ``DBSCAN(...).fit_predict(coords)``.

    Two passes over the tiles (each tile independent, so ``map_fn`` may run them anywhere): neighbour
    counts of owned points give the core points; then each tile links its core points into components
    and lists the core neighbours of its border points; :func:`merge_tile_links` merges the ids.

    Args:
        coords: ``(n, 2)`` radians in the order fed to the metric (sklearn's ``[lat, lon]`` slots).
        eps: radius in radians.
        min_samples: neighbours (the point included) that make a core point.
        n_tiles: strips to aim for (see :func:`make_tiles`).
        map_fn: ``map``-like runner of the tiles (default: the builtin ``map``).

    Returns:
        One label per row, ``-1`` for noise.
    """
    run = map_fn or map
    n = len(coords)
    tiles = make_tiles(coords, eps, n_tiles)
    is_core = np.zeros(n, dtype=bool)
    for rows, counts in run(partial(tile_core_counts, eps=eps), tiles):
        is_core[rows] = counts >= min_samples
    links = list(run(partial(tile_links, eps=eps), tiles, [is_core[t.index] for t in tiles]))
    labels = merge_tile_links(n, is_core, links)
    logger.info(
        "partitioned DBSCAN: %d points in %d tiles (%d with halos) -> %d clusters",
        n,
        len(tiles),
        sum(len(t.index) for t in tiles),
        labels.max() + 1 if n else 0,
    )
    return labels


def merge_staypoints(staypoints: pd.DataFrame, max_time_gap_min: float = 1.0) -> pd.DataFrame:
    """Merge consecutive staypoints of a user at the same location separated by at most a small gap.

    trackintel ``merge_staypoints(triplegs=<empty>, max_time_gap, agg={"location_id": "first"})``: rows
    sorted by (user, start); row *i* joins row *i+1* when both have the same user and location and
    ``started_at[i+1] - finished_at[i] <= max_time_gap``; chains merge into one row with the first start,
    the last end and the first location.

    Args:
        staypoints: ``user_id``, ``started_at``, ``finished_at``, ``location_id`` (no noise rows).
        max_time_gap_min: the gap in minutes.

    Returns:
        The merged staypoints (columns of the first row of each run, ``finished_at`` of the last), sorted.
    """
    sp = staypoints.sort_values(["user_id", "started_at"], kind="stable").reset_index(drop=True)
    if len(sp) == 0:
        return sp
    first_of_run, last_of_run = merge_runs(
        sp["user_id"].to_numpy(),
        sp["location_id"].to_numpy(),
        to_ns(sp["started_at"]),
        to_ns(sp["finished_at"]),
        max_time_gap_min,
    )
    merged = sp.loc[first_of_run].reset_index(drop=True)
    merged["finished_at"] = sp.loc[last_of_run, "finished_at"].to_numpy()
    logger.info("merge: %d -> %d staypoints", len(sp), len(merged))
    return merged


def merge_runs(
    user: np.ndarray,
    location: np.ndarray,
    started_ns: np.ndarray,
    finished_ns: np.ndarray,
    max_time_gap_min: float,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`merge_staypoints`' rule on arrays sorted by (user, start): which rows start a merged run and
    which end one (boolean ``(N,)`` each; the merged stay has the first row's start and location and the
    last row's end)."""
    if not len(user):
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    gap_ns = np.asarray(started_ns)[1:] - np.asarray(finished_ns)[:-1]
    same = (user[1:] == user[:-1]) & (location[1:] == location[:-1])
    joins_next = same & (gap_ns <= round(max_time_gap_min * 60e9))
    return np.r_[True, ~joins_next], np.r_[~joins_next, True]
