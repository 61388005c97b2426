"""Unpack zip and tar archives safely: nothing lands outside the destination folder.

The one extractor for every archive the package reads (the GeoLife zip, the shared ``.tar.xz``,
trajectory dumps); which archive, where its content goes and how it replaces older data stay with the
callers. Decisions:

* zip: every member is checked before anything is written (:func:`check_zip_member`): absolute paths
  (POSIX, drive letters, UNC, backslashes), ``..``, symbolic links of any kind (a later member could be
  written through one, even if it points inside) and names that resolve outside the folder (through a
  link already there) raise :class:`UnsafeArchiveError`, which names the member.
* tar: members go through the standard library's ``data`` filter (absolute paths, ``..``, links leading
  out, device files); its :class:`tarfile.FilterError` names the member and is raised as it is, so
  callers catch :data:`UNSAFE_MEMBER_ERRORS`. The compressed stream is then read to its end so that its
  checksum (gzip, bz2, xz) is verified: a damaged member header ends a tar early without an error.
* ``.xz`` tars are decompressed by the ``xz`` program when it is installed (multi-threaded); its
  failure is an :class:`OSError` naming the archive.
* :func:`extract` creates its destination afresh and removes it again if unpacking fails, so the folder
  holds the whole archive or does not exist. Every error it raises carries a note naming the archive
  (the standard library's messages do not).

Standard library only (``python -m nextloc.raw.rawdata`` runs before the environment is installed).
"""

from __future__ import annotations

import logging
import lzma
import shutil
import stat
import subprocess
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import IO, Literal

__all__ = [
    "UNREADABLE_ARCHIVE_ERRORS",
    "UNSAFE_MEMBER_ERRORS",
    "UnsafeArchiveError",
    "check_zip_member",
    "extract",
    "find_folder_holding",
    "is_zip",
]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
_XZ_SUFFIXES = (".xz", ".txz")


class UnsafeArchiveError(ValueError):
    """Raised when an archive member would be written outside the target folder.

    Attributes:
        member: The offending member name as stored in the archive.
    """

    def __init__(self, member: str, reason: str) -> None:
        self.member = member
        super().__init__(f"unsafe archive member {member!r}: {reason}")


UNSAFE_MEMBER_ERRORS: tuple[type[Exception], ...] = (UnsafeArchiveError, tarfile.FilterError)
"""A member would land outside the destination (zip: :class:`UnsafeArchiveError`, tar: the data filter's
error). Catch these before :data:`UNREADABLE_ARCHIVE_ERRORS`: ``FilterError`` is a ``TarError``."""

UNREADABLE_ARCHIVE_ERRORS: tuple[type[BaseException], ...] = (
    zipfile.BadZipFile,
    tarfile.TarError,
    EOFError,
    OSError,
    zlib.error,  # corrupt deflate data
    lzma.LZMAError,  # corrupt xz/lzma data
    NotImplementedError,  # a zip compression method the standard library lacks (Deflate64)
    RuntimeError,  # an encrypted zip member: password required
)
"""What reading a damaged, truncated or unsupported archive raises: it cannot be read, which is no crash."""


def is_zip(path: Path) -> bool:
    """True for a name ending in ``.zip`` (any case); every other archive is read as a tar."""
    return Path(path).name.lower().endswith(".zip")


def check_zip_member(info: zipfile.ZipInfo, root: Path) -> None:
    """Refuse a zip member that would be written outside the resolved folder ``root``.

    Raises:
        UnsafeArchiveError: absolute path, parent-directory reference, symbolic link, or a name that
            resolves outside ``root``.
    """
    name = info.filename
    normalized = name.replace("\\", "/")
    pure = PurePosixPath(normalized)
    if normalized.startswith("/") or (len(normalized) >= 2 and normalized[1] == ":"):
        raise UnsafeArchiveError(name, "absolute path")
    if ".." in pure.parts:
        raise UnsafeArchiveError(name, "parent-directory reference")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise UnsafeArchiveError(name, "symbolic link")
    target = (root / normalized).resolve()
    if target != root and root not in target.parents:
        raise UnsafeArchiveError(name, "resolves outside the extraction folder")


def extract(
    archive: Path,
    dest: Path,
    *,
    fmt: Literal["zip", "tar"] | None = None,
    check_root: Path | None = None,
) -> None:
    """Unpack every member of ``archive`` into ``dest``, refusing unsafe members.

    ``dest`` is emptied (or created) first and removed if unpacking fails.

    Args:
        archive: a zip, or a tar (plain, gzip, bz2 or xz).
        dest: the folder to unpack into.
        fmt: ``"zip"`` or ``"tar"``; by default the name decides (:func:`is_zip`).
        check_root: zip only: the folder member names are checked against (default ``dest``), for a
            caller that moves the content on into another folder.

    Raises:
        UnsafeArchiveError, tarfile.FilterError: an unsafe member (nothing is written for a zip).
        OSError: ``xz`` failed, or the archive cannot be opened.
        Any of :data:`UNREADABLE_ARCHIVE_ERRORS`: the archive is damaged or unsupported.
    """
    archive, dest = Path(archive), Path(dest)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    logger.info("unpacking %s into %s", archive, dest)
    try:
        if fmt == "zip" or (fmt is None and is_zip(archive)):
            _extract_zip(archive, dest, (check_root or dest).resolve())
        elif archive.name.lower().endswith(_XZ_SUFFIXES) and shutil.which("xz"):
            _extract_tar_through_xz(archive, dest)
        else:
            with tarfile.open(archive) as tar:
                _extract_tar(tar, dest)
    except BaseException as err:
        shutil.rmtree(dest, ignore_errors=True)  # nothing half-unpacked is left behind
        err.add_note(f"while unpacking the archive {archive}")
        raise


def _extract_zip(archive: Path, dest: Path, root: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        members = zf.infolist()
        for info in members:
            check_zip_member(info, root)
        zf.extractall(dest, members=members)


def _extract_tar(tar: tarfile.TarFile, dest: Path) -> None:
    tar.extractall(dest, filter="data")
    _read_to_end(tar.fileobj)


def _extract_tar_through_xz(archive: Path, dest: Path) -> None:
    """Stream the tar out of the ``xz`` program; its exit status verifies the whole compressed stream."""
    cmd = ["xz", "-dc", "-T2", str(archive)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                _extract_tar(tar, dest)
        except tarfile.ReadError as err:  # a stream cut short by xz failing: xz says why
            proc.stdout.close()
            if proc.wait() != 0:
                raise _xz_failed(archive, proc.returncode, proc.stderr) from err
            raise
        if proc.wait() != 0:
            raise _xz_failed(archive, proc.returncode, proc.stderr)


def _xz_failed(archive: Path, code: int, stderr: IO[bytes]) -> OSError:
    said = stderr.read().decode(errors="replace").strip()
    return OSError(f"xz failed on {archive} (exit {code})" + (f": {said}" if said else ""))


def _read_to_end(stream: IO[bytes] | None) -> None:
    while stream is not None and stream.read(_CHUNK):
        pass


def find_folder_holding(root: Path, name: str, max_depth: int = 4) -> Path | None:
    """Breadth-first search for the shallowest directory under ``root`` that has a subfolder ``name``.

    Symbolic links are not followed. Returns ``None`` when there is none within ``max_depth`` levels.
    """
    level = [root]
    for _ in range(max_depth + 1):
        next_level: list[Path] = []
        for directory in level:
            if (directory / name).is_dir():
                return directory
            next_level.extend(sorted(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink()))
        if not next_level:
            break
        level = next_level
    return None
