"""Basemaps under the PNG maps (:mod:`nextloc.maps.tiles`): a real tile server on 127.0.0.1 (http.server in a
thread, one generated 256 x 256 PNG for any z/x/y) pointed at by the tile source's URL, contextily's real
fetch, cache and warp; the PNG is read back with Pillow. Without tiles (the server stopped and nothing
cached, a closed port, a server that never answers, a bad setting) the map is the plain axes, byte for byte
the map drawn with the tiles off, with one warning. Nothing here reaches beyond 127.0.0.1 (tests/conftest.py
turns the tiles off for every other test)."""

from __future__ import annotations

import io
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import mercantile
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from nextloc.maps.png import EARTH_RADIUS_M, draw_answer
from nextloc.maps.tiles import TILE_CACHE_ENV, TILES_ENV, USER_AGENT, TileSource, configured

BASE = (39.98, 116.33)  # Beijing
TILE_RGB = (214, 40, 160)  # no colour the plain map draws
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


@dataclass
class TileServer:
    """A tile server on 127.0.0.1: every GET answers :data:`TILE_RGB` as a PNG; the paths and User-Agents
    asked are kept."""

    server: ThreadingHTTPServer
    thread: threading.Thread
    asked: list[tuple[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{{z}}/{{x}}/{{y}}.png"

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.thread.join(5)
        self.server.server_close()


@pytest.fixture
def tile_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[TileServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # requests asks 127.0.0.1 itself, whatever proxy is set
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    buffer = io.BytesIO()
    Image.new("RGB", (256, 256), TILE_RGB).save(buffer, format="PNG")
    tile = buffer.getvalue()
    asked: list[tuple[str, str]] = []

    class Tiles(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append((self.path, self.headers.get("User-Agent", "")))
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(tile)))
            self.end_headers()
            self.wfile.write(tile)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Tiles)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    running = TileServer(server, thread, asked)
    yield running
    running.stop()


def tile_share(path: Path) -> float:
    """The share of the PNG's pixels in the tiles' colour."""
    pixels = np.asarray(Image.open(path).convert("RGB"))
    return float(np.all(pixels == TILE_RGB, axis=-1).mean())


def test_a_basemap_from_the_tile_server_then_from_its_cache(tile_server: TileServer, tmp_path: Path) -> None:
    """The tiles under the view are asked once each, with nextloc's User-Agent, at a zoom of a few tiles
    across; drawn under the map (its colour covers much of the PNG, the plain map has none of it) with the
    source's credit; with the server stopped the same map draws from the cache, to the same bytes."""
    source = TileSource.from_url(tile_server.url, tmp_path / "cache")
    drawn = draw_answer(HISTORY, ANSWER, tmp_path / "tiles.png", tiles=source)
    plain = draw_answer(HISTORY, ANSWER, tmp_path / "plain.png", tiles=None)
    assert tile_share(drawn.path) > 0.3
    assert tile_share(plain.path) == 0.0
    (panel,) = drawn.panels
    assert panel.basemap == f"map tiles: 127.0.0.1:{tile_server.server.server_address[1]}"
    assert plain.panels[0].basemap == ""
    assert panel.history == pytest.approx(plain.panels[0].history)  # the markers stay where they were
    paths = [p for p, _ in tile_server.asked]
    assert len(paths) == len(set(paths)) <= 16
    assert {agent for _, agent in tile_server.asked} == {USER_AGENT}
    tiles = [tuple(map(int, p.removesuffix(".png").strip("/").split("/"))) for p in paths]
    zoom = tiles[0][0]
    assert 13 <= zoom <= 16  # a view of about 1 km: 2 to 4 tiles across
    under = mercantile.tile(BASE[1], BASE[0], zoom)  # the first place's tile
    assert (zoom, under.x, under.y) in tiles
    tile_server.stop()
    again = draw_answer(HISTORY, ANSWER, tmp_path / "cached.png", tiles=source)
    assert again.panels[0].basemap == panel.basemap
    assert again.path.read_bytes() == drawn.path.read_bytes()
    assert len(tile_server.asked) == len(paths)


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
