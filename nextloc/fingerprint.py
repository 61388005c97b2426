"""Content fingerprints for cache keys and dataset lineage."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

_CHUNK = 1 << 20
# File contents are fingerprinted with XXH3-128: these are cache keys and lineage, not security, and a
# cold run fingerprints all 1.6 GB of GeoLife (blake2b: ~0.7 GB/s on one core here; XXH3: ~6 GB/s, so
# reading the files is what remains). Recorded in hash memos so a memo of another algorithm is dropped.
FILE_HASH = "xxh3_128"
_MEMO_ALGORITHM_KEY = "#algorithm"


def hash_text(text: str) -> str:
    """Short blake2b hex digest of a string."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def hash_bytes(data: bytes | memoryview) -> str:
    """XXH3-128 digest of bytes in memory: what :func:`hash_file` gives for a file holding them."""
    return xxhash.xxh3_128(data).hexdigest()


def hash_file(path: Path) -> str:
    """XXH3-128 digest (32 hex characters) of a file's bytes, read in 1 MiB chunks."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def hash_files(paths: Iterable[Path], root: Path | None = None) -> str:
    """Fingerprint of several files: their names (relative to ``root``) and their contents, in order."""
    digest = hashlib.blake2b(digest_size=16)
    for path in paths:
        name = str(path.relative_to(root)) if root is not None else path.name
        digest.update(name.encode() + b"\0" + hash_file(path).encode() + b"\n")
    return digest.hexdigest()


def combine(*parts: str) -> str:
    """Combine several fingerprints (order matters)."""
    return hash_text("\n".join(parts))


def hash_files_memo(paths: Iterable[Path], memo: dict[str, list], root: Path | None = None) -> str:
    """Like :func:`hash_files`, but reuses a file's hash while its size and mtime are unchanged.

    Args:
        paths: files in a fixed order.
        memo: ``{path: [size, mtime_ns, hash]}``; updated in place (persist it between runs). A memo made
            with another file-hash algorithm is emptied first.
        root: names are taken relative to this folder.

    Returns:
        The combined fingerprint.
    """
    _check_memo(memo)
    digest = hashlib.blake2b(digest_size=16)
    prefix = os.path.join(str(root), "") if root is not None else None
    for path in paths:
        key = str(path)
        st = os.stat(key)
        entry = memo.get(key)
        if entry is None or entry[0] != st.st_size or entry[1] != st.st_mtime_ns:
            entry = [st.st_size, st.st_mtime_ns, hash_file(path)]
            memo[key] = entry
        if prefix is None:
            name = path.name
        elif key.startswith(prefix):  # what relative_to gives, without its cost (18,668 GeoLife files)
            name = key[len(prefix) :]
        else:
            name = str(path.relative_to(root))  # type: ignore[arg-type]
        digest.update(name.encode() + b"\0" + entry[2].encode() + b"\n")
    return digest.hexdigest()


def hash_file_groups_memo(
    groups: Sequence[tuple[Sequence[Path], Path | None]], memo: dict[str, list], threads: int | None = None
) -> list[str]:
    """:func:`hash_files_memo` of each ``(paths, root)`` group, groups read in parallel; fingerprints in order.

    Reading is what a cold fingerprint costs, and threads overlap it: the file reads and the hashing
    release the GIL. ``threads`` defaults to the CPU count (at most 8). Files are hashed when they are new,
    so usually just after they were unpacked, downloaded or written, from the page cache: there GeoLife's
    1.6 GB took 0.36-0.55 s on this 2-core machine's 2 threads and 0.54-0.78 s on 8 (the threads' Python
    work queues on the GIL). From disk: 2.5 s on one thread, 1.9-2.0 s on 2, 1.7 s on 8.
    """
    if threads is None:
        threads = min(8, os.cpu_count() or 1)
    _check_memo(memo)  # once, before the threads add to it
    if threads <= 1 or len(groups) <= 1:
        return [hash_files_memo(paths, memo, root) for paths, root in groups]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fingerprint") as pool:
        return list(pool.map(lambda group: hash_files_memo(group[0], memo, group[1]), groups))


def _check_memo(memo: dict[str, list]) -> None:
    """Empty a memo made with another file-hash algorithm and mark it with this one."""
    if memo.get(_MEMO_ALGORITHM_KEY) != [FILE_HASH]:
        memo.clear()
        memo[_MEMO_ALGORITHM_KEY] = [FILE_HASH]
