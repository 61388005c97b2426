"""Tests for :mod:`nextloc.raw.http_download` and :mod:`nextloc.raw.download` on a local HTTP server (offline)."""

from __future__ import annotations

import hashlib
import http.server
import io
import random
import re
import stat
import threading
import urllib.error
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nextloc.raw import download, http_download
from nextloc.raw.download import UnsafeArchiveError, extract_geolife, fetch_geolife
from nextloc.raw.http_download import ChecksumError, DownloadError, download_file

PAYLOAD = random.Random(1234).randbytes(300_000)
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()
CHUNK = 16 * 1024


# --------------------------------------------------------------------------- #
# Local HTTP server with Range support
# --------------------------------------------------------------------------- #


@dataclass
class Hit:
    """One request seen by the test server."""

    path: str
    range: str | None
    status: int
    bytes_sent: int


@dataclass
class ServerState:
    """Behaviour knobs and request log shared with the handler."""

    files: dict[str, bytes] = field(default_factory=dict)
    honor_range: bool = True
    drop_after: int | None = None  # close the connection after N body bytes, once
    hits: list[Hit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _record(self, status: int, sent: int) -> None:
        with self.server.state.lock:
            self.server.state.hits.append(Hit(self.path, self.headers.get("Range"), status, sent))

    # Each hit is recorded *before* the response goes out, so a client that has
    # finished reading always finds its request in the log (no race with the test).
    def do_GET(self) -> None:
        state = self.server.state
        self.close_connection = True
        data = state.files.get(self.path)
        if data is None:
            self._record(404, 0)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return

        start = 0
        status = 200
        range_header = self.headers.get("Range")
        if range_header and state.honor_range:
            match = re.fullmatch(r"bytes=(\d+)-", range_header)
            assert match, range_header
            start = int(match.group(1))
            if start >= len(data):
                self._record(416, 0)
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206

        body = data[start:]
        with state.lock:
            drop_after, state.drop_after = state.drop_after, None
        sent = body if drop_after is None else body[:drop_after]  # truncated, then closed
        self._record(status, len(sent))
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        self.wfile.write(sent)
        self.wfile.flush()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    state: ServerState


@dataclass
class LocalServer:
    """Handle returned by the ``server`` fixture."""

    state: ServerState
    base_url: str

    def url(self, path: str = "/file.bin") -> str:
        return self.base_url + path


@pytest.fixture(autouse=True)
def _no_proxy_no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setattr(http_download, "_RETRY_BACKOFF_S", 0.0)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.state = ServerState(files={"/file.bin": PAYLOAD})
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    host, port = httpd.server_address[:2]
    try:
        yield LocalServer(httpd.state, f"http://{host}:{port}")
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _part(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def _sidecar(dest: Path) -> Path:
    return dest.with_name(dest.name + ".sha256")


# --------------------------------------------------------------------------- #
# download_file
# --------------------------------------------------------------------------- #


def test_fresh_download_verifies_sha256(server: LocalServer, tmp_path: Path) -> None:
    dest = tmp_path / "sub" / "file.bin"
    calls: list[tuple[int, int | None]] = []

    result = download_file(
        server.url(),
        dest,
        expected_sha256=PAYLOAD_SHA.upper(),
        chunk_size=CHUNK,
        timeout_s=5,
        progress=lambda done, total: calls.append((done, total)),
    )

    assert result == dest
    assert dest.read_bytes() == PAYLOAD
    assert not _part(dest).exists()
    assert _sidecar(dest).read_text().split()[0] == PAYLOAD_SHA
    assert [(h.range, h.status, h.bytes_sent) for h in server.state.hits] == [(None, 200, len(PAYLOAD))]
    assert calls[-1] == (len(PAYLOAD), len(PAYLOAD))
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_download_without_checksum_records_sidecar(
    server: LocalServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dest = tmp_path / "file.bin"
    with caplog.at_level("INFO", logger="nextloc.raw.http_download"):
        download_file(server.url(), dest, chunk_size=CHUNK, timeout_s=5)
    assert dest.read_bytes() == PAYLOAD
    assert _sidecar(dest).read_text() == f"{PAYLOAD_SHA}  file.bin\n"
    assert PAYLOAD_SHA in caplog.text

    # A later run verifies against the sidecar and makes no request.
    download_file(server.url(), dest, chunk_size=CHUNK, timeout_s=5)
    assert len(server.state.hits) == 1


def test_resume_from_partial_file(server: LocalServer, tmp_path: Path) -> None:
    dest = tmp_path / "file.bin"
    already = 100_000
    _part(dest).write_bytes(PAYLOAD[:already])

    download_file(server.url(), dest, expected_sha256=PAYLOAD_SHA, chunk_size=CHUNK, timeout_s=5)

    assert dest.read_bytes() == PAYLOAD
    assert not _part(dest).exists()
    [hit] = server.state.hits
    assert hit.range == f"bytes={already}-"
    assert hit.status == 206
    assert hit.bytes_sent == len(PAYLOAD) - already


def test_server_ignoring_range_restarts_cleanly(server: LocalServer, tmp_path: Path) -> None:
    server.state.honor_range = False
    dest = tmp_path / "file.bin"
    _part(dest).write_bytes(b"\xff" * 100_000)  # garbage that must be discarded

    download_file(server.url(), dest, expected_sha256=PAYLOAD_SHA, chunk_size=CHUNK, timeout_s=5)

    assert dest.read_bytes() == PAYLOAD
    [hit] = server.state.hits
    assert hit.range == "bytes=100000-"
    assert hit.status == 200
    assert hit.bytes_sent == len(PAYLOAD)


def test_dropped_connection_is_retried_and_resumed(server: LocalServer, tmp_path: Path) -> None:
    half = len(PAYLOAD) // 2
    server.state.drop_after = half
    dest = tmp_path / "file.bin"

    download_file(server.url(), dest, expected_sha256=PAYLOAD_SHA, chunk_size=CHUNK, timeout_s=5, retries=2)

    assert dest.read_bytes() == PAYLOAD
    hits = server.state.hits
    assert [(h.range, h.status) for h in hits] == [(None, 200), (f"bytes={half}-", 206)]
    assert [h.bytes_sent for h in hits] == [half, len(PAYLOAD) - half]


def test_dropped_connection_without_retries_keeps_partial(server: LocalServer, tmp_path: Path) -> None:
    half = len(PAYLOAD) // 2
    server.state.drop_after = half
    dest = tmp_path / "file.bin"

    with pytest.raises(DownloadError, match="connection closed") as info:
        download_file(server.url(), dest, chunk_size=CHUNK, timeout_s=5, retries=0)

    assert str(_part(dest)) in str(info.value)  # the message names the file kept to resume

    assert _part(dest).read_bytes() == PAYLOAD[:half]
    assert not dest.exists()


def test_complete_part_file_gets_416_and_is_verified(server: LocalServer, tmp_path: Path) -> None:
    dest = tmp_path / "file.bin"
    _part(dest).write_bytes(PAYLOAD)

    download_file(server.url(), dest, expected_sha256=PAYLOAD_SHA, chunk_size=CHUNK, timeout_s=5)

    assert dest.read_bytes() == PAYLOAD
    assert [(h.status, h.bytes_sent) for h in server.state.hits] == [(416, 0)]


def test_checksum_mismatch_raises_and_removes_part(server: LocalServer, tmp_path: Path) -> None:
    dest = tmp_path / "file.bin"
    wrong = "0" * 64

    with pytest.raises(ChecksumError) as info:
        download_file(server.url(), dest, expected_sha256=wrong, chunk_size=CHUNK, timeout_s=5)

    message = str(info.value)
    assert "file.bin" in message
    assert wrong in message
    assert PAYLOAD_SHA in message
    assert isinstance(info.value, ValueError)
    assert info.value.expected == wrong
    assert info.value.actual == PAYLOAD_SHA
    assert not _part(dest).exists()
    assert not dest.exists()


def test_existing_verified_file_makes_no_request(server: LocalServer, tmp_path: Path) -> None:
    dest = tmp_path / "file.bin"
    dest.write_bytes(PAYLOAD)

    assert download_file(server.url(), dest, expected_sha256=PAYLOAD_SHA) == dest
    assert server.state.hits == []

    # Verification through the sidecar alone; the URL is never contacted.
    _sidecar(dest).write_text(f"{PAYLOAD_SHA}  file.bin\n")
    assert download_file("http://127.0.0.1:9/unreachable", dest) == dest
    assert server.state.hits == []


def test_existing_corrupt_file_is_downloaded_again(server: LocalServer, tmp_path: Path) -> None:
    dest = tmp_path / "file.bin"
    dest.write_bytes(b"corrupt")

    download_file(server.url(), dest, expected_sha256=PAYLOAD_SHA, chunk_size=CHUNK, timeout_s=5)

    assert dest.read_bytes() == PAYLOAD
    assert len(server.state.hits) == 1


def test_http_404_is_not_retried(server: LocalServer, tmp_path: Path) -> None:
    with pytest.raises(urllib.error.HTTPError):
        download_file(server.url("/missing"), tmp_path / "x.bin", timeout_s=5, retries=3)
    assert len(server.state.hits) == 1


# --------------------------------------------------------------------------- #
# extract_geolife / fetch_geolife
# --------------------------------------------------------------------------- #

PLT = (
    "Geolife trajectory\nWGS 84\nAltitude is in Feet\nReserved 3\n0,2,255,My Track,0,0,2,8421376\n0\n"
    "39.984702,116.318417,0,492,39744.1201851852,2008-10-23,02:53:04\n"
)
TOP = "Geolife Trajectories 1.3"


def _make_zip(entries: dict[str, str], path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in entries.items():
            zf.writestr(name, content)
    return path


def _geolife_zip_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{TOP}/", "")
        zf.writestr(f"{TOP}/Data/000/Trajectory/x.plt", PLT)
        zf.writestr(f"{TOP}/Data/010/labels.txt", "Start Time\tEnd Time\tTransportation Mode\n")
        zf.writestr(f"{TOP}/User Guide-1.3.pdf", "%PDF-fake")
    return buf.getvalue()


def test_extract_returns_folder_containing_data(tmp_path: Path) -> None:
    zip_path = tmp_path / "g.zip"
    zip_path.write_bytes(_geolife_zip_bytes())
    out = tmp_path / "out"

    root = extract_geolife(zip_path, out)

    assert root == (out / TOP).resolve()
    assert (root / "Data" / "000" / "Trajectory" / "x.plt").read_text() == PLT
    assert sorted(p.name for p in out.iterdir()) == [TOP]  # temp dirs cleaned up

    # Re-extracting replaces the previous tree in place.
    (root / "Data" / "stale.txt").write_text("old")
    assert extract_geolife(zip_path, out) == root
    assert not (root / "Data" / "stale.txt").exists()
    assert sorted(p.name for p in out.iterdir()) == [TOP]


@pytest.mark.parametrize("bad_name", ["../evil.txt", "/abs/evil.txt", "a/../../evil.txt", "C:/evil.txt"])
def test_extract_refuses_path_traversal(tmp_path: Path, bad_name: str) -> None:
    zip_path = _make_zip({f"{TOP}/Data/000/Trajectory/x.plt": PLT, bad_name: "pwned"}, tmp_path / "bad.zip")
    out = tmp_path / "deep" / "out"

    with pytest.raises(UnsafeArchiveError, match=re.escape(bad_name)):
        extract_geolife(zip_path, out)

    assert not (tmp_path / "deep" / "evil.txt").exists()
    assert not (tmp_path / "evil.txt").exists()
    assert list(out.iterdir()) == []  # nothing written at all


def test_extract_refuses_symlink(tmp_path: Path) -> None:
    zip_path = tmp_path / "link.zip"
    with zipfile.ZipFile(zip_path, "w") as zf:
        zf.writestr(f"{TOP}/Data/000/Trajectory/x.plt", PLT)
        info = zipfile.ZipInfo(f"{TOP}/Data/link")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")

    with pytest.raises(UnsafeArchiveError, match="link"):
        extract_geolife(zip_path, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_extract_without_data_folder(tmp_path: Path) -> None:
    zip_path = _make_zip({"something/else.txt": "x"}, tmp_path / "nodata.zip")
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match="Data"):
        extract_geolife(zip_path, out)
    assert list(out.iterdir()) == []


def test_fetch_geolife_end_to_end(server: LocalServer, tmp_path: Path) -> None:
    zip_bytes = _geolife_zip_bytes()
    path = "/download/Geolife%20Trajectories%201.3.zip"
    server.state.files[path] = zip_bytes
    sha = hashlib.sha256(zip_bytes).hexdigest()
    dest_dir = tmp_path / "raw"

    root = fetch_geolife(dest_dir, url=server.url(path), expected_sha256=sha)

    assert root == (dest_dir / TOP).resolve()
    assert (root / "Data" / "000" / "Trajectory" / "x.plt").read_text() == PLT
    assert (dest_dir / download.GEOLIFE_ZIP_NAME).read_bytes() == zip_bytes
    assert [h.path for h in server.state.hits] == [path]

    # Second run: everything is in place, no network and no re-extraction.
    marker_mtime = (root / "Data" / "000" / "Trajectory" / "x.plt").stat().st_mtime_ns
    assert fetch_geolife(dest_dir, url=server.url(path), expected_sha256=sha) == root
    assert fetch_geolife(dest_dir, url=server.url(path)) == root
    assert len(server.state.hits) == 1
    assert (root / "Data" / "000" / "Trajectory" / "x.plt").stat().st_mtime_ns == marker_mtime


def test_geolife_constants() -> None:
    assert download.GEOLIFE_URL.startswith("https://download.microsoft.com/")
    assert download.GEOLIFE_URL.endswith("Geolife%20Trajectories%201.3.zip")
    assert download.GEOLIFE_ZIP_NAME == "Geolife Trajectories 1.3.zip"
    assert download.GEOLIFE_SHA256 is None
