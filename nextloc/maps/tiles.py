"""Basemaps under the PNG maps: web map tiles where they can be had, cached on disk; without them, none.

Decisions:

* **contextily** fetches and mosaics the tiles (:func:`contextily.bounds2img`) and warps the Web Mercator
  mosaic into the panel's own projection (:func:`contextily.warp_tiles`, through rasterio). The panels keep
  their local equirectangular metres or kilometres (:func:`nextloc.maps.png.project`, which PROJ spells as
  :func:`panel_crs`), so every marker, label and axis stays as it was drawn without tiles.
  ``contextily.add_basemap`` is not used: its attribution calls pyplot's ``draw()``, which would open a
  figure in pyplot's registry; the image and the attribution are drawn here on the panel's own axes.
* **All or nothing, fetched before anything is drawn.** Every panel's tiles are fetched and warped first;
  one failure (offline, the server unreachable or slow, an HTTP error, a bad setting, contextily missing)
  draws no basemap on any panel and logs one warning naming why, so the PNG is then the plain axes,
  byte for byte what it is with the tiles turned off.
* **Where tiles come from**: ``$NEXTLOC_MAP_TILES``: unset or empty, OpenStreetMap's standard tiles; a URL
  template with ``{z}``, ``{x}`` and ``{y}``; the name of an xyzservices provider (``CartoDB.Positron``);
  ``off``: no basemap and no request. Requests go one at a time, carry a User-Agent naming nextloc (as
  OpenStreetMap's tile usage policy asks) and give up after :data:`TIMEOUT_S` seconds without an answer.
* **Cached on disk**: contextily keeps every tile it fetched (joblib's cache) under ``$NEXTLOC_TILE_CACHE``,
  by default ``$XDG_CACHE_HOME/nextloc/tiles`` (``~/.cache/nextloc/tiles``); a cached tile is never asked
  for again, so a map drawn once draws again offline, to the same bytes. Deleting the folder is safe.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["TILES_ENV", "TILE_CACHE_ENV", "TileSource", "add_basemaps", "configured", "panel_crs"]

TILES_ENV = "NEXTLOC_MAP_TILES"
TILE_CACHE_ENV = "NEXTLOC_TILE_CACHE"
OFF = frozenset({"off", "none", "no", "false", "0"})
TIMEOUT_S = 2.0  # connect and read, per request: an offline machine waits this long at most per map
MAX_ZOOM = 19  # a source that does not say its own
USER_AGENT = "nextloc/0.1 (next-location PNG maps; python-requests via contextily)"
EARTH_RADIUS_M = 6_371_008.8  # nextloc.maps.png's sphere
WEB_MERCATOR_HALF_M = math.pi * 6_378_137.0  # EPSG:3857 spans twice this east to west
ATTRIBUTION = {"fontsize": 6, "color": "0.2", "zorder": 8, "in_layout": False}
ATTRIBUTION_BOX = {"facecolor": "white", "alpha": 0.75, "edgecolor": "none", "pad": 1.0}


@dataclass(frozen=True)
class TileSource:
    """Where the tiles come from and where they are kept.

    Attributes:
        provider: an :class:`xyzservices.TileProvider` (``url``, ``name``, ``attribution``, optional
            ``max_zoom``).
        cache_dir: the folder of the tile cache.
        timeout_s: connect and read timeout of each request.
    """

    provider: Mapping[str, Any]
    cache_dir: Path
    timeout_s: float = TIMEOUT_S

    @property
    def name(self) -> str:
        return str(self.provider["name"])

    @property
    def attribution(self) -> str:
        return str(self.provider.get("attribution") or "")

    @classmethod
    def from_url(cls, url: str, cache_dir: Path, timeout_s: float = TIMEOUT_S) -> TileSource:
        """A source from a URL template (``{z}``, ``{x}``, ``{y}``), credited to its host."""
        from xyzservices import TileProvider

        host = urlsplit(url).netloc or url
        provider = TileProvider(name=host, url=url, attribution=f"map tiles: {host}")
        return cls(provider, Path(cache_dir), timeout_s)


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$NEXTLOC_TILE_CACHE``, else ``$XDG_CACHE_HOME/nextloc/tiles``, else ``~/.cache/nextloc/tiles``."""
    env = os.environ if environ is None else environ
    if env.get(TILE_CACHE_ENV):
        return Path(env[TILE_CACHE_ENV]).expanduser()
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "nextloc" / "tiles"


def configured(environ: Mapping[str, str] | None = None) -> TileSource | None:
    """The tile source ``$NEXTLOC_MAP_TILES`` names (see the module docstring); None when it is ``off``.

    Raises:
        ValueError: not a URL template and no xyzservices provider of that name.
    """
    from xyzservices import providers

    env = os.environ if environ is None else environ
    setting = env.get(TILES_ENV, "").strip()
    if setting.lower() in OFF:
        return None
    cache = default_cache_dir(env)
    if not setting:
        return TileSource(providers.OpenStreetMap.Mapnik, cache)
    if "{z}" in setting:
        return TileSource.from_url(setting, cache)
    try:
        return TileSource(providers.query_name(setting), cache)
    except ValueError:
        raise ValueError(
            f"${TILES_ENV}={setting!r} is neither a URL template with {{z}}/{{x}}/{{y}} nor an xyzservices "
            f"provider (such as OpenStreetMap.Mapnik), nor 'off'"
        ) from None


def panel_crs(origin: tuple[float, float], unit_m: float) -> str:
    """The PROJ string of a panel's axes: equirectangular at ``origin`` (``(lat, lon)``) on nextloc's sphere,
    in metres or kilometres (:func:`nextloc.maps.png.project`)."""
    lat, lon = origin
    unit = "km" if unit_m == 1000 else "m"
    return (
        f"+proj=eqc +lat_ts={lat!r} +lat_0={lat!r} +lon_0={lon!r} +x_0=0 +y_0=0 "
        f"+R={EARTH_RADIUS_M!r} +units={unit} +no_defs"
    )


def add_basemaps(
    axes: Sequence[Any],
    views: Sequence[tuple[tuple[float, float], float]],
    tiles: TileSource | None | Literal["env"],
    what: object,
) -> list[Any]:
    """Draw a basemap under each of ``axes`` (their limits final, in the projection of its ``(origin,
    unit_m)`` in ``views``), from ``tiles`` (``"env"``: :func:`configured`); returns each panel's
    attribution text, or ``[]`` when no basemap was drawn (off, or a warning naming ``what`` and why)."""
    try:
        source = configured() if tiles == "env" else tiles
        if source is None:
            return []
        images = [
            _fetch(source, panel_crs(*view), ax.get_xlim(), ax.get_ylim())
            for ax, view in zip(axes, views, strict=True)
        ]
    except Exception as err:  # offline, unreachable, slow, HTTP errors, a bad setting: the plain axes
        logger.warning("%s: no basemap (%s: %s); drawn on plain axes", what, type(err).__name__, err)
        return []
    marks = []
    for ax, (image, extent) in zip(axes, images, strict=True):
        xlim, ylim = ax.get_xlim(), ax.get_ylim()
        shown = ax.imshow(image, extent=extent, interpolation="bilinear", zorder=0, aspect=ax.get_aspect())
        shown.set_in_layout(False)
        ax.set_xlim(xlim)  # imshow frames the whole warped mosaic
        ax.set_ylim(ylim)
        text = ax.text(
            0.995, 0.005, source.attribution or source.name, transform=ax.transAxes, ha="right", va="bottom"
        )
        text.set(bbox=ATTRIBUTION_BOX, **ATTRIBUTION)
        marks.append(text)
    logger.info("%s: basemap from %s (cache %s)", what, source.name, source.cache_dir)
    return marks


def _fetch(
    source: TileSource, crs: str, xlim: tuple[float, float], ylim: tuple[float, float]
) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """The tiles under the view ``xlim`` x ``ylim`` of ``crs``, warped into it: the image and its extent
    (``left, right, bottom, top``). Zoom: 2 to 4 tiles across the view, at most the source's."""
    import contextily
    from rasterio.warp import transform_bounds

    west, south, east, north = transform_bounds(crs, "EPSG:3857", xlim[0], ylim[0], xlim[1], ylim[1])
    across = 2 * WEB_MERCATOR_HALF_M / max(east - west, 1e-9)  # views across the world
    zoom = int(np.clip(math.ceil(math.log2(2 * across)), 0, source.provider.get("max_zoom", MAX_ZOOM)))
    source.cache_dir.mkdir(parents=True, exist_ok=True)
    contextily.set_cache_dir(str(source.cache_dir))
    image, extent = contextily.bounds2img(
        west,
        south,
        east,
        north,
        zoom=zoom,
        source=source.provider,
        headers={"user-agent": USER_AGENT},
        n_connections=1,
        use_cache=True,
        timeout=source.timeout_s,
    )
    return contextily.warp_tiles(image, extent, t_crs=crs)
