"""Finding and unpacking the raw data: the search order, safe and atomic unpacking, processes taking turns."""

from __future__ import annotations

import fcntl
import io
import lzma
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from nextloc.raw.rawdata import ENV_ARCHIVE, ENV_DIR, extract_archive, locate_raw_data

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def archive(sample_dir, tmp_path_factory) -> Path:
    """A .tar.xz of two real sample users, laid out as the shared archive (``Data/NNN/Trajectory``)."""
    users = sorted(p for p in (sample_dir / "Data").iterdir() if p.is_dir())[:2]
    path = tmp_path_factory.mktemp("archive") / "geolife.tar.xz"
    with tarfile.open(path, "w:xz") as tar:
        for user in users:
            tar.add(user, arcname=f"Data/{user.name}")
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_unpacks_every_file_as_archived(archive, sample_dir, tmp_path):
    out = extract_archive(archive, tmp_path / "raw")
    assert out == tmp_path / "raw"
    got = _files(out / "Data")
    users = {k.split("/")[0] for k in got}
    assert len(users) == 2
    expected = {k: v for k, v in _files(sample_dir / "Data").items() if k.split("/")[0] in users}
    assert got == expected
    assert not (tmp_path / "raw.partial").exists()


def test_a_path_escape_is_refused_and_nothing_is_left(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        data = b"x"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.FilterError):
        extract_archive(bad, tmp_path / "out" / "raw")
    assert not (tmp_path / "out" / "escaped.txt").exists()
    assert not (tmp_path / "out" / "raw").exists()
    assert not (tmp_path / "out" / "raw.partial").exists()


def test_an_archive_without_data_is_an_error(tmp_path):
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz") as tar:
        info = tarfile.TarInfo("README")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(FileNotFoundError, match="no GeoLife Data/"):
        extract_archive(empty, tmp_path / "raw")


def test_a_corrupt_archive_is_an_error_naming_it_and_nothing_is_left(archive, tmp_path):
    data = bytearray(archive.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    bad = tmp_path / "bad.tar.xz"
    bad.write_bytes(bytes(data))
    with pytest.raises((OSError, tarfile.TarError, lzma.LZMAError)) as info:
        extract_archive(bad, tmp_path / "raw")
    assert str(bad) in " ".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert not (tmp_path / "raw").exists()
    assert not (tmp_path / "raw.partial").exists()


def test_a_process_that_waited_uses_what_its_predecessor_unpacked(archive, tmp_path):
    """Two unpacks into one folder take turns; the second finds the data and does not unpack again."""
    out = tmp_path / "raw"
    lock = os.open(tmp_path / ".raw.unpack.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # this test is the predecessor, still unpacking
    code = (
        "import logging, sys\n"
        "from pathlib import Path\n"
        "from nextloc.raw.rawdata import extract_archive\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "extract_archive(Path(sys.argv[1]), Path(sys.argv[2]))\n"
    )
    waiter = subprocess.Popen(
        [sys.executable, "-c", code, str(archive), str(out)],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)
        assert waiter.poll() is None  # it waits for the lock
        (out / "Data" / "000").mkdir(parents=True)  # what the predecessor unpacked
        (out / "Data" / "000" / "marker").write_text("first")
    finally:
        os.close(lock)
    _, log = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, log
    assert "waiting for another process" in log
    assert "unpacked meanwhile by another process" in log
    assert _files(out) == {"Data/000/marker": b"first"}  # not unpacked a second time


class TestLocate:
    def test_order_env_dir_then_existing_then_archive(self, archive, tmp_path, monkeypatch):
        monkeypatch.delenv(ENV_DIR, raising=False)
        monkeypatch.delenv(ENV_ARCHIVE, raising=False)
        default = tmp_path / "raw"
        found = locate_raw_data(default, [tmp_path / "missing.tar.xz", archive], download=False)
        assert found.path == default
        assert found.source.startswith(f"unpacked local archive {archive}")
        again = locate_raw_data(default, [archive], download=False)
        assert again.source == f"existing data at {default}"
        monkeypatch.setenv(ENV_DIR, str(default))
        assert locate_raw_data(tmp_path / "other", [archive], download=False).source.startswith(f"${ENV_DIR}")

    def test_a_zip_laid_out_as_geolifes_download_is_found_once_unpacked(
        self, sample_dir, tmp_path, monkeypatch
    ):
        """GeoLife's zip unpacks into ``Geolife Trajectories 1.3/Data``: that folder is the data, and a second
        call finds it instead of unpacking again."""
        import zipfile

        monkeypatch.delenv(ENV_DIR, raising=False)
        monkeypatch.delenv(ENV_ARCHIVE, raising=False)
        user = sorted(p for p in (sample_dir / "Data").iterdir() if p.is_dir())[0]
        archive = tmp_path / "geolife.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            for path in sorted(user.rglob("*")):
                if path.is_file():
                    zf.write(path, f"Geolife Trajectories 1.3/Data/{user.name}/{path.relative_to(user)}")
        default = tmp_path / "raw"
        found = locate_raw_data(default, [archive], download=False)
        assert (found.path / "Data" / user.name).is_dir(), found
        again = locate_raw_data(default, [archive], download=False)
        assert again.path == found.path
        assert again.source == f"existing data at {found.path}"

    def test_env_dir_without_data_is_an_error(self, tmp_path, monkeypatch):
        monkeypatch.setenv(ENV_DIR, str(tmp_path))
        with pytest.raises(FileNotFoundError, match=ENV_DIR):
            locate_raw_data(tmp_path / "raw", [], download=False)

    def test_nothing_found_without_download_says_what_to_set(self, tmp_path, monkeypatch):
        monkeypatch.delenv(ENV_DIR, raising=False)
        monkeypatch.delenv(ENV_ARCHIVE, raising=False)
        with pytest.raises(FileNotFoundError, match=ENV_ARCHIVE):
            locate_raw_data(tmp_path / "raw", [tmp_path / "missing.tar.xz"], download=False)


def test_the_make_run_prefetch_never_fails_and_never_downloads(tmp_path):
    """``python -m nextloc.raw.rawdata`` with no data anywhere: exit 0, nothing fetched, the job decides."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV_DIR, ENV_ARCHIVE)}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "nextloc.raw.rawdata"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "the job will find or fetch it" in done.stderr
    assert not (tmp_path / "data" / "raw" / "download").exists()


def test_the_make_run_prefetch_needs_only_the_standard_library():
    """``make raw-data`` runs before the environment is installed: its whole import chain is stdlib-only."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = (
        "import sys\n"
        "import nextloc.raw.rawdata, nextloc.raw.download, nextloc.raw.archives, nextloc.file_lock, nextloc.atomic\n"
        "assert not {'numpy', 'pandas', 'pyarrow', 'xxhash'} & set(sys.modules), sorted(sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
