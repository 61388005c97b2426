"""The compiled loops of staypoint generation (:mod:`nextloc.preprocessing.staypoints`): numba kernels, imported when
positionfixes are turned into staypoints, so that reading visits never pays for numba's import."""

from __future__ import annotations

import numba
import numpy as np

from nextloc.io.visits import EARTH_RADIUS_M


@numba.njit(cache=True, nogil=True)
def first_occurrences(t, lat, lon, elev):  # pragma: no cover - compiled
    n = len(t)
    keep = np.ones(n, dtype=np.bool_)
    i = 0
    while i < n:
        j = i + 1
        while j < n and t[j] == t[i]:
            j += 1
        # [i, j) share a timestamp: keep the first occurrence of each distinct row (runs are tiny)
        for a in range(i + 1, j):
            for b in range(i, a):
                if keep[b] and _same(lat[a], lat[b]) and _same(lon[a], lon[b]) and _same(elev[a], elev[b]):
                    keep[a] = False
                    break
        i = j
    return keep


@numba.njit(cache=True, inline="always")
def _same(a, b):  # pragma: no cover - compiled
    return a == b or (np.isnan(a) and np.isnan(b))


@numba.njit(cache=True, nogil=True)
def _haversine(lon_1, lat_1, lon_2, lat_2):  # pragma: no cover - compiled
    # Same operations, in the same order, as trackintel.geogr.point_haversine_dist(float_flag=True).
    d2r = np.pi / 180.0
    lon_1 = lon_1 * d2r
    lat_1 = lat_1 * d2r
    lon_2 = lon_2 * d2r
    lat_2 = lat_2 * d2r
    cos_lat2 = np.cos(lat_2)
    cos_lat1 = np.cos(lat_1)
    cos_lat_d = np.cos(lat_1 - lat_2)
    cos_lon_d = np.cos(lon_1 - lon_2)
    return EARTH_RADIUS_M * np.arccos(cos_lat_d - cos_lat1 * cos_lat2 * (1 - cos_lon_d))


@numba.njit(cache=True, nogil=True)
def sliding(t, lon, lat, dist_threshold, time_threshold, gap_threshold, include_last):  # pragma: no cover
    """Indices (start, geometry end exclusive, finish) of each staypoint; trackintel's loop, compiled."""
    n = len(t)
    starts = np.empty(n, dtype=np.int64)
    geom_ends = np.empty(n, dtype=np.int64)
    finishes = np.empty(n, dtype=np.int64)
    k = 0
    start = 0
    curr = 0
    for curr in range(1, n):
        if t[curr] - t[curr - 1] > gap_threshold:
            start = curr
            continue
        if _haversine(lon[start], lat[start], lon[curr], lat[curr]) >= dist_threshold:
            if t[curr] - t[start] >= time_threshold:
                starts[k] = start
                geom_ends[k] = curr
                finishes[k] = curr
                k += 1
            start = curr
    if include_last and n > 0 and t[curr] - t[start] >= time_threshold:
        starts[k] = start
        geom_ends[k] = n
        finishes[k] = curr
        k += 1
    return starts[:k], geom_ends[:k], finishes[:k]


@numba.njit(cache=True, nogil=True)
def tripleg_extent(t, lon, lat, in_sp, gap_threshold):  # pragma: no cover - compiled
    """(first start, last end) in ns of the user's valid ``between_staypoints`` triplegs, or (-1, -1).

    A tripleg is a run of fixes outside staypoints, broken at gaps > ``gap_threshold``; trackintel keeps
    it only if it has >= 2 fixes and a valid LineString, i.e. at least two distinct points.
    """
    n = len(t)
    first = -1
    last = -1
    i = 0
    while i < n:
        if in_sp[i]:
            i += 1
            continue
        j = i + 1
        while j < n and not in_sp[j] and t[j] - t[j - 1] <= gap_threshold:
            j += 1
        distinct = False
        for m in range(i + 1, j):
            if lon[m] != lon[i] or lat[m] != lat[i]:
                distinct = True
                break
        if j - i >= 2 and distinct:
            if first < 0:
                first = t[i]
            last = t[j - 1]
        i = j
    return first, last
