"""One writer per data directory: the lock waits for other holders, survives nothing, and is re-entrant."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from runtime.locking import LOCK_NAME, DataDirBusy, data_dir_lock

HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from runtime.locking import data_dir_lock
    with data_dir_lock(sys.argv[1]):
        Path(sys.argv[2]).write_text("held")
        while not Path(sys.argv[3]).exists():
            time.sleep(0.05)
    """
)


def _holder(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    held, release = tmp_path / "held", tmp_path / "release"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "data"), str(held), str(release)])
    deadline = time.monotonic() + 60
    while not held.exists():
        assert proc.poll() is None, "holder died"
        assert time.monotonic() < deadline, "holder never took the lock"
        time.sleep(0.05)
    return proc, release


def test_second_run_waits_for_the_first(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proc, release = _holder(tmp_path)
    threading.Timer(1.0, release.write_text, args=("go",)).start()
    with data_dir_lock(tmp_path / "data", poll_s=0.05):
        assert proc.wait(timeout=30) == 0  # it could only finish by releasing the lock first
    assert f"pid {proc.pid}" in caplog.text
    assert "waiting for it to finish" in caplog.text


def test_timeout_names_the_holder(tmp_path: Path) -> None:
    proc, release = _holder(tmp_path)
    try:
        busy = pytest.raises(DataDirBusy, match=f"in use by another run \\(pid {proc.pid} since")
        with busy, data_dir_lock(tmp_path / "data", timeout_s=0.2, poll_s=0.05):
            pass
    finally:
        release.write_text("go")
        proc.wait(timeout=30)


def test_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    proc, _ = _holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert (tmp_path / "data" / LOCK_NAME).exists()  # the file stays; the lock went with the process
    with data_dir_lock(tmp_path / "data", timeout_s=5, poll_s=0.05):
        pass


def test_reentrant_in_a_thread_exclusive_across_threads(tmp_path: Path) -> None:
    order: list[str] = []
    with data_dir_lock(tmp_path), data_dir_lock(tmp_path):  # a flow calling its subflows

        def other() -> None:
            with data_dir_lock(tmp_path, poll_s=0.02):
                order.append("other")

        thread = threading.Thread(target=other)
        thread.start()
        time.sleep(0.3)
        order.append("first")
    thread.join(timeout=30)
    assert order == ["first", "other"]
