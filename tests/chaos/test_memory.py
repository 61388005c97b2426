"""Preprocessing works user by user: its peak memory follows the largest user, not the size of the data.

A raw store of N copies of the largest sample user (hard links: no extra disk) is preprocessed for a small
and a large N; the peak RSS (of the whole `nextloc preprocess` process tree) barely moves while the raw
data grows by 230 MB, so a dump larger than memory goes through the same way. The full-data bound
(< 4 GB) is in tests/test_full_data.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _store(root: Path, source: Path, copies: int) -> int:
    """``copies`` users made of hard links to ``source``'s files; returns the raw bytes."""
    size = 0
    for i in range(copies):
        traj = root / "Data" / f"{200 + i:03d}" / "Trajectory"
        traj.mkdir(parents=True)
        for f in sorted((source / "Trajectory").glob("*.plt")):
            os.link(f, traj / f.name)
            size += f.stat().st_size
    return size


def test_peak_memory_does_not_grow_with_the_data(sample_dir, tmp_path, peak_rss_mb):
    users = sorted(
        (sample_dir / "Data").iterdir(), key=lambda d: sum(f.stat().st_size for f in d.rglob("*.plt"))
    )
    largest = users[-1]
    small_bytes = _store(tmp_path / "small", largest, 4)
    large_bytes = _store(tmp_path / "large", largest, 40)
    small = peak_rss_mb(
        ["preprocess", "--raw-dir", str(tmp_path / "small"), "--data-dir", "out-small"], tmp_path
    )
    large = peak_rss_mb(
        ["preprocess", "--raw-dir", str(tmp_path / "large"), "--data-dir", "out-large"], tmp_path
    )
    added_mb = (large_bytes - small_bytes) / 2**20
    assert added_mb > 200
    # loading the data whole would add at least its parsed size (about 1/3 of the text); allow 1/6
    assert large - small < added_mb / 6, (
        f"peak RSS {small:.0f} MB -> {large:.0f} MB for +{added_mb:.0f} MB of raw data"
    )
