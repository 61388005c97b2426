"""Basemaps under the PNG maps (:mod:`nextloc.maps.tiles`): real tile servers on 127.0.0.1 (http.server in a
thread, one generated 256 x 256 PNG for any z/x/y, at once, late or a byte at a time) pointed at by the tile
source's URL; nextloc's real fetch and cache, contextily's real warp; the PNG and the cached tiles are read
back with Pillow. Without tiles (the server stopped and nothing cached, a closed port, a server that never
answers or is too slow, a bad setting) the map is the plain axes, byte for byte the map drawn with the tiles
off, with one warning. Nothing here reaches beyond 127.0.0.1 (tests/conftest.py turns the tiles off for every
other test)."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import mercantile
import numpy as np
import pandas as pd
import pytest
from PIL import Image
from xyzservices import TileProvider

from nextloc.maps.png import EARTH_RADIUS_M, draw_answer
from nextloc.maps.tiles import TILE_CACHE_ENV, TILES_ENV, USER_AGENT, TileSource, configured

REPO = Path(__file__).resolve().parents[3]
BASE = (39.98, 116.33)  # Beijing
TILE_RGB = (214, 40, 160)  # no colour the plain map draws
OTHER_RGB = (30, 200, 90)  # a second source's tiles
M_PER_DEG_LAT = EARTH_RADIUS_M * np.pi / 180


def north(metres: float) -> tuple[float, float]:
    return BASE[0] + metres / M_PER_DEG_LAT, BASE[1]


HISTORY = pd.DataFrame(
    {"latitude": [BASE[0], north(500)[0], north(900)[0]], "longitude": [BASE[1]] * 3, "place": [2, 3, 2]}
)
ANSWER = {
    "user_id": 153,
    "p_new_place": 0.2,
    "places": [
        {"rank": 1, "location_id": 2, "latitude": BASE[0], "longitude": BASE[1], "probability": 0.6},
        {"rank": 2, "location_id": 3, "latitude": north(500)[0], "longitude": BASE[1], "probability": 0.2},
    ],
}


def png_tile(rgb: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (256, 256), rgb).save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass
class TileServer:
    """A tile server on 127.0.0.1: every GET answers a tile of one colour as a PNG, ``delay_s`` late, or
    ``trickle_s`` between its bytes; the paths and User-Agents asked are kept."""

    server: ThreadingHTTPServer
    thread: threading.Thread
    tile: bytes
    asked: list[tuple[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{{z}}/{{x}}/{{y}}.png"

    def tiles(self) -> list[tuple[int, int, int]]:
        """``(z, x, y)`` of each tile asked, in order."""
        return [tuple(map(int, p.removesuffix(".png").strip("/").split("/"))) for p, _ in self.asked]

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.thread.join(5)
        self.server.server_close()


Serve = Callable[..., TileServer]


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Serve]:
    """Start tile servers (``serve(rgb, delay_s=0, trickle_s=0)``); all are stopped after the test."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # requests asks 127.0.0.1 itself, whatever proxy is set
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    started: list[TileServer] = []

    def start(
        rgb: tuple[int, int, int] = TILE_RGB, delay_s: float = 0.0, trickle_s: float = 0.0
    ) -> TileServer:
        tile = png_tile(rgb)
        asked: list[tuple[str, str]] = []

        class Tiles(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                asked.append((self.path, self.headers.get("User-Agent", "")))
                time.sleep(delay_s)
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(tile)))
                self.end_headers()
                step = 1 if trickle_s else len(tile)
                try:
                    for start in range(0, len(tile), step):
                        self.wfile.write(tile[start : start + step])
                        self.wfile.flush()
                        time.sleep(trickle_s)
                except OSError:  # the client gave up
                    pass

            def log_message(self, *args: object) -> None:  # quiet
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Tiles)
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        started.append(TileServer(server, thread, tile, asked))
        return started[-1]

    yield start
    for running in started:
        running.stop()


@pytest.fixture
def tile_server(serve: Serve) -> TileServer:
    return serve()


def tile_share(path: Path, rgb: tuple[int, int, int] = TILE_RGB) -> float:
    """The share of the PNG's pixels in the tiles' colour."""
    pixels = np.asarray(Image.open(path).convert("RGB"))
    return float(np.all(pixels == rgb, axis=-1).mean())


def cached_files(cache: Path) -> dict[Path, bytes]:
    """Every file in the tile cache, by its path in it; each must open with Pillow as an image (no pickle,
    no leftover temporary file)."""
    files = {
        path.relative_to(cache): path.read_bytes() for path in sorted(cache.rglob("*")) if path.is_file()
    }
    for data in files.values():
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    return files


def draw_in_a_new_process(url: str, cache: Path, path: Path) -> None:
    """The map drawn by another Python, its tiles named by $NEXTLOC_MAP_TILES and $NEXTLOC_TILE_CACHE."""
    script = (
        "import json, sys; import pandas as pd; from nextloc.maps.png import draw_answer; "
        "draw_answer(pd.DataFrame(json.loads(sys.argv[1])), json.loads(sys.argv[2]), sys.argv[3])"
    )
    env = {**os.environ, TILES_ENV: url, TILE_CACHE_ENV: str(cache), "PYTHONDONTWRITEBYTECODE": "1"}
    args = [
        sys.executable,
        "-c",
        script,
        json.dumps(HISTORY.to_dict(orient="list")),
        json.dumps(ANSWER),
        str(path),
    ]
    subprocess.run(args, cwd=REPO, env=env, check=True, timeout=120)


def test_a_basemap_from_the_tile_server_then_from_its_cache(tile_server: TileServer, tmp_path: Path) -> None:
    """The tiles under the view are asked once each, with nextloc's User-Agent, at a zoom of a few tiles
    across; drawn under the map (its colour covers much of the PNG, the plain map has none of it) with the
    source's credit; each is kept as the server's PNG bytes at <source key>/<z>/<x>/<y>.png; a cached file
    that is not an image is asked for again; with the server stopped another process draws the same map
    from the cache, to the same bytes."""
    cache = tmp_path / "cache"
    source = TileSource.from_url(tile_server.url, cache)
    drawn = draw_answer(HISTORY, ANSWER, tmp_path / "tiles.png", tiles=source)
    plain = draw_answer(HISTORY, ANSWER, tmp_path / "plain.png", tiles=None)
    assert tile_share(drawn.path) > 0.3
    assert tile_share(plain.path) == 0.0
    (panel,) = drawn.panels
    assert panel.basemap == f"map tiles: 127.0.0.1:{tile_server.server.server_address[1]}"
    assert plain.panels[0].basemap == ""
    assert panel.history == pytest.approx(plain.panels[0].history)  # the markers stay where they were
    tiles = tile_server.tiles()
    assert len(tiles) == len(set(tiles)) <= 16
    assert {agent for _, agent in tile_server.asked} == {USER_AGENT}
    zoom = tiles[0][0]
    assert 13 <= zoom <= 16  # a view of about 1 km: 2 to 4 tiles across
    under = mercantile.tile(BASE[1], BASE[0], zoom)  # the first place's tile
    assert (zoom, under.x, under.y) in tiles
    files = cached_files(cache)
    assert files == {Path(source.key, str(z), str(x), f"{y}.png"): tile_server.tile for z, x, y in tiles}
    assert source.key.startswith("127.0.0.1_")
    broken = cache / next(iter(files))
    broken.write_bytes(b"\x80\x04not a tile")  # a pickle's first bytes: not an image, so fetched again
    again = draw_answer(HISTORY, ANSWER, tmp_path / "again.png", tiles=source)
    assert again.path.read_bytes() == drawn.path.read_bytes()
    assert len(tile_server.asked) == len(tiles) + 1
    assert cached_files(cache) == files
    tile_server.stop()
    draw_in_a_new_process(tile_server.url, cache, tmp_path / "cached.png")
    assert (tmp_path / "cached.png").read_bytes() == drawn.path.read_bytes()
    assert len(tile_server.asked) == len(tiles) + 1


def test_two_tile_sources_are_cached_apart(serve: Serve, tmp_path: Path) -> None:
    """Two sources of the same name in one cache folder: each its own key folder, tiles and colour."""
    cache = tmp_path / "cache"
    servers = serve(TILE_RGB), serve(OTHER_RGB)
    sources = [TileSource(TileProvider(name="tiles", url=s.url, attribution="tiles"), cache) for s in servers]
    assert sources[0].key != sources[1].key
    drawn = [draw_answer(HISTORY, ANSWER, tmp_path / f"{i}.png", tiles=s) for i, s in enumerate(sources)]
    assert tile_share(drawn[0].path, TILE_RGB) > 0.3
    assert tile_share(drawn[0].path, OTHER_RGB) == 0.0
    assert tile_share(drawn[1].path, OTHER_RGB) > 0.3
    assert tile_share(drawn[1].path, TILE_RGB) == 0.0
    files = cached_files(cache)
    for source, server in zip(sources, servers, strict=True):
        mine = {path: data for path, data in files.items() if path.parts[0] == source.key}
        assert mine
        assert set(mine.values()) == {server.tile}
        assert len(mine) == len(server.asked)
    assert {path.parts[0] for path in files} == {s.key for s in sources}


@pytest.mark.parametrize(("delay_s", "trickle_s"), [(0.3, 0.0), (0.0, 0.05)], ids=["late", "trickled"])
def test_tiles_past_the_deadline_the_plain_axes(
    serve: Serve, delay_s: float, trickle_s: float, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each tile answered within the request's timeout but too slowly for them all to come within the PNG's
    deadline (each 0.3 s late, or its bytes 0.05 s apart): the fetch ends at the deadline, and the map is the
    plain one with one warning; what was cached is whole tiles only."""
    server = serve(delay_s=delay_s, trickle_s=trickle_s)
    source = TileSource.from_url(server.url, tmp_path / "cache", timeout_s=2.0, deadline_s=0.5)
    plain = draw_answer(HISTORY, ANSWER, tmp_path / "plain.png", tiles=None)
    with caplog.at_level(logging.WARNING, logger="nextloc.maps.tiles"):
        drawn = draw_answer(HISTORY, ANSWER, tmp_path / "slow.png", tiles=source)
    assert drawn.path.read_bytes() == plain.path.read_bytes()
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        "slow.png: no basemap (TimeoutError: the tiles did not all come within 0.5 s)" in warning.getMessage()
    )
    assert set(cached_files(tmp_path / "cache").values()) <= {server.tile}
    assert len(server.asked) < 4  # the deadline ended the fetch, not a timeout per tile (each came within it)


def test_without_tiles_the_plain_axes_and_one_warning(
    tile_server: TileServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server stopped and nothing cached: the map is drawn on the plain axes, the same bytes as with the
    tiles off, and one warning names the map and why."""
    tile_server.stop()
    plain = draw_answer(HISTORY, ANSWER, tmp_path / "plain.png", tiles=None)
    source = TileSource.from_url(tile_server.url, tmp_path / "cache")
    with caplog.at_level(logging.WARNING, logger="nextloc.maps.tiles"):
        drawn = draw_answer(HISTORY, ANSWER, tmp_path / "offline.png", tiles=source)
    assert drawn.path.read_bytes() == plain.path.read_bytes()
    assert drawn.panels[0].basemap == ""
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "offline.png: no basemap (ConnectionError" in warning.getMessage()


def test_a_server_that_never_answers_costs_the_timeout_not_a_hang(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A port that accepts connections and never answers: the request gives up after the source's timeout,
    and the map is the plain one."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/{{z}}/{{x}}/{{y}}.png"
        source = TileSource.from_url(url, tmp_path / "cache", timeout_s=0.3)
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="nextloc.maps.tiles"):
            drawn = draw_answer(HISTORY, ANSWER, tmp_path / "silent.png", tiles=source)
        assert time.monotonic() - start < 5
    assert drawn.panels[0].basemap == ""
    assert "Timeout" in caplog.text


def test_the_tile_source_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Unset: OpenStreetMap's standard tiles, cached under $XDG_CACHE_HOME; a URL template; a provider's
    name; off; $NEXTLOC_TILE_CACHE; a setting that names nothing is a warning and the plain map."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    osm = configured(env)
    assert osm is not None
    assert osm.provider["url"] == "https://tile.openstreetmap.org/{z}/{x}/{y}.png"
    assert "OpenStreetMap" in osm.attribution
    assert osm.cache_dir == tmp_path / "xdg" / "nextloc" / "tiles"
    assert configured({**env, TILES_ENV: "off"}) is None
    url = "http://127.0.0.1:9/{z}/{x}/{y}.png"
    mine = configured({TILES_ENV: url, TILE_CACHE_ENV: str(tmp_path / "mine")})
    assert mine is not None
    assert (mine.provider["url"], mine.cache_dir) == (url, tmp_path / "mine")
    positron = configured({**env, TILES_ENV: "CartoDB.Positron"})
    assert positron is not None
    assert positron.name == "CartoDB.Positron"
    with pytest.raises(ValueError, match="neither a URL template"):
        configured({**env, TILES_ENV: "no.such.tiles"})
    monkeypatch.setenv(TILES_ENV, "no.such.tiles")
    with caplog.at_level(logging.WARNING, logger="nextloc.maps.tiles"):
        drawn = draw_answer(HISTORY, ANSWER, tmp_path / "bad.png")
    assert drawn.panels[0].basemap == ""
    assert "neither a URL template" in caplog.text
