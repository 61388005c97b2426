"""Atomic file replacement: a reader never sees a half-written file, a crash leaves the old one or the new.

:func:`atomic_path` is the one way this package writes a file in place. It hands out a temporary file in
the destination folder (``.<name>.<random>.tmp``, same file system, so ``os.replace`` is atomic), flushes
it to disk and renames it over the destination; on any error the temporary file is removed.
:func:`remove_stale_temp_files` knows the same naming, to clean up after writers that were killed.

Standard library only: ``python -m nextloc.raw.rawdata`` and :mod:`nextloc.raw.download` must run before the
environment is installed. :mod:`nextloc.storage` (the parquet/JSON writers) re-exports both names.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "remove_stale_temp_files", "write_text_atomic"]


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write UTF-8 text to ``path`` through :func:`atomic_path` (the one atomic text writer; the bytes are
    exactly ``text.encode("utf-8")``, no newline translation)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(text.encode("utf-8"))


def remove_stale_temp_files(root: Path) -> list[Path]:
    """Delete the temporary files (``.<name>.*.tmp``) that writers killed mid-write left under ``root``.

    Only call this while no writer can be active (``runtime.locking.data_dir_lock`` held); the final files
    they were meant to replace are untouched, so nothing is lost.
    """
    removed = []
    for tmp in Path(root).rglob(".*.tmp"):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed
