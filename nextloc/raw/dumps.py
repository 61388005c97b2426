"""New trajectory dumps: find them, fingerprint them, check them, and merge them into the raw store.

A dump is a folder or an archive (``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.xz``, ``.tar.bz2``) in
GeoLife layout: ``[...]/Data/NNN/Trajectory/*.plt`` (or ``NNN/Trajectory/*.plt`` at its top). It brings
new users or new days of known users. Merging is all or nothing: every file is checked first (it must
parse as a GeoLife ``.plt``, hold at least one valid row, have no more than ``max_bad_row_share`` of its
rows bad, and a file that already exists in the store must have identical bytes), then the new files are
copied in atomically with the store's file permissions. A dump that fails any check is rejected with
:class:`DumpRejected`, whose message says why and names the file by its path inside the dump (never a
staging folder); nothing in the store changes. The store is append-only, so a file let in by mistake
would stay forever: the checks are strict on purpose.

Pure file logic, no orchestration: ``tasks/dumps.py`` keeps the manifest and moves dumps around.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from nextloc.atomic import atomic_path
from nextloc.fingerprint import hash_file
from nextloc.io.geolife import IngestReport, list_plt_files, list_user_dirs, read_user
from nextloc.raw.archives import (
    UNREADABLE_ARCHIVE_ERRORS,
    UNSAFE_MEMBER_ERRORS,
    extract,
    find_folder_holding,
)

logger = logging.getLogger(__name__)

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")
FILE_ISSUES = ("unreadable_file", "empty_file", "bad_header", "short_header")
IN_PROGRESS_SUFFIXES = (".part", ".partial", ".tmp", ".crdownload", ".lock")
DEFAULT_MAX_BAD_ROW_SHARE = 0.05  # real GeoLife files have ~0 bad rows; 5% bad means a broken export


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

    Unpacking is :func:`nextloc.raw.archives.extract`'s (compressed streams are read to the end, so their
    checksums are verified; ``staging`` is removed again on any failure).

    Raises:
        DumpRejected: for an unreadable or corrupt archive, or members that would land outside
            ``staging``: absolute paths, ``..``, links leading out, devices; zips may hold no links at all
            (nothing is kept then).
    """
    if path.is_dir():
        return path
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)  # failing here is this machine's problem, not the dump's
    try:
        extract(path, staging)  # removes staging again if it fails
    except UNSAFE_MEMBER_ERRORS as err:
        raise DumpRejected(f"{path.name}: unsafe archive member: {err}") from err
    except UNREADABLE_ARCHIVE_ERRORS as err:
        raise DumpRejected(f"{path.name}: cannot read the archive: {err}") from err
    return staging


def plan_merge(
    dump_name: str, dump_root: Path, store: Path, max_bad_row_share: float = DEFAULT_MAX_BAD_ROW_SHARE
) -> MergePlan:
    """Check every file of a dump against the GeoLife format and the store; say what merging would add.

    Args:
        dump_name: the dump's name (for messages).
        dump_root: the unpacked dump (holding ``Data/``, possibly a few folders down, or user folders).
        store: the raw store (holding ``Data/``).
        max_bad_row_share: the largest share of bad rows (0..1) a file may have; more rejects the dump.

    Raises:
        DumpRejected: no GeoLife user folders or no ``.plt`` files; a file that is not a GeoLife ``.plt``
            at all (bad header, unreadable); a file with no valid row (garbage rows, or a header only);
            a file with more than ``max_bad_row_share`` of its rows bad; a file whose name exists in the
            store with other bytes (merging would change data already ingested). Files are named by
            their path inside the dump.
    """
    if not 0.0 <= max_bad_row_share <= 1.0:
        raise ValueError(f"max_bad_row_share must be in [0, 1], got {max_bad_row_share}")
    root = find_folder_holding(dump_root, "Data") or dump_root  # a dump of bare NNN/ folders: the dump itself
    try:
        users, folder_report = list_user_dirs(root)
    except FileNotFoundError as err:
        raise DumpRejected(f"{dump_name}: not in GeoLife layout (Data/NNN/Trajectory/*.plt): {err}") from err
    plan = MergePlan(dump_name)
    plan.report.merge(_inside_report(folder_report, dump_name, dump_root))
    for user_id, folder in users:
        files = list_plt_files(folder)
        if not files:
            continue
        reports = [_inside_report(read_user(user_id, [file])[1], dump_name, dump_root) for file in files]
        for report in reports:
            plan.report.merge(report)
        skipped = [r for r in reports if r.files_skipped]
        if skipped:
            bad = next((i for r in skipped for i in r.issues if i.kind in FILE_ISSUES), None)
            raise DumpRejected(
                f"{dump_name}: {len(skipped)} file(s) of user {user_id:03d} do not parse: {bad}"
            )
        for file, report in zip(files, reports, strict=True):
            _check_rows(dump_name, file.relative_to(dump_root).as_posix(), report, max_bad_row_share)
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


def _check_rows(dump_name: str, where: str, report: IngestReport, max_bad_row_share: float) -> None:
    """Reject a file with no valid row, or with more than ``max_bad_row_share`` of its rows bad."""
    good, bad = report.rows_read, report.rows_skipped
    first = f"; first: {report.issues[0]}" if report.issues else ""
    if good == 0:
        raise DumpRejected(
            f"{dump_name}: {where}: no valid row ({bad} bad rows){first}; "
            "the store is append-only, so the dump is quarantined"
        )
    if bad > max_bad_row_share * (good + bad):
        raise DumpRejected(
            f"{dump_name}: {where}: {bad} bad rows of {good + bad} ({100 * bad / (good + bad):.1f}%, "
            f"more than max_bad_row_share {100 * max_bad_row_share:g}%){first}"
        )


def _inside(path: Path, dump_name: str, dump_root: Path) -> str:
    """A path as the user knows it: ``<dump>/<path inside the dump>`` (not the staging folder's path)."""
    try:
        return f"{dump_name}/{Path(path).relative_to(dump_root).as_posix()}"
    except ValueError:
        return str(path)


def _inside_report(report: IngestReport, dump_name: str, dump_root: Path) -> IngestReport:
    """The report with each issue's file named by its path inside the dump."""
    report.issues = [replace(i, file=_inside(Path(i.file), dump_name, dump_root)) for i in report.issues]
    return report


def store_file_mode(store: Path) -> int:
    """The permission bits new files of the store get: those of a file already in it, else the umask's."""
    data = store / "Data"
    if data.is_dir():
        for user in sorted(data.iterdir()):
            for file in sorted((user / "Trajectory").glob("*.plt"))[:1]:
                return stat.S_IMODE(file.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def apply_merge(plan: MergePlan, store: Path) -> list[int]:
    """Copy a checked dump's new files into the store, each atomically (temp file + rename); returns the users.

    New files get the store's permissions (:func:`store_file_mode`), not the temporary file's 0600.
    A crash part way leaves whole files only; running the same plan again copies what is missing.
    """
    mode = store_file_mode(store)
    for entry in plan.new:
        target = store / entry.relative
        with atomic_path(target) as tmp:
            shutil.copyfile(entry.source, tmp)
            os.chmod(tmp, mode)
    logger.info("%s: merged %d new files for users %s", plan.dump, len(plan.new), plan.users)
    return plan.users


def _newest_mtime(path: Path) -> float:
    if path.is_file():
        return path.stat().st_mtime
    return max((p.stat().st_mtime for p in path.rglob("*")), default=path.stat().st_mtime)
