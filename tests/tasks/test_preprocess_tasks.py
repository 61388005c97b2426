"""The per-user preprocessing tasks' own IO: a chained batch hands a user's positionfixes over in memory."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from nextloc.io.geolife import list_plt_files, read_user
from nextloc.storage import read_parquet, write_parquet
from tasks.preprocess import _read_positionfixes, _write_positionfixes


@pytest.fixture(scope="module")
def positionfixes(sample_dir: Path) -> pa.Table:
    user_dir = sorted((sample_dir / "Data").iterdir())[0]
    table, _ = read_user(int(user_dir.name), list_plt_files(user_dir))
    assert table.num_rows > 1000
    return table


def test_the_table_just_written_is_read_as_the_file_would_be(positionfixes, tmp_path, monkeypatch):
    path = tmp_path / "pfs.parquet"
    artifact = _write_positionfixes(positionfixes, str(path))
    from_file = read_parquet(path)

    def no_file(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the file was read again")

    monkeypatch.setattr("tasks.preprocess.read_parquet", no_file)
    handed_over = _read_positionfixes(artifact)
    assert handed_over.equals(from_file)
    assert list(handed_over.dtypes) == list(from_file.dtypes)


def test_the_file_is_read_once_handed_over_or_after_a_change(positionfixes, tmp_path):
    path = tmp_path / "pfs.parquet"
    artifact = _write_positionfixes(positionfixes, str(path))
    assert _read_positionfixes(artifact).equals(read_parquet(path))
    # the hand-over was used up: the next read is the file's
    write_parquet(positionfixes.slice(0, 10), path)  # overwritten since (another run, another config)
    assert len(_read_positionfixes(artifact)) == 10
    # a table written and then changed on disk is not handed over
    artifact = _write_positionfixes(positionfixes, str(path))
    write_parquet(positionfixes.slice(0, 5), path)
    assert len(_read_positionfixes(artifact)) == 5


def test_another_threads_table_is_not_handed_over(positionfixes, tmp_path, monkeypatch):
    path = tmp_path / "pfs.parquet"
    written = {}
    thread = threading.Thread(target=lambda: written.update(a=_write_positionfixes(positionfixes, str(path))))
    thread.start()
    thread.join()
    reads = []
    monkeypatch.setattr("tasks.preprocess.read_parquet", lambda p: reads.append(p) or read_parquet(p))
    assert len(_read_positionfixes(written["a"])) == positionfixes.num_rows
    assert reads == [path]
