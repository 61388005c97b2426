"""Content fingerprints (:mod:`nextloc.fingerprint`) on the real GeoLife sample."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nextloc.fingerprint import FILE_HASH, hash_file_groups_memo, hash_files, hash_files_memo
from nextloc.io.geolife import list_plt_files, list_user_dirs


@pytest.fixture(scope="module")
def groups(sample_dir: Path) -> list[tuple[list[Path], Path]]:
    users, _ = list_user_dirs(sample_dir)
    return [(list_plt_files(folder), folder) for _, folder in users]


def test_groups_in_parallel_equal_one_by_one(groups: list[tuple[list[Path], Path]]) -> None:
    one_by_one = [hash_files(paths, root) for paths, root in groups]
    memo: dict[str, list] = {}
    assert hash_file_groups_memo(groups, memo, threads=8) == one_by_one
    assert memo["#algorithm"] == [FILE_HASH]
    assert len(memo) == 1 + sum(len(paths) for paths, _ in groups)
    assert hash_file_groups_memo(groups, memo, threads=1) == one_by_one  # from the memo


def test_memo_of_another_algorithm_is_dropped_once(groups: list[tuple[list[Path], Path]]) -> None:
    paths, root = groups[0]
    memo = {str(paths[0]): [paths[0].stat().st_size, paths[0].stat().st_mtime_ns, "stale"]}
    assert hash_file_groups_memo(groups, memo) == [hash_files(p, r) for p, r in groups]
    assert memo[str(paths[0])][2] != "stale"


def test_a_changed_file_is_hashed_again(tmp_path: Path) -> None:
    path = tmp_path / "a.plt"
    path.write_text("one")
    memo: dict[str, list] = {}
    first = hash_files_memo([path], memo, root=tmp_path)
    path.write_text("two")
    os.utime(path, ns=(1, 1))  # another mtime, same size
    assert hash_files_memo([path], memo, root=tmp_path) != first
    assert hash_files_memo([path], memo, root=tmp_path) == hash_files([path], root=tmp_path)
