"""Tests for :mod:`nextloc.raw.dumps`: finding, fingerprinting, unpacking, checking and merging new dumps.

Dumps and stores are built in ``tmp_path`` from copies of real GeoLife sample files (users 087, 060 and
178 are small). Every rejection test checks the message (the dump, the reason and, where there is one, the
member or file) and that nothing was written where it should not be.
"""

from __future__ import annotations

import io
import logging
import os
import random
import re
import stat
import struct
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from nextloc.fingerprint import hash_file
from nextloc.raw.dumps import (
    ARCHIVE_SUFFIXES,
    IN_PROGRESS_SUFFIXES,
    DumpFile,
    DumpRejected,
    MergePlan,
    apply_merge,
    dump_fingerprint,
    list_dumps,
    plan_merge,
    unpack_dump,
)

# Once a flow test has configured Prefect logging, nextloc's warnings also try to reach the Prefect API,
# which warns outside a flow run. That is Prefect plumbing, not the behaviour tested here.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Logger 'nextloc.io.geolife' attempted to send logs:UserWarning"),
    pytest.mark.filterwarnings("ignore:Logger 'nextloc.raw.dumps' attempted to send logs:UserWarning"),
]

USER = 87  # 8 files of 12..36 rows
OTHER_USER = 60  # 2 files
OLD = 1_000_000_000  # an mtime far in the past (2001)
TAR_MODES = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz", ".tar.xz": "w:xz", ".tar.bz2": "w:bz2"}


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def sample_files(sample_dir: Path, user: int) -> list[Path]:
    """The sample's ``.plt`` files of one user, sorted by name."""
    return sorted((sample_dir / "Data" / f"{user:03d}" / "Trajectory").glob("*.plt"))


def copy_files(files: list[Path], folder: Path) -> list[Path]:
    """Copy files' bytes (not their read-only mode) into ``folder``; returns the copies."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for file in files:
        target = folder / file.name
        target.write_bytes(file.read_bytes())
        out.append(target)
    return out


def add_user(
    root: Path, sample_dir: Path, user: int, count: int | None = None, data: bool = True
) -> list[Path]:
    """Copy the first ``count`` files of a sample user into ``root/[Data/]NNN/Trajectory``."""
    base = root / "Data" if data else root
    return copy_files(sample_files(sample_dir, user)[:count], base / f"{user:03d}" / "Trajectory")


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root``: relative path -> bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_zip(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name), data, compress_type=compression)
    return path


def write_tar(path: Path, members: dict[str, bytes], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = OLD
            tar.addfile(info, io.BytesIO(data))
    return path


def dump_members(sample_dir: Path, user: int = USER, prefix: str = "") -> dict[str, bytes]:
    """Archive members for one sample user: ``<prefix>Data/NNN/Trajectory/<name>`` -> bytes."""
    return {
        f"{prefix}Data/{user:03d}/Trajectory/{f.name}": f.read_bytes() for f in sample_files(sample_dir, user)
    }


def set_old(path: Path) -> None:
    """Give ``path`` and everything under it an mtime far in the past."""
    for p in [*path.rglob("*"), path] if path.is_dir() else [path]:
        os.utime(p, (OLD, OLD))


def flip(data: bytes, positions: range) -> bytes:
    out = bytearray(data)
    for i in positions:
        out[i] ^= 0x5A
    return bytes(out)


def patch_zip_field(data: bytes, local_offset: int, central_offset: int, value: int) -> bytes:
    """Set a 2-byte field of the first member in both its local header and its central directory entry."""
    out = bytearray(data)
    assert out[:4] == b"PK\x03\x04"
    out[local_offset : local_offset + 2] = struct.pack("<H", value)
    central = out.find(b"PK\x01\x02")
    out[central + central_offset : central + central_offset + 2] = struct.pack("<H", value)
    return bytes(out)


# --------------------------------------------------------------------------- #
# list_dumps
# --------------------------------------------------------------------------- #


class TestListDumps:
    def test_missing_incoming_folder_gives_nothing(self, tmp_path):
        assert list_dumps(tmp_path / "nope") == []

    def test_folders_and_every_archive_suffix_are_dumps_sorted_by_name(self, tmp_path):
        names = [f"dump{i}{suffix}" for i, suffix in enumerate(ARCHIVE_SUFFIXES)] + ["UPPER.ZIP", "Z.TAR.GZ"]
        for name in names:
            (tmp_path / name).write_bytes(b"x")
        for name in ("b-folder", "a-folder"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "f").write_bytes(b"y")
        found = list_dumps(tmp_path)
        assert [p.name for p in found] == sorted([*names, "a-folder", "b-folder"])
        assert all(p.parent == tmp_path for p in found)

    def test_hidden_skipped_and_in_progress_entries_are_left_alone(self, tmp_path, caplog):
        (tmp_path / "good.zip").write_bytes(b"x")
        ignored_files = [".hidden.zip", ".DS_Store", "dump.zip.part", "X.ZIP.PART"]
        ignored_files += [f"dump{suffix}" for suffix in IN_PROGRESS_SUFFIXES]
        ignored_files += [f"dump.tar.gz{suffix.upper()}" for suffix in IN_PROGRESS_SUFFIXES]
        for name in ignored_files:
            (tmp_path / name).write_bytes(b"x")
        for name in (".hidden-dir", "applied", "quarantine", "copying.tmp", "folder.part"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "f.zip").write_bytes(b"x")
        with caplog.at_level(logging.WARNING, logger="nextloc.raw.dumps"):
            found = list_dumps(tmp_path, skip=("applied", "quarantine"))
        assert [p.name for p in found] == ["good.zip"]
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    def test_names_in_skip_are_only_skipped_when_asked(self, tmp_path):
        (tmp_path / "applied").mkdir()
        (tmp_path / "applied" / "f").write_bytes(b"x")
        assert [p.name for p in list_dumps(tmp_path)] == ["applied"]
        assert list_dumps(tmp_path, skip=("applied",)) == []

    def test_plain_files_that_are_not_archives_are_skipped_with_a_warning(self, tmp_path, caplog):
        for name in ("notes.txt", "20081023025304.plt", "dump.rar", "dump.gz", "zip"):
            (tmp_path / name).write_bytes(b"x")
        (tmp_path / "dump.zip").write_bytes(b"x")
        with caplog.at_level(logging.WARNING, logger="nextloc.raw.dumps"):
            found = list_dumps(tmp_path)
        assert [p.name for p in found] == ["dump.zip"]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 5
        for name in ("notes.txt", "20081023025304.plt", "dump.rar", "dump.gz", "zip"):
            assert any(name in w and "not a folder or an archive" in w for w in warnings), name

    def test_entries_changed_recently_are_left_for_a_later_run(self, tmp_path):
        archive = tmp_path / "new.zip"
        archive.write_bytes(b"x")
        folder = tmp_path / "new-folder"
        (folder / "Data" / "087").mkdir(parents=True)
        (folder / "Data" / "087" / "a.plt").write_bytes(b"x")
        assert list_dumps(tmp_path, min_age_s=3600) == []
        assert [p.name for p in list_dumps(tmp_path, min_age_s=0)] == ["new-folder", "new.zip"]

        set_old(archive)
        set_old(folder)
        assert [p.name for p in list_dumps(tmp_path, min_age_s=3600)] == ["new-folder", "new.zip"]

    def test_a_folder_is_as_young_as_its_newest_file(self, tmp_path):
        folder = tmp_path / "dump"
        deep = folder / "Data" / "087" / "Trajectory"
        deep.mkdir(parents=True)
        (deep / "old.plt").write_bytes(b"x")
        (deep / "fresh.plt").write_bytes(b"x")
        set_old(folder)
        now = time.time()
        os.utime(deep / "fresh.plt", (now, now))  # a copy still writing deep inside
        assert list_dumps(tmp_path, min_age_s=3600) == []
        os.utime(deep / "fresh.plt", (OLD, OLD))
        assert list_dumps(tmp_path, min_age_s=3600) == [folder]

    def test_an_empty_old_folder_is_listed(self, tmp_path):
        (tmp_path / "empty").mkdir()
        set_old(tmp_path / "empty")
        assert list_dumps(tmp_path, min_age_s=3600) == [tmp_path / "empty"]


# --------------------------------------------------------------------------- #
# dump_fingerprint
# --------------------------------------------------------------------------- #


class TestDumpFingerprint:
    @pytest.fixture
    def folder(self, tmp_path, sample_dir) -> Path:
        root = tmp_path / "a" / "dump"
        add_user(root, sample_dir, USER)
        add_user(root, sample_dir, OTHER_USER)
        return root

    def test_stable_across_calls(self, folder):
        first = dump_fingerprint(folder)
        assert first.startswith("folder:")
        assert dump_fingerprint(folder) == first

    def test_same_for_a_copy_at_another_path(self, folder, tmp_path):
        copy = tmp_path / "elsewhere" / "other-name"
        for rel, data in tree(folder).items():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            (copy / rel).write_bytes(data)
        set_old(copy)  # mtimes and folder names do not count
        assert dump_fingerprint(copy) == dump_fingerprint(folder)

    def test_changes_when_one_byte_changes(self, folder):
        before = dump_fingerprint(folder)
        file = sorted(folder.rglob("*.plt"))[3]
        data = bytearray(file.read_bytes())
        data[-3] ^= 0x01
        file.write_bytes(bytes(data))
        assert dump_fingerprint(folder) != before

    def test_changes_when_a_file_moves_or_is_added(self, folder):
        before = dump_fingerprint(folder)
        file = sorted(folder.rglob("*.plt"))[0]
        moved = file.with_name("20990101000000.plt")
        file.rename(moved)
        after_move = dump_fingerprint(folder)
        assert after_move != before
        (folder / "README").write_bytes(b"")
        assert dump_fingerprint(folder) not in {before, after_move}

    def test_an_archive_is_fingerprinted_by_its_bytes(self, tmp_path, sample_dir):
        archive = write_zip(tmp_path / "dump.zip", dump_members(sample_dir))
        fingerprint = dump_fingerprint(archive)
        assert fingerprint == "archive:" + hash_file(archive)
        twin = tmp_path / "renamed-elsewhere.zip"
        twin.write_bytes(archive.read_bytes())
        assert dump_fingerprint(twin) == fingerprint
        twin.write_bytes(flip(archive.read_bytes(), range(100, 101)))
        assert dump_fingerprint(twin) != fingerprint


# --------------------------------------------------------------------------- #
# unpack_dump
# --------------------------------------------------------------------------- #


class TestUnpackDump:
    def test_a_folder_is_returned_as_it_is(self, tmp_path, sample_dir):
        folder = tmp_path / "dump"
        add_user(folder, sample_dir, USER)
        before = tree(folder)
        assert unpack_dump(folder, tmp_path / "staging") == folder
        assert not (tmp_path / "staging").exists()
        assert tree(folder) == before

    def test_zip_unpacks_into_staging(self, tmp_path, sample_dir):
        members = dump_members(sample_dir, prefix="Geolife Trajectories 1.3/")
        archive = write_zip(tmp_path / "dump.zip", members)
        staging = tmp_path / "staging" / "x"
        assert unpack_dump(archive, staging) == staging
        assert tree(staging) == members

    @pytest.mark.parametrize("suffix", list(TAR_MODES))
    def test_tar_unpacks_into_staging(self, tmp_path, sample_dir, suffix):
        members = dump_members(sample_dir)
        archive = write_tar(tmp_path / f"dump{suffix}", members, TAR_MODES[suffix])
        staging = tmp_path / "staging"
        assert unpack_dump(archive, staging) == staging
        assert tree(staging) == members

    def test_stale_staging_content_is_cleared_first(self, tmp_path, sample_dir):
        members = dump_members(sample_dir)
        staging = tmp_path / "staging"
        (staging / "Data" / "999" / "Trajectory").mkdir(parents=True)
        (staging / "Data" / "999" / "Trajectory" / "left-over.plt").write_bytes(b"old")
        unpack_dump(write_zip(tmp_path / "dump.zip", members), staging)
        assert tree(staging) == members

    @pytest.mark.parametrize(
        ("member", "reason"),
        [
            ("../escaped.plt", "parent-directory reference"),
            ("Data/087/../../../escaped.plt", "parent-directory reference"),
            ("ABSOLUTE", "absolute path"),
            ("SYMLINK", "symbolic link"),
        ],
    )
    def test_unsafe_zip_members_are_rejected_before_anything_is_written(
        self, tmp_path, sample_dir, member, reason
    ):
        good = dump_members(sample_dir)
        archive = tmp_path / "incoming" / "evil.zip"
        archive.parent.mkdir()
        if member == "ABSOLUTE":
            member = str(tmp_path / "outside" / "escaped.plt")
        with zipfile.ZipFile(archive, "w") as zf:
            for name, data in good.items():
                zf.writestr(name, data)
            if member == "SYMLINK":
                member = "Data/087/Trajectory/link.plt"
                info = zipfile.ZipInfo(member)
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                zf.writestr(info, str(tmp_path / "target.plt"))
            else:
                zf.writestr(zipfile.ZipInfo(member), b"Geolife trajectory\n")
        staging = tmp_path / "incoming" / "staging"
        before = sorted(p for p in tmp_path.rglob("*"))
        with pytest.raises(DumpRejected) as err:
            unpack_dump(archive, staging)
        message = str(err.value)
        assert message.startswith("evil.zip: unsafe archive member")
        assert repr(member) in message
        assert reason in message
        assert not staging.exists()
        assert sorted(p for p in tmp_path.rglob("*")) == before

    def test_tar_member_outside_staging_is_rejected(self, tmp_path, sample_dir):
        members = dict(dump_members(sample_dir))
        members["../escaped.plt"] = b"Geolife trajectory\n"
        (tmp_path / "incoming").mkdir()
        archive = write_tar(tmp_path / "incoming" / "evil.tar.gz", members)
        staging = tmp_path / "incoming" / "staging"
        with pytest.raises(
            DumpRejected, match=r"^evil\.tar\.gz: unsafe archive member: .*'\.\./escaped\.plt'"
        ):
            unpack_dump(archive, staging)
        assert not staging.exists()
        assert not (tmp_path / "incoming" / "escaped.plt").exists()
        assert sorted(p.name for p in tmp_path.rglob("*")) == ["evil.tar.gz", "incoming"]

    def test_tar_link_to_outside_is_rejected(self, tmp_path):
        archive = tmp_path / "evil.tar"
        with tarfile.open(archive, "w") as tar:
            info = tarfile.TarInfo("Data/087/Trajectory/a.plt")
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)
        staging = tmp_path / "staging"
        with pytest.raises(
            DumpRejected, match=r"^evil\.tar: unsafe archive member: .*Data/087/Trajectory/a\.plt"
        ):
            unpack_dump(archive, staging)
        assert not staging.exists()

    @pytest.mark.parametrize(
        ("damage", "suffix"),
        [
            ("truncated", ".zip"),
            ("not an archive", ".zip"),
            ("empty file", ".zip"),
            ("corrupt data", ".zip"),  # deflate: zlib.error
            ("corrupt lzma data", ".zip"),  # LZMAError
            ("encrypted member", ".zip"),  # RuntimeError: password required
            ("unsupported compression method", ".zip"),  # NotImplementedError
            ("not an archive", ".tar.gz"),
            ("truncated", ".tar.gz"),
            ("corrupt data", ".tar.gz"),  # used to unpack part of the files silently
            ("corrupt data", ".tar.xz"),  # LZMAError
            ("corrupt data", ".tar.bz2"),
        ],
    )
    def test_damaged_archives_are_rejected_as_unreadable(self, tmp_path, sample_dir, damage, suffix):
        members = dict(list(dump_members(sample_dir, user=11).items())[:20])  # ~0.5 MB of real data
        path = tmp_path / f"damaged{suffix}"
        if damage == "not an archive":
            path.write_bytes(b"this is not an archive\n" * 10)
        elif damage == "empty file":
            path.write_bytes(b"")
        elif suffix == ".zip":
            compression = zipfile.ZIP_LZMA if "lzma" in damage else zipfile.ZIP_DEFLATED
            data = write_zip(tmp_path / "good.zip", members, compression).read_bytes()
            if damage == "truncated":
                data = data[: len(data) // 2]
            elif damage.startswith("corrupt"):
                data = flip(data, range(200, 400))  # inside the first member's compressed data
            elif damage == "encrypted member":
                data = patch_zip_field(data, 6, 8, 0x1)  # general purpose flag bit 0: encrypted
            else:
                data = patch_zip_field(data, 8, 10, 9)  # compression method 9: Deflate64
            path.write_bytes(data)
        else:
            data = write_tar(tmp_path / f"good{suffix}", members, TAR_MODES[suffix]).read_bytes()
            if damage == "truncated":
                data = data[: len(data) // 2]
            else:
                data = flip(data, range(len(data) // 2, len(data) // 2 + 64))
            path.write_bytes(data)
        staging = tmp_path / "staging"
        with pytest.raises(DumpRejected, match=rf"^{re.escape(path.name)}: cannot read the archive"):
            unpack_dump(path, staging)
        assert not staging.exists()

    @pytest.mark.parametrize("suffix", [".zip", ".tar.gz", ".tar.xz", ".tar.bz2"])
    def test_a_bit_flip_never_unpacks_to_different_files(self, tmp_path, sample_dir, suffix):
        """A damaged archive is rejected or unpacks to exactly its files: never silently other bytes.

        (A plain ``.tar`` has no checksum over its data, so it is not covered.)
        """
        members = dump_members(sample_dir)
        good = tmp_path / f"good{suffix}"
        if suffix == ".zip":
            write_zip(good, members)
        else:
            write_tar(good, members, TAR_MODES[suffix])
        data = good.read_bytes()
        rng = random.Random(f"bit-flip{suffix}")
        bad = tmp_path / f"bad{suffix}"
        rejections, identical = [], 0
        for _ in range(40):
            damaged = bytearray(data)
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
            bad.write_bytes(bytes(damaged))
            try:
                root = unpack_dump(bad, tmp_path / "staging")
            except DumpRejected as err:
                rejections.append(str(err))
                assert not (tmp_path / "staging").exists()
                continue
            assert tree(root) == members
            identical += 1
        assert len(rejections) + identical == 40
        assert rejections
        assert all(message.startswith(f"{bad.name}: ") for message in rejections)


# --------------------------------------------------------------------------- #
# plan_merge
# --------------------------------------------------------------------------- #


@pytest.fixture
def store(tmp_path, sample_dir) -> Path:
    """A raw store holding user 060 and the first 5 files of user 087."""
    root = tmp_path / "store"
    add_user(root, sample_dir, OTHER_USER)
    add_user(root, sample_dir, USER, count=5)
    return root


def relatives(files: list[DumpFile]) -> list[str]:
    return [f.relative for f in files]


class TestPlanMerge:
    def test_a_new_user_brings_only_new_files(self, tmp_path, sample_dir, store):
        dump = tmp_path / "dump"
        copies = add_user(dump, sample_dir, 178)
        before = tree(store)
        plan = plan_merge("dump-178", dump, store)
        assert isinstance(plan, MergePlan)
        assert plan.dump == "dump-178"
        assert plan.present == []
        assert relatives(plan.new) == [f"Data/178/Trajectory/{p.name}" for p in copies]
        assert [f.source for f in plan.new] == copies
        assert [f.digest for f in plan.new] == [hash_file(p) for p in copies]
        assert plan.users == [178]
        assert plan.report.files_read == len(copies)
        assert plan.report.files_skipped == 0
        assert tree(store) == before  # planning writes nothing

    def test_an_empty_store_takes_everything(self, tmp_path, sample_dir):
        dump = tmp_path / "dump"
        add_user(dump, sample_dir, USER)
        add_user(dump, sample_dir, OTHER_USER)
        plan = plan_merge("d", dump, tmp_path / "no-store-yet")
        assert len(plan.new) == 8 + 2
        assert plan.users == [OTHER_USER, USER]

    def test_a_known_user_with_new_days_brings_only_the_new_days(self, tmp_path, sample_dir, store):
        dump = tmp_path / "dump"
        copies = add_user(dump, sample_dir, USER)  # all 8 files; the store has the first 5
        plan = plan_merge("d", dump, store)
        assert relatives(plan.new) == [f"Data/087/Trajectory/{p.name}" for p in copies[5:]]
        assert relatives(plan.present) == [f"Data/087/Trajectory/{p.name}" for p in copies[:5]]
        assert plan.users == [USER]
        assert plan.report.files_read == 8

    def test_a_dump_already_in_the_store_brings_nothing(self, tmp_path, sample_dir, store):
        dump = tmp_path / "dump"
        add_user(dump, sample_dir, USER, count=5)
        add_user(dump, sample_dir, OTHER_USER)
        plan = plan_merge("d", dump, store)
        assert plan.new == []
        assert len(plan.present) == 7
        assert plan.users == []

    def test_same_name_with_other_bytes_is_rejected(self, tmp_path, sample_dir, store):
        dump = tmp_path / "dump"
        copies = add_user(dump, sample_dir, USER)
        changed = copies[2]
        lines = changed.read_bytes().splitlines(keepends=True)
        changed.write_bytes(b"".join([*lines, lines[-1]]))  # still a good .plt: one row repeated
        before = tree(store)
        relative = f"Data/087/Trajectory/{changed.name}"
        with pytest.raises(
            DumpRejected, match=rf"^dump-x: {re.escape(relative)} already exists .*different content"
        ):
            plan_merge("dump-x", dump, store)
        assert tree(store) == before

    @pytest.mark.parametrize(
        ("content", "kind"),
        [
            (b"<html><body>404 Not Found</body></html>\n", "bad_header"),
            (b"latitude,longitude\n39.9,116.3\n", "bad_header"),
            (b"", "empty_file"),
        ],
    )
    def test_a_file_that_is_not_a_geolife_plt_is_rejected(self, tmp_path, sample_dir, store, content, kind):
        dump = tmp_path / "dump"
        add_user(dump, sample_dir, OTHER_USER)
        add_user(dump, sample_dir, USER)
        bad = dump / "Data" / "087" / "Trajectory" / "20990101000000.plt"
        bad.write_bytes(content)
        with pytest.raises(DumpRejected) as err:
            plan_merge("dump-y", dump, store)
        message = str(err.value)
        assert message.startswith("dump-y: 1 file(s) of user 087 do not parse")
        assert "20990101000000.plt" in message
        assert kind in message

    @pytest.mark.parametrize(
        "layout", ["empty", "readme only", "Data without user folders", "Data with files"]
    )
    def test_no_user_folders_is_not_geolife_layout(self, tmp_path, layout):
        dump = tmp_path / "dump"
        dump.mkdir()
        if layout == "readme only":
            (dump / "README.txt").write_bytes(b"hello")
        elif layout == "Data without user folders":
            (dump / "Data" / "notes" / "Trajectory").mkdir(parents=True)
            (dump / "Data" / "notes" / "Trajectory" / "a.plt").write_bytes(b"Geolife trajectory\n")
        elif layout == "Data with files":
            (dump / "Data").mkdir()
            (dump / "Data" / "20081023025304.plt").write_bytes(b"Geolife trajectory\n")
        with pytest.raises(DumpRejected, match=r"^d: not in GeoLife layout"):
            plan_merge("d", dump, tmp_path / "store")

    @pytest.mark.parametrize("layout", ["empty Trajectory", "no Trajectory", "other files"])
    def test_user_folders_without_plt_files_are_rejected(self, tmp_path, layout):
        dump = tmp_path / "dump"
        for user in ("087", "060"):
            folder = dump / "Data" / user
            if layout != "no Trajectory":
                (folder / "Trajectory").mkdir(parents=True)
            else:
                folder.mkdir(parents=True)
            if layout == "other files":
                (folder / "Trajectory" / "20081023025304.txt").write_bytes(b"Geolife trajectory\n")
                (folder / "labels.txt").write_bytes(b"x")
        with pytest.raises(DumpRejected, match=r"^d: no \.plt files"):
            plan_merge("d", dump, tmp_path / "store")

    @pytest.mark.parametrize(
        "prefix", ["", "Geolife Trajectories 1.3/", "download/Geolife Trajectories 1.3/", "a/b/c/"]
    )
    def test_data_may_sit_a_few_folders_down(self, tmp_path, sample_dir, store, prefix):
        dump = tmp_path / "dump"
        copies = add_user(dump / prefix, sample_dir, USER)
        (dump / "README.txt").write_bytes(b"a note beside the data")
        plan = plan_merge("d", dump, store)
        assert relatives(plan.new) == [f"Data/087/Trajectory/{p.name}" for p in copies[5:]]
        assert [f.source for f in plan.new] == copies[5:]
        assert len(plan.present) == 5

    def test_bare_user_folders_at_the_top(self, tmp_path, sample_dir, store):
        dump = tmp_path / "dump"
        new_user = add_user(dump, sample_dir, 178, data=False)
        known_user = add_user(dump, sample_dir, USER, data=False)
        plan = plan_merge("d", dump, store)
        assert relatives(plan.new) == [f"Data/087/Trajectory/{p.name}" for p in known_user[5:]] + [
            f"Data/178/Trajectory/{p.name}" for p in new_user
        ]
        assert plan.users == [USER, 178]

    def test_bad_rows_inside_a_good_file_are_accepted_and_counted(self, tmp_path, sample_dir, store):
        """Bad rows within the configured share: the file is merged, its bad rows counted."""
        dump = tmp_path / "dump"
        copies = add_user(dump, sample_dir, USER)
        target = copies[6]  # not yet in the store; 6 rows
        lines = target.read_bytes().split(b"\n")
        lines[8] = b"abc," + lines[8].split(b",", 1)[1]  # non-numeric latitude
        lines[10] = b"99.5," + lines[10].split(b",", 1)[1]  # latitude out of range
        target.write_bytes(b"\n".join(lines))
        plan = plan_merge("d", dump, store, max_bad_row_share=0.5)  # 2 of 6 rows bad: 33%
        assert target in [f.source for f in plan.new]
        assert len(plan.new) == 3
        assert plan.report.rows_skipped == 2
        assert plan.report.counts["non_numeric"] == 1
        assert plan.report.counts["out_of_range"] == 1
        assert plan.report.files_skipped == 0

    def test_more_bad_rows_than_the_share_rejects_the_dump_naming_the_file(self, tmp_path, sample_dir, store):
        dump = tmp_path / "dump"
        copies = add_user(dump, sample_dir, USER)
        target = copies[6]  # 6 rows, 2 of them made bad: 33% > the default 5%
        lines = target.read_bytes().split(b"\n")
        lines[8] = b"abc," + lines[8].split(b",", 1)[1]
        lines[10] = b"99.5," + lines[10].split(b",", 1)[1]
        target.write_bytes(b"\n".join(lines))
        before = tree(store)
        relative = f"Data/087/Trajectory/{target.name}"
        with pytest.raises(
            DumpRejected, match=rf"^d: {re.escape(relative)}: 2 bad rows of 6 \(33\.3%, more than"
        ):
            plan_merge("d", dump, store)
        assert tree(store) == before

    @pytest.mark.parametrize("rows", ["garbage rows", "header only"])
    def test_a_file_with_a_header_and_no_valid_row_rejects_the_dump(self, tmp_path, sample_dir, store, rows):
        """A valid GeoLife header over garbage (or nothing) would enter the append-only store for good."""
        dump = tmp_path / "dump"
        copies = add_user(dump, sample_dir, USER)
        header = b"".join(copies[0].read_bytes().splitlines(keepends=True)[:6])
        body = b"not,a,row\n??\n" * 3 if rows == "garbage rows" else b""
        bad = dump / "Data" / "087" / "Trajectory" / "20990101000000.plt"
        bad.write_bytes(header + body)
        with pytest.raises(DumpRejected) as err:
            plan_merge("d", dump, store)
        message = str(err.value)
        assert "Data/087/Trajectory/20990101000000.plt" in message
        assert "no valid row" in message or "do not parse" in message
        assert str(tmp_path) not in message  # named inside the dump, not by a staging path

    def test_rejections_name_the_path_inside_an_archive_not_the_staging_folder(
        self, tmp_path, sample_dir, store
    ):
        members = dump_members(sample_dir, prefix="Geolife Trajectories 1.3/")
        members["Geolife Trajectories 1.3/Data/087/Trajectory/20990101000000.plt"] = b"<html>503</html>\n"
        archive = write_zip(tmp_path / "dump.zip", members)
        root = unpack_dump(archive, tmp_path / "staging")
        with pytest.raises(DumpRejected) as err:
            plan_merge(archive.name, root, store)
        message = str(err.value)
        assert "dump.zip/Geolife Trajectories 1.3/Data/087/Trajectory/20990101000000.plt" in message
        assert "staging" not in message

    def test_unpacked_archive_plans_and_merges(self, tmp_path, sample_dir, store):
        members = dump_members(sample_dir, prefix="Geolife Trajectories 1.3/")
        members.update(dump_members(sample_dir, user=178, prefix="Geolife Trajectories 1.3/"))
        archive = write_zip(tmp_path / "dump.zip", members)
        root = unpack_dump(archive, tmp_path / "staging")
        plan = plan_merge(archive.name, root, store)
        assert apply_merge(plan, store) == [USER, 178]
        merged = tree(store)
        for name, data in members.items():
            assert merged[name.removeprefix("Geolife Trajectories 1.3/")] == data


# --------------------------------------------------------------------------- #
# apply_merge
# --------------------------------------------------------------------------- #


class TestApplyMerge:
    @pytest.fixture
    def plan(self, tmp_path, sample_dir, store) -> MergePlan:
        dump = tmp_path / "dump"
        add_user(dump, sample_dir, USER)  # 3 new days of a known user
        add_user(dump, sample_dir, 178)  # a new user
        add_user(dump, sample_dir, OTHER_USER)  # already there
        set_old(store)
        return plan_merge("d", dump, store)

    def test_copies_exactly_the_new_files(self, store, plan):
        before = tree(store)
        stats = {p: p.stat().st_mtime_ns for p in store.rglob("*") if p.is_file()}
        assert len(plan.new) == 4
        assert apply_merge(plan, store) == [USER, 178]
        after = tree(store)
        assert set(after) == set(before) | set(relatives(plan.new))
        for entry in plan.new:
            assert after[entry.relative] == entry.source.read_bytes()
            assert hash_file(store / entry.relative) == entry.digest
        for path, mtime in stats.items():  # files already there are not touched
            assert path.stat().st_mtime_ns == mtime
            assert after[str(path.relative_to(store))] == before[str(path.relative_to(store))]

    def test_leaves_no_temporary_files(self, store, plan):
        apply_merge(plan, store)
        leftovers = [p for p in store.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
        assert leftovers == []
        assert all(p.suffix == ".plt" for p in store.rglob("*") if p.is_file())

    def test_applying_the_same_plan_twice_is_harmless(self, store, plan):
        assert apply_merge(plan, store) == [USER, 178]
        once = tree(store)
        assert apply_merge(plan, store) == [USER, 178]
        assert tree(store) == once
        assert not [p for p in store.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]

    def test_after_merging_the_same_dump_brings_nothing(self, tmp_path, store, plan):
        apply_merge(plan, store)
        again = plan_merge("d", tmp_path / "dump", store)
        assert again.new == []
        assert len(again.present) == 8 + 1 + 2

    @pytest.mark.parametrize("mode", [0o664, 0o640])
    def test_merged_files_get_the_store_permissions(self, store, plan, mode):
        """Not the temporary file's 0600: a team's store stays readable by its group."""
        for path in store.rglob("*.plt"):
            path.chmod(mode)
        apply_merge(plan, store)
        for entry in plan.new:
            assert stat.S_IMODE((store / entry.relative).stat().st_mode) == mode, entry.relative

    def test_a_new_store_gets_the_umask_permissions(self, tmp_path, sample_dir):
        dump = tmp_path / "dump"
        add_user(dump, sample_dir, USER)
        store = tmp_path / "new-store"
        plan = plan_merge("d", dump, store)
        old = os.umask(0o002)
        try:
            apply_merge(plan, store)
        finally:
            os.umask(old)
        assert {stat.S_IMODE(p.stat().st_mode) for p in store.rglob("*.plt")} == {0o664}

    def test_an_empty_plan_changes_nothing(self, store):
        before = tree(store)
        assert apply_merge(MergePlan("nothing"), store) == []
        assert tree(store) == before
