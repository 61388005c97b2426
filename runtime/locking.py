"""One writer per data directory: runs that share a ``data_dir`` take turns instead of interleaving writes.

``data_dir_lock(data_dir)`` holds :func:`nextloc.file_lock.exclusive_lock` on ``<data_dir>/.nextloc.lock``
for the whole of a run. A second run on the same directory waits (logging who holds it: the holder writes
its pid and start time into the lock file) and then finds everything its predecessor wrote in the cache.
The operating system drops the lock when the holder dies, SIGKILL included, so a crash never leaves a
stale lock. Nested use in one thread (``preprocess-train`` calling the ``preprocess`` and ``train``
flows) is re-entrant; other threads wait like other processes.

``registry_lock()`` is the other lock: one writer at a time of the MLflow rows every run shares (the
experiment, registered models, the ``champion`` alias), across machines, as a Prefect global concurrency
limit.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from nextloc.atomic import remove_stale_temp_files
from nextloc.file_lock import HeldLock, LockBusy, exclusive_lock

logger = logging.getLogger("nextloc.lock")

LOCK_NAME = ".nextloc.lock"
_held: dict[tuple[str, int], int] = {}
_guard = threading.Lock()


class DataDirBusy(RuntimeError):
    """Another run holds the data directory and ``timeout_s`` passed."""


@contextlib.contextmanager
def data_dir_lock(
    data_dir: str | Path, timeout_s: float | None = None, poll_s: float = 1.0
) -> Iterator[None]:
    """Hold the data directory's lock for the duration of the block.

    Args:
        data_dir: the run's output folder (created if missing).
        timeout_s: give up after this long (``DataDirBusy``); None waits as long as it takes
            (``$NEXTLOC_LOCK_TIMEOUT_S`` overrides).
        poll_s: how often to retry while waiting with a timeout.
    """
    root = Path(data_dir).resolve()
    key = (str(root), threading.get_ident())  # re-entrant within a thread; other threads wait like processes
    with _guard:
        reentrant = key in _held
        if reentrant:
            _held[key] += 1
    if reentrant:
        try:
            yield
        finally:
            with _guard:
                _held[key] -= 1
        return
    if timeout_s is None and os.environ.get("NEXTLOC_LOCK_TIMEOUT_S"):
        timeout_s = float(os.environ["NEXTLOC_LOCK_TIMEOUT_S"])
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / LOCK_NAME, timeout_s, poll_s) as held:
        os.ftruncate(held.fd, 0)
        holder = {"pid": os.getpid(), "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        os.write(held.fd, json.dumps(holder).encode())
        with _guard:
            _held[key] = 1
        stale = remove_stale_temp_files(root)  # ours alone now: any temp file is from a killed writer
        if stale:
            logger.warning("removed %d temporary files left by an interrupted run under %s", len(stale), root)
        try:
            yield
        finally:
            with _guard:
                _held.pop(key, None)


@contextlib.contextmanager
def _locked(path: Path, timeout_s: float | None, poll_s: float) -> Iterator[HeldLock]:
    """:func:`nextloc.file_lock.exclusive_lock` saying who holds ``path`` while waiting and on a timeout."""

    def announce() -> None:
        logger.warning("%s is held by another run (%s); waiting for it to finish", path, _holder(path))

    with contextlib.ExitStack() as stack:
        try:
            held = stack.enter_context(
                exclusive_lock(path, timeout_s=timeout_s, poll_s=poll_s, on_wait=announce)
            )
        except LockBusy as err:
            raise DataDirBusy(
                f"{path.parent} is in use by another run ({_holder(path)}) for more than {timeout_s:.0f} s"
            ) from err
        if held.waited_s is not None:
            logger.info("got %s after %.0f s", path, held.waited_s)
        yield held


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return "holder unknown"
    return f"pid {info.get('pid', '?')} since {info.get('since', '?')}"


#: Prefect's global concurrency limit (one slot) that serialises writes to the MLflow registry's shared rows.
REGISTRY_LIMIT = "nextloc-mlflow-registry"


@contextlib.contextmanager
def registry_lock(timeout_s: float = 900.0) -> Iterator[None]:
    """One writer at a time, across processes and machines, of what runs share in MLflow: the experiment
    and its tags, a registered model and its versions, the ``champion`` alias.

    Concurrent runs racing to insert the same row make MLflow's store fail the loser (``experiment_tag_pk``
    killed one run of a burst) or recover from a database error; and two promotions reading the same
    champion could both move the alias. The lock is a slot of Prefect's global concurrency limit
    :data:`REGISTRY_LIMIT` (created on first use; ``nextloc services start`` creates it), so every run
    that talks to the same Prefect API takes turns. Without a Prefect API (a library call) it does nothing.
    """
    if not os.environ.get("PREFECT_API_URL"):
        yield
        return
    from prefect.concurrency.sync import concurrency

    ensure_registry_limit()
    with concurrency(REGISTRY_LIMIT, occupy=1, timeout_seconds=timeout_s, strict=True):
        yield


def ensure_registry_limit() -> None:
    """Create :data:`REGISTRY_LIMIT` (one slot) in the Prefect API if it is missing."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(REGISTRY_LIMIT)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # created concurrently
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=REGISTRY_LIMIT, limit=1)
                )
