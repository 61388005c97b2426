"""Basemaps under the PNG maps: web map tiles where they can be had, cached on disk; without them, none.

Decisions:

* **Tiles fetched and kept here, as the server's image files; warped by contextily.** The tiles under a
  view (mercantile's indices at the zoom of 2 to 4 tiles across) are asked with requests, kept on disk as
  the bytes the server sent (PNG, or JPEG where a source serves JPEG), read back with Pillow and stitched
  into one Web Mercator image (its extent: :func:`mercantile.xy_bounds`). :func:`contextily.warp_tiles`
  (through rasterio) warps it into the panel's own projection: the panels keep their local equirectangular
  metres or kilometres (:func:`nextloc.maps.png.project`, which PROJ spells as :func:`panel_crs`), so every
  marker, label and axis stays as it was drawn without tiles. contextily's own fetching and cache
  (``bounds2img``: joblib pickles every tile and unpickles it the next time) are not used: nothing is
  unpickled. Neither is ``contextily.add_basemap``: its attribution calls pyplot's ``draw()``, which would
  open a figure in pyplot's registry; the image and the attribution are drawn here on the panel's own axes.
* **All or nothing, fetched before anything is drawn.** Every panel's tiles are fetched and warped first;
  one failure (offline, the server unreachable or slow, an HTTP error, not an image, a bad setting, the
  cache not writable) draws no basemap on any panel and logs one warning naming why, so the PNG is then the
  plain axes, byte for byte what it is with the tiles turned off.
* **Where tiles come from**: ``$NEXTLOC_MAP_TILES``: unset or empty, OpenStreetMap's standard tiles; a URL
  template with ``{z}``, ``{x}`` and ``{y}``; the name of an xyzservices provider (``CartoDB.Positron``);
  ``off``: no basemap and no request. Requests go one at a time over one connection, carry a User-Agent
  naming nextloc (as OpenStreetMap's tile usage policy asks) and give up after :data:`TIMEOUT_S` seconds
  without an answer; all of a PNG's tiles must have come within :data:`DEADLINE_S` seconds, so a slow
  server cannot stall a map for long.
* **Cached on disk**: every tile fetched is kept as ``<cache>/<source key>/<z>/<x>/<y>.png`` (``.jpg`` for
  JPEG), written atomically (:func:`nextloc.atomic.atomic_path`), under ``$NEXTLOC_TILE_CACHE``, by default
  ``$XDG_CACHE_HOME/nextloc/tiles`` (``~/.cache/nextloc/tiles``). The source key (:attr:`TileSource.key`)
  is the source's name and a hash of its URL, so two sources never mix. A cached tile is never asked for
  again, so a map drawn once draws again offline, to the same bytes; one that no longer reads as an image
  is asked for again. Deleting the folder, or any file in it, is safe.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np

from nextloc.atomic import atomic_path

logger = logging.getLogger(__name__)

__all__ = ["TILES_ENV", "TILE_CACHE_ENV", "TileSource", "add_basemaps", "configured", "panel_crs"]

TILES_ENV = "NEXTLOC_MAP_TILES"
TILE_CACHE_ENV = "NEXTLOC_TILE_CACHE"
OFF = frozenset({"off", "none", "no", "false", "0"})
TIMEOUT_S = 2.0  # connect and read, per request: an offline machine waits this long at most per map
DEADLINE_S = 5.0  # all of a PNG's tiles, fetched one after another
MAX_TILE_BYTES = 4 << 20  # a tile is some 10-100 KB: beyond this the answer is no tile
MAX_ZOOM = 19  # a source that does not say its own
USER_AGENT = "nextloc/0.1 (next-location PNG maps; python-requests)"
EARTH_RADIUS_M = 6_371_008.8  # nextloc.maps.png's sphere
SUFFIXES = {"PNG": ".png", "JPEG": ".jpg", "MPO": ".jpg"}  # a tile's file by its format; else .<format>
ATTRIBUTION = {"fontsize": 6, "color": "0.2", "zorder": 8, "in_layout": False}
ATTRIBUTION_BOX = {"facecolor": "white", "alpha": 0.75, "edgecolor": "none", "pad": 1.0}


@dataclass(frozen=True)
class TileSource:
    """Where the tiles come from and where they are kept.

    Attributes:
        provider: an :class:`xyzservices.TileProvider` (``url``, ``name``, ``attribution``, optional
            ``max_zoom``).
        cache_dir: the folder of the tile cache (each source in its own :attr:`key` folder).
        timeout_s: connect and read timeout of each request.
        deadline_s: all of a PNG's tiles must have come within this many seconds.
    """

    provider: Mapping[str, Any]
    cache_dir: Path
    timeout_s: float = TIMEOUT_S
    deadline_s: float = DEADLINE_S

    @property
    def name(self) -> str:
        return str(self.provider["name"])

    @property
    def attribution(self) -> str:
        return str(self.provider.get("attribution") or "")

    @cached_property
    def template(self) -> str:
        """The tiles' URL with ``{z}``, ``{x}`` and ``{y}`` left in (xyzservices fills in the rest)."""
        build = getattr(self.provider, "build_url", None)
        return build() if build is not None else str(self.provider["url"])

    @property
    def key(self) -> str:
        """The source's folder in the cache: its name (file-name safe) and a hash of its URL template."""
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", self.name).strip("._")[:60] or "tiles"
        return f"{name}-{hashlib.sha256(self.template.encode()).hexdigest()[:12]}"

    def url(self, tile: Any) -> str:
        """The URL of ``tile`` (a :class:`mercantile.Tile`)."""
        return (
            self.template.replace("{z}", str(tile.z)).replace("{x}", str(tile.x)).replace("{y}", str(tile.y))
        )

    @classmethod
    def from_url(
        cls, url: str, cache_dir: Path, timeout_s: float = TIMEOUT_S, deadline_s: float = DEADLINE_S
    ) -> TileSource:
        """A source from a URL template (``{z}``, ``{x}``, ``{y}``), credited to its host."""
        from xyzservices import TileProvider

        host = urlsplit(url).netloc or url
        provider = TileProvider(name=host, url=url, attribution=f"map tiles: {host}")
        return cls(provider, Path(cache_dir), timeout_s, deadline_s)


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
        images = _fetch_panels(
            source,
            [(panel_crs(*view), ax.get_xlim(), ax.get_ylim()) for ax, view in zip(axes, views, strict=True)],
        )
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
    logger.info("%s: basemap from %s (cache %s)", what, source.name, source.cache_dir / source.key)
    return marks


@dataclass
class _Fetch:
    """One PNG's fetching: the session (one connection, nextloc's User-Agent), the deadline, the counts."""

    source: TileSource
    session: Any
    deadline: float = field(init=False)
    fetched: int = 0
    cached: int = 0

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.source.deadline_s

    def seconds_left(self) -> float:
        """The time left for the next request, at most the source's timeout.

        Raises:
            TimeoutError: the deadline has passed.
        """
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.late()
        return min(self.source.timeout_s, left)

    def late(self) -> TimeoutError:
        return TimeoutError(f"the tiles did not all come within {self.source.deadline_s:g} s")


def _fetch_panels(
    source: TileSource, views: Sequence[tuple[str, tuple[float, float], tuple[float, float]]]
) -> list[tuple[np.ndarray, tuple[float, float, float, float]]]:
    """Each view's ``(crs, xlim, ylim)`` warped image and extent (:func:`_fetch`), within one deadline."""
    import requests

    with requests.Session() as session:
        session.headers["User-Agent"] = USER_AGENT
        fetch = _Fetch(source, session)
        images = [_fetch(fetch, *view) for view in views]
    logger.debug("%s: %d tiles fetched, %d from the cache", source.name, fetch.fetched, fetch.cached)
    return images


def _fetch(
    fetch: _Fetch, crs: str, xlim: tuple[float, float], ylim: tuple[float, float]
) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """The tiles under the view ``xlim`` x ``ylim`` of ``crs``, warped into it: the image and its extent
    (``left, right, bottom, top``). Zoom: 2 to 4 tiles across the view, at most the source's."""
    import contextily
    import mercantile
    from rasterio.warp import transform_bounds

    west, south, east, north = transform_bounds(crs, "EPSG:4326", xlim[0], ylim[0], xlim[1], ylim[1])
    across = 360 / max(east - west, 1e-12)  # views across the world
    max_zoom = fetch.source.provider.get("max_zoom", MAX_ZOOM)
    zoom = int(np.clip(math.ceil(math.log2(2 * across)), 0, max_zoom))
    tiles = list(mercantile.tiles(west, south, east, north, [zoom]))
    image, extent = _mosaic(tiles, [_tile(fetch, tile) for tile in tiles])
    return contextily.warp_tiles(image, extent, t_crs=crs)


def _tile(fetch: _Fetch, tile: Any) -> np.ndarray:
    """The tile's RGBA pixels: from its file in the cache, else from the server (then kept in the cache)."""
    folder = fetch.source.cache_dir / fetch.source.key / str(tile.z) / str(tile.x)
    for path in sorted(folder.glob(f"{tile.y}.*")):
        try:
            pixels, _ = _decode(path.read_bytes())
        except (OSError, ValueError) as err:  # not an image (any more): asked for again
            logger.info("%s: not a tile image (%s); fetched again", path, err)
            path.unlink(missing_ok=True)
            continue
        fetch.cached += 1
        return pixels
    data = _download(fetch, fetch.source.url(tile))
    pixels, kind = _decode(data)
    with atomic_path(folder / f"{tile.y}{SUFFIXES.get(kind, '.' + kind.lower())}") as tmp:
        tmp.write_bytes(data)
    fetch.fetched += 1
    return pixels


def _download(fetch: _Fetch, url: str) -> bytes:
    """The body of ``url``, read within the fetch's deadline and :data:`MAX_TILE_BYTES`.

    Raises:
        requests.RequestException: unreachable, no answer in time, an HTTP error.
        TimeoutError: the deadline passed.
        ValueError: a body over :data:`MAX_TILE_BYTES`.
    """
    import requests
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    timeout = fetch.seconds_left()
    try:
        with fetch.session.get(url, timeout=timeout, stream=True) as response:
            response.raise_for_status()
            # read1: what has come, not a full chunk, so that a trickled answer meets the deadline too
            read = getattr(response.raw, "read1", response.raw.read)  # urllib3 < 2.3: no read1
            body = bytearray()
            while chunk := read(64 << 10, decode_content=True):
                body += chunk
                if len(body) > MAX_TILE_BYTES:
                    raise ValueError(f"an answer over {MAX_TILE_BYTES} bytes is not a tile")
                fetch.seconds_left()
    except (requests.Timeout, Urllib3Timeout, TimeoutError) as err:
        if timeout < fetch.source.timeout_s:  # the request had what the deadline left: that is what ran out
            raise fetch.late() from err
        raise
    return bytes(body)


def _decode(data: bytes) -> tuple[np.ndarray, str]:
    """A tile's RGBA pixels and its format (``PNG``, ``JPEG``), read with Pillow.

    Raises:
        OSError: not an image Pillow reads (``PIL.UnidentifiedImageError``) or a truncated one.
    """
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        kind = str(image.format or "tile")
        return np.asarray(image.convert("RGBA")), kind


def _mosaic(tiles: Sequence[Any], arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, tuple[float, ...]]:
    """The ``tiles`` (:class:`mercantile.Tile`, one zoom) stitched into one image, and its Web Mercator
    extent (``left, right, bottom, top``).

    Raises:
        ValueError: tiles of different sizes.
    """
    import mercantile

    shapes = {array.shape for array in arrays}
    if len(shapes) != 1:
        raise ValueError(f"tiles of different sizes: {sorted(shapes)}")
    height, width, bands = arrays[0].shape
    x0, y0 = min(t.x for t in tiles), min(t.y for t in tiles)
    x1, y1 = max(t.x for t in tiles), max(t.y for t in tiles)
    image = np.zeros(((y1 - y0 + 1) * height, (x1 - x0 + 1) * width, bands), dtype=np.uint8)
    for tile, array in zip(tiles, arrays, strict=True):
        row, col = (tile.y - y0) * height, (tile.x - x0) * width
        image[row : row + height, col : col + width] = array
    zoom = tiles[0].z
    left, _, _, top = mercantile.xy_bounds(x0, y0, zoom)
    _, bottom, right, _ = mercantile.xy_bounds(x1, y1, zoom)
    return image, (left, right, bottom, top)
