"""An exclusive lock on a file, shared by processes (and threads) that must take turns.

:func:`exclusive_lock` is ``flock(LOCK_EX)`` on a lock file. ``flock`` rather than a pid file: the
operating system drops the lock when its holder dies, SIGKILL included, so a crash never leaves a stale
lock behind. The lock belongs to an open file description, so two threads of one process exclude each
other just like two processes; re-entrancy, if a caller wants it, is the caller's business
(``runtime.locking.data_dir_lock``). Standard library only (``python -m nextloc.raw.rawdata`` runs before the
environment is installed).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HeldLock", "LockBusy", "exclusive_lock"]


class LockBusy(RuntimeError):
    """Another holder kept the lock for longer than the caller's timeout."""


@dataclass(frozen=True)
class HeldLock:
    """A lock being held: the open lock file, and how long it took to get it."""

    path: Path
    fd: int
    waited_s: float | None
    """Seconds spent waiting for another holder; ``None`` when the lock was free at once."""


@contextmanager
def exclusive_lock(
    path: Path,
    *,
    timeout_s: float | None = None,
    poll_s: float = 1.0,
    on_wait: Callable[[], object] | None = None,
) -> Iterator[HeldLock]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing, never deleted) for the block.

    When another holder has it, ``on_wait()`` is called once (to say who is waiting for what), then this
    waits: blocked in ``flock`` when ``timeout_s`` is None (woken the moment the lock is free), otherwise
    retrying every ``poll_s`` seconds until ``timeout_s`` has passed.

    Raises:
        LockBusy: ``timeout_s`` passed while another holder kept the lock.
    """
    path = Path(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        waited_s = None if _try_lock(fd) else _wait(fd, path, timeout_s, poll_s, on_wait)
        try:
            yield HeldLock(path, fd, waited_s)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait(
    fd: int, path: Path, timeout_s: float | None, poll_s: float, on_wait: Callable[[], object] | None
) -> float:
    """Wait for the lock another holder has; returns the seconds waited."""
    started = time.monotonic()
    if on_wait is not None:
        on_wait()
    if timeout_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return time.monotonic() - started
    while not _try_lock(fd):
        if time.monotonic() - started > timeout_s:
            raise LockBusy(f"{path} is held by another process for more than {timeout_s:.0f} s")
        time.sleep(poll_s)
    return time.monotonic() - started
