"""New trajectory dumps: find them, fingerprint them, check them, and merge them into the raw store.

A dump is a folder or an archive (``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.xz``, ``.tar.bz2``) in
GeoLife layout: ``[...]/Data/NNN/Trajectory/*.plt`` (or ``NNN/Trajectory/*.plt`` at its top). It brings
new users or new days of known users. Merging is all or nothing: every file is checked first (it must
parse as a GeoLife ``.plt``, and a file that already exists in the store must have identical bytes), then
the new files are copied in atomically. A dump that fails any check is rejected with
:class:`DumpRejected`, whose message says why; nothing in the store changes.

Pure file logic, no orchestration: ``tasks/dumps.py`` keeps the manifest and moves dumps around.
"""

from __future__ import annotations

import hashlib
import logging
import lzma
import shutil
import tarfile
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from nextloc.download import _find_data_parent
from nextloc.fingerprint import hash_file
from nextloc.geolife import IngestReport, list_plt_files, list_user_dirs, read_user
from nextloc.storage import atomic_path

logger = logging.getLogger(__name__)

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")
FILE_ISSUES = ("unreadable_file", "empty_file", "bad_header", "short_header")
IN_PROGRESS_SUFFIXES = (".part", ".partial", ".tmp", ".crdownload", ".lock")


class DumpRejected(ValueError):
    """A dump cannot be merged; the message names the dump and the reason (and the file when there is one)."""


@dataclass(frozen=True)
class DumpFile:
    """One ``.plt`` file of a dump and where it goes in the store."""

    user_id: int
    name: str
    source: Path
    digest: str

    @property
    def relative(self) -> str:
        """Its path inside the store: ``Data/NNN/Trajectory/<name>``."""
        return f"Data/{self.user_id:03d}/Trajectory/{self.name}"


@dataclass
class MergePlan:
    """What merging a dump would do: files to add, files already present, and the dump's parse report."""

    dump: str
    new: list[DumpFile] = field(default_factory=list)
    present: list[DumpFile] = field(default_factory=list)
    report: IngestReport = field(default_factory=IngestReport)

    @property
    def users(self) -> list[int]:
        """Users that get new files."""
        return sorted({f.user_id for f in self.new})


def is_archive(path: Path) -> bool:
    """True for the archive formats a dump may come in."""
    return path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)


def list_dumps(incoming: Path, min_age_s: float = 0.0, skip: tuple[str, ...] = ()) -> list[Path]:
    """Dumps waiting in ``incoming``, sorted by name.

    Hidden entries, names in ``skip`` (the ``applied``/``quarantine`` folders), names ending in an
    in-progress suffix (``.part``, ``.tmp``, ...) and entries changed less than ``min_age_s`` seconds ago
    (a copy may still be running) are left for a later run. Other plain files are not dumps and are
    skipped with a warning.
    """
    if not incoming.is_dir():
        return []
    now = time.time()
    found = []
    for entry in sorted(incoming.iterdir()):
        name = entry.name
        if name.startswith(".") or name in skip or name.lower().endswith(IN_PROGRESS_SUFFIXES):
            continue
        if not (entry.is_dir() or is_archive(entry)):
            logger.warning("%s: not a folder or an archive (%s); ignored", entry, ", ".join(ARCHIVE_SUFFIXES))
            continue
        if now - _newest_mtime(entry) < min_age_s:
            logger.info("%s: changed in the last %.0f s, left for the next run", entry, min_age_s)
            continue
        found.append(entry)
    return found


def dump_fingerprint(path: Path) -> str:
    """Content fingerprint of a dump: of an archive's bytes, or of a folder's relative paths and file bytes."""
    if path.is_file():
        return "archive:" + hash_file(path)
    digest = hashlib.blake2b(digest_size=16)
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0" + hash_file(file).encode() + b"\n")
    return "folder:" + digest.hexdigest()


def unpack_dump(path: Path, staging: Path) -> Path:
    """The folder to read a dump from: the dump itself, or its archive unpacked safely into ``staging``.

    Raises:
        DumpRejected: for an unreadable or corrupt archive (compressed streams are read to the end, so
            their checksums are verified), or members that would land outside ``staging``: absolute
            paths, ``..``, links leading out, devices; zips may hold no links at all (nothing is kept then).
    """
    if path.is_dir():
        return path
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if path.name.lower().endswith(".zip"):
            from nextloc.download import UnsafeArchiveError, _check_member

            with zipfile.ZipFile(path) as zf:
                root = staging.resolve()
                try:
                    for info in zf.infolist():
                        _check_member(info, root)
                except UnsafeArchiveError as err:
                    raise DumpRejected(f"{path.name}: unsafe archive member: {err}") from err
                zf.extractall(staging)
        else:
            with tarfile.open(path) as tar:
                try:
                    tar.extractall(staging, filter="data")
                except tarfile.FilterError as err:
                    raise DumpRejected(f"{path.name}: unsafe archive member: {err}") from err
                # a damaged member header ends a tar early without an error: read the (compressed) stream
                # to its end so that its checksum (gzip, bz2, xz) is verified
                while tar.fileobj.read(1 << 20):
                    pass
    # corrupt deflate/xz data raises zlib.error/LZMAError; an unsupported zip method NotImplementedError;
    # an encrypted zip member RuntimeError: all mean the archive cannot be read, not a crash
    except (
        zipfile.BadZipFile,
        tarfile.TarError,
        EOFError,
        OSError,
        zlib.error,
        lzma.LZMAError,
        NotImplementedError,
        RuntimeError,
    ) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise DumpRejected(f"{path.name}: cannot read the archive: {err}") from err
    except DumpRejected:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def plan_merge(dump_name: str, dump_root: Path, store: Path) -> MergePlan:
    """Check every file of a dump against the GeoLife format and the store; say what merging would add.

    Args:
        dump_name: the dump's name (for messages).
        dump_root: the unpacked dump (holding ``Data/``, possibly a few folders down, or user folders).
        store: the raw store (holding ``Data/``).

    Raises:
        DumpRejected: no GeoLife user folders or no ``.plt`` files; a file that is not a GeoLife ``.plt``
            at all (bad header, unreadable); a file whose name exists in the store with other bytes
            (merging would change data already ingested).
    """
    root = _find_data_parent(dump_root) or dump_root  # a dump of bare NNN/ folders: the dump itself
    try:
        users, folder_report = list_user_dirs(root)
    except FileNotFoundError as err:
        raise DumpRejected(f"{dump_name}: not in GeoLife layout (Data/NNN/Trajectory/*.plt): {err}") from err
    plan = MergePlan(dump_name)
    plan.report.merge(folder_report)
    for user_id, folder in users:
        files = list_plt_files(folder)
        if not files:
            continue
        _, report = read_user(user_id, files)
        plan.report.merge(report)
        if report.files_skipped:
            bad = next((i for i in report.issues if i.kind in FILE_ISSUES), None)
            raise DumpRejected(
                f"{dump_name}: {report.files_skipped} file(s) of user {user_id:03d} do not parse: {bad}"
            )
        for file in files:
            entry = DumpFile(user_id, file.name, file, hash_file(file))
            target = store / entry.relative
            if not target.exists():
                plan.new.append(entry)
            elif hash_file(target) == entry.digest:
                plan.present.append(entry)
            else:
                raise DumpRejected(
                    f"{dump_name}: {entry.relative} already exists in the store with different content; "
                    "merging would change data already ingested"
                )
    if not plan.new and not plan.present:
        raise DumpRejected(f"{dump_name}: no .plt files in Data/NNN/Trajectory/")
    return plan


def apply_merge(plan: MergePlan, store: Path) -> list[int]:
    """Copy a checked dump's new files into the store, each atomically (temp file + rename); returns the users.

    A crash part way leaves whole files only; running the same plan again copies what is missing.
    """
    for entry in plan.new:
        target = store / entry.relative
        with atomic_path(target) as tmp:
            shutil.copyfile(entry.source, tmp)
    logger.info("%s: merged %d new files for users %s", plan.dump, len(plan.new), plan.users)
    return plan.users


def _newest_mtime(path: Path) -> float:
    if path.is_file():
        return path.stat().st_mtime
    return max((p.stat().st_mtime for p in path.rglob("*")), default=path.stat().st_mtime)
