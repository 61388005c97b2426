"""Hostile raw input: every kind of bad input is named, counted, and costs nothing but itself.

For each kind of bad input these tests show (1) a clear message naming the file and the line (or the user
folder), (2) that every good row beside it is kept with its exact values, and (3) that it is counted in the
ingest report the way the pipeline writes it (``tasks.preprocess.write_ingest_report`` merges the reports
of :func:`nextloc.io.geolife.list_user_dirs` and :func:`nextloc.io.geolife.read_user` through
``to_dict``/``from_dict``; :func:`ingest_tree` below does the same without Prefect).

They complement ``test_geolife.py`` (one corruption at a time) and ``test_download.py``; the map of which
test proves what is ``docs/hostile-inputs.md``. Real files of the GeoLife sample are copied into
``tmp_path`` and corrupted there; line numbers are 1-based within the file and count the 6 header lines.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import stat
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from nextloc.io.geolife import (
    FEET_TO_M,
    POSITIONFIXES_SCHEMA,
    IngestReport,
    list_plt_files,
    list_user_dirs,
    read_user,
)
from nextloc.preprocessing.staypoints import generate_staypoints
from nextloc.raw.download import UnsafeArchiveError, extract_geolife

# Once a flow test has configured Prefect logging, the reader's skip warnings also try to reach the Prefect
# API, which warns outside a flow run. That is Prefect plumbing, not the reader's behaviour.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Logger 'nextloc.io.geolife' attempted to send logs:UserWarning"
)

HEADER = [
    b"Geolife trajectory",
    b"WGS 84",
    b"Altitude is in Feet",
    b"Reserved 3",
    b"0,2,255,My Track,0,0,2,8421376",
    b"0",
]
COLUMNS = ["latitude", "longitude", "zero", "altitude_ft", "days", "date", "time"]
SMALL_USER = "087"  # 8 real files, 6..36 rows each
BIG_FILE = ("011", "20080926104408.plt")  # 508 real rows
STAY_FILE = ("181", "20071208010931.plt")  # 93 real rows, 5 staypoints
TOP = "Geolife Trajectories 1.3"


# ----------------------------------------------------------------------------------------------- helpers


def real_files(sample_dir: Path, user: str = SMALL_USER) -> list[Path]:
    files = list_plt_files(sample_dir / "Data" / user)
    assert files, f"no .plt files for user {user} in the sample"
    return files


def user_folder(root: Path, user: str) -> Path:
    folder = root / "Data" / user / "Trajectory"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def data_rows(path: Path) -> list[bytes]:
    """The data rows of a real .plt file (CRLF line ends), without line endings."""
    lines = path.read_bytes().split(b"\r\n")
    assert lines[-1] == b"", "real GeoLife files end with CRLF"
    return lines[len(HEADER) : -1]


def write_plt(path: Path, rows: list[bytes], header: list[bytes] = HEADER, tail: bytes = b"\r\n") -> Path:
    """Header and rows joined with CRLF; ``tail`` ends the last line (b"" = cut off mid-line)."""
    path.write_bytes(b"\r\n".join([*header, *rows]) + tail)
    return path


def reference(path: Path) -> pd.DataFrame:
    """trackintel ``read_geolife`` semantics, read independently with pandas from a clean file."""
    df = pd.read_csv(path, skiprows=6, header=None, names=COLUMNS)
    tracked_at = pd.to_datetime(df["date"] + " " + df["time"], format="%Y-%m-%d %H:%M:%S")
    return pd.DataFrame(
        {
            "tracked_at": tracked_at.dt.tz_localize("UTC"),
            "latitude": df["latitude"].astype("float64"),
            "longitude": df["longitude"].astype("float64"),
            "elevation": df["altitude_ft"].astype("float64") * FEET_TO_M,
        }
    )


def assert_rows(table: pa.Table, expected: pd.DataFrame, user_id: int) -> None:
    """``table`` holds exactly ``expected``'s rows, in order, with exact float values."""
    assert table.schema.equals(POSITIONFIXES_SCHEMA)
    got = table.to_pandas()
    assert len(got) == len(expected)
    assert (got["user_id"] == user_id).all()
    assert got["tracked_at"].tolist() == expected["tracked_at"].tolist()
    for col in ("latitude", "longitude", "elevation"):
        np.testing.assert_array_equal(got[col].to_numpy(), expected[col].to_numpy(), err_msg=col)


def ingest_tree(root: Path) -> tuple[dict[int, pa.Table], dict]:
    """What the preprocess flow does with a raw tree: discover, read every user, merge the reports.

    Returns the positionfixes per user and the ``ingest_report.json`` summary (``IngestReport.to_dict``).
    """
    users, discovery = list_user_dirs(root)
    total = IngestReport.from_dict(discovery.to_dict())
    tables = {}
    for user_id, folder in users:
        table, report = read_user(user_id, list_plt_files(folder))
        tables[user_id] = table
        total.merge(IngestReport.from_dict(report.to_dict()))
    return tables, total.to_dict()


# ---------------------------------------------------------------------------------- every kind, together


class TestEveryKindInOneRealUser:
    """All of user 087's real files, each damaged in a different way, read in one pass."""

    def test_each_damage_is_reported_where_it_is_and_all_good_rows_are_kept(
        self, sample_dir: Path, tmp_path: Path
    ) -> None:
        src = real_files(sample_dir)
        assert len(src) == 8
        folder = user_folder(tmp_path, SMALL_USER)
        rows = [data_rows(f) for f in src]
        refs = [reference(f) for f in src]
        paths = [folder / f.name for f in src]
        expected_parts: list[pd.DataFrame] = []
        expected_issues: list[tuple[Path, int | None, str]] = []

        def replace_row(i: int, index: int, new: bytes, kind: str) -> None:
            rows[i][index] = new
            write_plt(paths[i], rows[i])
            expected_parts.append(refs[i].drop(index=index))
            expected_issues.append((paths[i], 7 + index, kind))

        # 0: a malformed row (text where a row should be)
        replace_row(0, 3, b"<html><body>503 Service Unavailable</body></html>", "field_count")
        # 1: wrong field count (an 8th field)
        replace_row(1, 1, rows[1][1] + b",1", "field_count")
        # 2: non-numeric coordinate
        replace_row(2, 5, b"39.98a" + rows[2][5][rows[2][5].index(b",") :], "non_numeric")
        # 3: coordinate out of range
        replace_row(3, 2, b"139.98" + rows[3][2][rows[3][2].index(b",") :], "out_of_range")
        # 4: non-UTF-8 bytes in a data row and in a header line (the header's are harmless)
        rows[4][0] = rows[4][0].replace(b",0,", b",\xe9\xff,", 1)
        write_plt(
            paths[4], rows[4], header=[*HEADER[:4], b"0,2,255,Mein Tr\xe4ck \xd6\xd0\xce\xc4,0,0,2,0", b"0"]
        )
        expected_parts.append(refs[4].drop(index=0))
        expected_issues.append((paths[4], 7, "non_ascii"))
        # 5: cut off mid-line (no line end, 4 of 7 fields of the last row)
        cut = b",".join(rows[5][-1].split(b",")[:4])[:-2]
        write_plt(paths[5], [*rows[5][:-1], cut], tail=b"")
        expected_parts.append(refs[5].iloc[:-1])
        expected_issues.append((paths[5], 6 + len(rows[5]), "field_count"))
        # 6: times out of order and duplicated: valid rows, kept as they are (see TestTimesOutOfOrder)
        order = [3, 0, 1, 1, 2, 5, 4]
        write_plt(paths[6], [rows[6][i] for i in order])
        expected_parts.append(refs[6].iloc[order])
        # 7: a header line missing, and a bad timestamp two rows later (lines shift up by one)
        rows[7][2] = rows[7][2].rsplit(b",", 1)[0] + b",7:20:55"
        write_plt(paths[7], rows[7], header=[h for h in HEADER if h != b"Reserved 3"])
        expected_parts.append(refs[7].drop(index=2))
        expected_issues += [(paths[7], 6, "short_header"), (paths[7], 8, "bad_timestamp")]
        # and two files that are not trajectories at all
        empty = folder / "20070815050000.plt"
        empty.write_bytes(b"")
        csv = write_plt(folder / "20070817000000.plt", [b"39.9,116.3"], header=[b"lat,lon"])

        tables, summary = ingest_tree(tmp_path)

        assert list(tables) == [87]
        assert_rows(tables[87], pd.concat(expected_parts, ignore_index=True), user_id=87)
        assert summary["counts"] == {
            "bad_header": 1,
            "bad_timestamp": 1,
            "empty_file": 1,
            "field_count": 3,
            "non_ascii": 1,
            "non_numeric": 1,
            "out_of_range": 1,
            "short_header": 1,
        }
        assert (summary["files_read"], summary["files_skipped"]) == (8, 2)
        assert summary["rows_skipped"] == 7
        assert summary["rows_read"] == tables[87].num_rows == sum(len(r) for r in rows) - 7 + 1  # 6: +1 dup
        messages = summary["issues"]
        assert len(messages) == len(expected_issues) + 2
        for path, line, kind in expected_issues:
            assert sum(m.startswith(f"{path}:{line}: {kind}: ") for m in messages) == 1, (path, line, kind)
        assert f"{empty}: empty_file: file is empty" in messages
        assert f"{csv}:1: bad_header: not a GeoLife .plt header (first line 'lat,lon')" in messages


# ------------------------------------------------------------------------------------------- the messages


class TestMessagesAreClear:
    """The issue text says where (file:line), what kind, and shows the offending value."""

    @pytest.mark.parametrize(
        ("row", "kind", "fragments"),
        [
            pytest.param(
                b"39.97,116.33,0,715.2,39309.03",
                "field_count",
                ["expected 7 comma-separated fields, got 5: '39.97,116.33,0,715.2,39309.03'"],
                id="field-count",
            ),
            pytest.param(
                b"39.97;116.33;0;715.2;39309.03;2007-08-15;00:48:31",
                "field_count",
                ["got 1: '39.97;116.33;"],
                id="malformed-separator",
            ),
            pytest.param(
                b"N39.97,116.33,0,715.2,39309.03,2007-08-15,00:48:31",
                "non_numeric",
                ["latitude/longitude/altitude not numeric: 'N39.97,116.33,"],
                id="non-numeric",
            ),
            pytest.param(
                b"39.97,216.33,0,715.2,39309.03,2007-08-15,00:48:31",
                "out_of_range",
                ["coordinates out of range (lat=39.97, lon=216.33)"],
                id="out-of-range",
            ),
            pytest.param(
                b"39.97,116.33,0,715.2,39309.03,15.08.2007,00:48:31",
                "bad_timestamp",
                ["date/time not YYYY-MM-DD,HH:MM:SS: '15.08.2007','00:48:31'"],
                id="malformed-date",
            ),
            pytest.param(
                b"39.97,116.33,0,715.2,39309.03,2007-02-30,00:48:31",
                "bad_timestamp",
                ["invalid date/time 2007-02-30 00:48:31"],
                id="impossible-date",
            ),
            pytest.param(
                b"39.97,116.33,0,715.2,39309.03,2007-08-15,00:48:31 \xb0",
                "non_ascii",
                ["row contains non-ASCII bytes: b'39.97,116.33,0,715.2,39309.03,2007-08-15,00:48:31 \\xb0"],
                id="non-utf8",
            ),
            pytest.param(b"", "empty_row", ["blank line"], id="blank"),
        ],
    )
    def test_row_issue_message(
        self, sample_dir: Path, tmp_path: Path, row: bytes, kind: str, fragments: list[str]
    ) -> None:
        src = real_files(sample_dir)[0]
        rows = data_rows(src)
        rows.insert(4, row)
        path = write_plt(user_folder(tmp_path, SMALL_USER) / src.name, rows)
        table, report = read_user(87, [path])
        assert_rows(table, reference(src), user_id=87)
        [message] = report.to_dict()["issues"]
        assert message.startswith(f"{path}:11: {kind}: "), message
        for fragment in fragments:
            assert fragment in message, message

    def test_file_and_folder_issue_messages(self, sample_dir: Path, tmp_path: Path) -> None:
        """Whole-file and whole-folder problems name the file (or the user) without a line, except a bad
        header, which is line 1, and a short header, which names the first line read as data."""
        good = real_files(sample_dir)[0]
        folder = user_folder(tmp_path, SMALL_USER)
        shutil.copyfile(good, folder / good.name)
        empty = folder / "20070101000000.plt"
        empty.write_bytes(b"\r\n")
        other = write_plt(folder / "20070101000001.plt", data_rows(good), header=[b"<?xml version='1.0'?>"])
        short = write_plt(folder / "20070101000002.plt", data_rows(good), header=HEADER[:5])
        user_folder(tmp_path, "042")  # an empty Trajectory folder
        (tmp_path / "Data" / "backup").mkdir()
        tables, summary = ingest_tree(tmp_path)
        assert sorted(tables) == [42, 87]
        assert summary["issues"] == [
            f"{tmp_path / 'Data' / 'backup'}: not_a_user_folder: folder name is not a user number",
            "user 042: empty_user: no .plt files",
            f"{empty}: empty_file: file is empty",
            f"{other}:1: bad_header: not a GeoLife .plt header (first line \"<?xml version='1.0'?>\")",
            f"{short}:6: short_header: header has 5 lines, expected 6; line 6 is read as data",
        ]
        assert summary["counts"] == {
            "bad_header": 1,
            "empty_file": 1,
            "empty_user": 1,
            "not_a_user_folder": 1,
            "short_header": 1,
        }


# --------------------------------------------------------------------------------- non-UTF-8 in a header


class TestNonUtf8Header:
    """Header lines 2-6 carry no data (trackintel skips them unread): any bytes there are harmless."""

    @pytest.mark.parametrize("line", [2, 3, 4, 5, 6])
    @pytest.mark.parametrize(
        "junk",
        [
            pytest.param("Mein Träck".encode("latin-1"), id="latin-1"),
            pytest.param("我的轨迹".encode("gbk"), id="gbk"),
            pytest.param(b"\xc3\x28\xa0\xa1\xf0\x28\x8c\xbc", id="invalid-utf8"),
            pytest.param(b"\x00\x01\x7f\xfe\xff", id="binary"),
        ],
    )
    def test_header_line_with_non_utf8_bytes_keeps_every_row(
        self, sample_dir: Path, tmp_path: Path, line: int, junk: bytes
    ) -> None:
        src = real_files(sample_dir)[0]
        header = list(HEADER)
        header[line - 1] = header[line - 1] + b" " + junk
        path = write_plt(tmp_path / src.name, data_rows(src), header=header)
        table, report = read_user(87, [path])
        assert report.issues == []
        assert (report.files_read, report.rows_read) == (1, len(data_rows(src)))
        assert_rows(table, reference(src), user_id=87)

    def test_non_utf8_after_the_geolife_title_is_accepted(self, sample_dir: Path, tmp_path: Path) -> None:
        src = real_files(sample_dir)[0]
        path = write_plt(
            tmp_path / src.name, data_rows(src), header=[b"Geolife trajectory \xa9\xff", *HEADER[1:]]
        )
        table, report = read_user(87, [path])
        assert report.issues == []
        assert_rows(table, reference(src), user_id=87)

    def test_utf8_byte_order_mark_is_not_a_bad_header(self, sample_dir: Path, tmp_path: Path) -> None:
        """A UTF-8 BOM (saved by a Windows editor) before ``Geolife trajectory``: trackintel reads the file
        (it skips 6 lines unread), so nextloc must too, rows and line numbers unchanged."""
        src = real_files(sample_dir)[0]
        rows = data_rows(src)
        rows[1] = b"garbage"
        path = write_plt(tmp_path / src.name, rows, header=[b"\xef\xbb\xbf" + HEADER[0], *HEADER[1:]])
        table, report = read_user(87, [path])
        assert_rows(table, reference(src).drop(index=1), user_id=87)
        assert report.counts == Counter({"field_count": 1})
        assert [(i.file, i.line) for i in report.issues] == [(str(path), 8)]

    def test_non_utf8_title_line_is_a_bad_header_with_a_readable_message(
        self, sample_dir: Path, tmp_path: Path
    ) -> None:
        files = real_files(sample_dir)[:3]
        folder = user_folder(tmp_path, SMALL_USER)
        for f in files:
            shutil.copyfile(f, folder / f.name)
        bad = write_plt(
            folder / files[1].name, data_rows(files[1]), header=["轨迹".encode("gbk"), *HEADER[1:]]
        )
        tables, summary = ingest_tree(tmp_path)
        assert_rows(tables[87], pd.concat([reference(files[0]), reference(files[2])], ignore_index=True), 87)
        assert summary["counts"] == {"bad_header": 1}
        assert (summary["files_read"], summary["files_skipped"]) == (2, 1)
        # undecodable bytes are shown as U+FFFD, never raised
        assert summary["issues"] == [
            f"{bad}:1: bad_header: not a GeoLife .plt header (first line '{'轨迹'.encode('gbk').decode('utf-8', 'replace')}')"
        ]


# ---------------------------------------------------------------------------- times out of order / duplicated


class TestTimesOutOfOrder:
    """Out-of-order and duplicated times are valid GeoLife rows: the reader keeps them in file order (no
    issue, by design: trackintel ``read_geolife`` does the same); staypoint generation then sorts stably by
    time and drops exact duplicates, counting them (``n_duplicates``, reported by the preprocess flow as
    ``positionfixes_duplicates``)."""

    def test_shuffled_and_duplicated_rows_give_the_clean_file_staypoints(
        self, sample_dir: Path, tmp_path: Path
    ) -> None:
        src = sample_dir / "Data" / STAY_FILE[0] / "Trajectory" / STAY_FILE[1]
        rows = data_rows(src)
        rng = np.random.default_rng(7)
        order = rng.permutation(len(rows))
        dup = rng.choice(len(rows), size=25, replace=False)
        messy = [rows[i] for i in order] + [rows[i] for i in dup]
        path = write_plt(tmp_path / src.name, messy)

        table, report = read_user(181, [path])
        clean, _ = read_user(181, [src])
        assert report.issues == []
        assert report.rows_read == table.num_rows == len(rows) + 25
        assert_rows(table, reference(src).iloc[np.r_[order, dup]], user_id=181)

        got = generate_staypoints(table.to_pandas())
        want = generate_staypoints(clean.to_pandas())
        assert got.n_duplicates == 25
        assert want.n_duplicates == 0
        assert got.n_pfs == want.n_pfs == len(rows)
        assert len(want.staypoints) == 5
        pd.testing.assert_frame_equal(got.staypoints, want.staypoints)


# --------------------------------------------------------------------------------------- empty user folder


class TestEmptyUserFolders:
    def test_empty_user_folders_among_real_users(self, sample_dir: Path, tmp_path: Path) -> None:
        """A user folder without anything in it, one with an empty ``Trajectory`` folder and one with only
        zero-byte files: each is named in the report; the real users beside them are read in full."""
        real = {11: "011", 87: SMALL_USER}
        for user in real.values():
            shutil.copytree(sample_dir / "Data" / user, tmp_path / "Data" / user)
        (tmp_path / "Data" / "050").mkdir()
        user_folder(tmp_path, "051")
        zero = user_folder(tmp_path, "052")
        for name in ("20090101000000.plt", "20090102000000.plt"):
            (zero / name).write_bytes(b"")

        tables, summary = ingest_tree(tmp_path)

        assert sorted(tables) == [11, 50, 51, 52, 87]
        for uid, user in real.items():
            files = real_files(sample_dir, user)
            assert_rows(tables[uid], pd.concat([reference(f) for f in files], ignore_index=True), uid)
        for uid in (50, 51, 52):
            assert tables[uid].num_rows == 0
            assert tables[uid].schema.equals(POSITIONFIXES_SCHEMA)
        assert summary["counts"] == {"empty_user": 2, "empty_file": 2}
        assert summary["files_skipped"] == 2
        assert summary["rows_skipped"] == 0
        assert summary["issues"] == [
            "user 050: empty_user: no .plt files",
            "user 051: empty_user: no .plt files",
            f"{zero / '20090101000000.plt'}: empty_file: file is empty",
            f"{zero / '20090102000000.plt'}: empty_file: file is empty",
        ]


# ------------------------------------------------------------------------------------------------- zips


def _zip(path: Path, entries: list[tuple[str | zipfile.ZipInfo, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in entries:
            zf.writestr(name, content)
    return path


def _symlink_entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


class TestHostileZips:
    """A zip with an unsafe entry is refused as a whole, before anything is written, naming the entry;
    a previous good extraction in the same folder is left untouched."""

    @pytest.fixture
    def plt(self, sample_dir: Path) -> bytes:
        return real_files(sample_dir)[0].read_bytes()

    @pytest.mark.parametrize(
        ("bad_name", "reason"),
        [
            pytest.param("..\\evil.plt", "parent-directory reference", id="backslash-dotdot"),
            pytest.param(f"{TOP}\\..\\..\\evil.plt", "parent-directory reference", id="backslash-nested"),
            pytest.param("./../evil.plt", "parent-directory reference", id="dot-dotdot"),
            pytest.param(
                f"{TOP}/Data/000/Trajectory/../../../../evil.plt", "parent-directory reference", id="deep"
            ),
            pytest.param("C:\\evil.plt", "absolute path", id="drive-backslash"),
            pytest.param("\\evil.plt", "absolute path", id="root-backslash"),
            pytest.param("//server/share/evil.plt", "absolute path", id="unc"),
        ],
    )
    def test_traversal_entry_refuses_archive_and_keeps_previous_tree(
        self, tmp_path: Path, plt: bytes, bad_name: str, reason: str
    ) -> None:
        good_zip = _zip(tmp_path / "good.zip", [(f"{TOP}/Data/087/Trajectory/a.plt", plt)])
        out = tmp_path / "deep" / "out"
        root = extract_geolife(good_zip, out)
        bad_zip = _zip(
            tmp_path / "bad.zip", [(f"{TOP}/Data/087/Trajectory/b.plt", plt), (bad_name, b"pwned")]
        )
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

        with pytest.raises(UnsafeArchiveError) as info:
            extract_geolife(bad_zip, out)

        assert str(info.value) == f"unsafe archive member {bad_name!r}: {reason}"
        assert info.value.member == bad_name
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
        assert (root / "Data" / "087" / "Trajectory" / "a.plt").read_bytes() == plt

    @pytest.mark.parametrize("target", ["087", "/etc", "../../.."])
    def test_any_symlink_entry_is_refused(self, tmp_path: Path, plt: bytes, target: str) -> None:
        """Even a link pointing inside the archive: a later entry could be written through it."""
        link = f"{TOP}/Data/088"
        bad_zip = _zip(
            tmp_path / "link.zip",
            [
                (f"{TOP}/Data/087/Trajectory/a.plt", plt),
                (_symlink_entry(link), target.encode()),
                (f"{TOP}/Data/088/Trajectory/b.plt", plt),
            ],
        )
        out = tmp_path / "out"
        with pytest.raises(UnsafeArchiveError, match="symbolic link") as info:
            extract_geolife(bad_zip, out)
        assert info.value.member == link
        assert list(out.iterdir()) == []

    def test_existing_symlink_in_the_output_folder_is_not_followed(self, tmp_path: Path, plt: bytes) -> None:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        out = tmp_path / "out"
        out.mkdir()
        os.symlink(elsewhere, out / TOP)
        good_zip = _zip(tmp_path / "g.zip", [(f"{TOP}/Data/087/Trajectory/a.plt", plt)])
        with pytest.raises(UnsafeArchiveError, match="resolves outside the extraction folder"):
            extract_geolife(good_zip, out)
        assert list(elsewhere.iterdir()) == []
        assert sorted(p.name for p in out.iterdir()) == [TOP]

    def test_zip_cut_off_mid_download_is_refused(self, tmp_path: Path, plt: bytes) -> None:
        """A truncated zip raises :class:`zipfile.BadZipFile` and writes nothing. Its message (from the
        standard library) does not name the file; the caller knows which archive it opened."""
        data = _zip(tmp_path / "g.zip", [(f"{TOP}/Data/087/Trajectory/a.plt", plt)]).read_bytes()
        cut = tmp_path / "cut.zip"
        cut.write_bytes(data[: len(data) // 2])
        out = tmp_path / "out"
        with pytest.raises(zipfile.BadZipFile):
            extract_geolife(cut, out)
        assert list(out.iterdir()) == []


# -------------------------------------------------------------------------------------------- a huge file

HUGE_ROWS = 1_000_000
HUGE_T0 = dt.datetime(2008, 1, 1)


@pytest.fixture(scope="module")
def huge(
    sample_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[str, np.ndarray]]]:
    """A 1,000,000-row .plt (~70 MB) built from one real file's rows, repeated with times one second apart.

    Yields the file and the values every row must have (computed from the text, not by the reader).
    """
    src = sample_dir / "Data" / BIG_FILE[0] / "Trajectory" / BIG_FILE[1]
    rows = data_rows(src)
    fields = [r.split(b",") for r in rows]
    prefixes = [b",".join(f[:4]) for f in fields]
    reps = -(-HUGE_ROWS // len(rows))
    first_days = (HUGE_T0 - dt.datetime(1899, 12, 30)).days
    n_days = HUGE_ROWS // 86_400 + 1
    dates = [f"{HUGE_T0 + dt.timedelta(days=d):%Y-%m-%d}".encode() for d in range(n_days)]
    clock = [f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}".encode() for s in range(86_400)]
    body = b"".join(
        b"%s,%.10f,%s,%s\r\n" % (p, first_days + s / 86_400, dates[s // 86_400], clock[s % 86_400])
        for s, p in zip(range(HUGE_ROWS), prefixes * reps, strict=False)
    )
    path = tmp_path_factory.mktemp("huge") / "20080101000000.plt"
    path.write_bytes(b"\r\n".join(HEADER) + b"\r\n" + body)
    del body

    def tiled(col: int) -> np.ndarray:
        return np.tile(np.array([float(f[col]) for f in fields]), reps)[:HUGE_ROWS]

    expected = {
        "tracked_at": np.datetime64(HUGE_T0, "ns") + np.arange(HUGE_ROWS).astype("timedelta64[s]"),
        "latitude": tiled(0),
        "longitude": tiled(1),
        "elevation": tiled(3) * FEET_TO_M,
    }
    yield path, expected
    path.unlink()  # ~70 MB: not kept among pytest's retained temp folders


def assert_huge(table: pa.Table, expected: dict[str, np.ndarray]) -> None:
    assert table.schema.equals(POSITIONFIXES_SCHEMA)
    assert table.num_rows == HUGE_ROWS
    np.testing.assert_array_equal(table.column("user_id").to_numpy(), np.full(HUGE_ROWS, 11, np.int32))
    times = table.column("tracked_at").cast(pa.timestamp("ns")).to_numpy()
    np.testing.assert_array_equal(times, expected["tracked_at"])
    for col in ("latitude", "longitude", "elevation"):
        np.testing.assert_array_equal(table.column(col).to_numpy(), expected[col], err_msg=col)


@pytest.mark.slow
class TestHugeFile:
    def test_read_completely_and_correctly(self, huge: tuple[Path, dict[str, np.ndarray]]) -> None:
        path, expected = huge
        assert path.stat().st_size > 50_000_000  # several pyarrow blocks (16 MiB each)
        table, report = read_user(11, [path])
        assert report.issues == []
        assert (report.files_read, report.files_skipped) == (1, 0)
        assert (report.rows_read, report.rows_skipped) == (HUGE_ROWS, 0)
        assert_huge(table, expected)
        assert table.column("tracked_at")[HUGE_ROWS - 1].as_py() == pd.Timestamp(
            HUGE_T0 + dt.timedelta(seconds=HUGE_ROWS - 1), tz="UTC"
        )

    @pytest.mark.parametrize(
        ("tail", "kind"),
        [
            pytest.param(b"39.9,116.3,0,1,39457.57,2008-01-12,13:46:40 \xe9\r\n", "non_ascii", id="non-utf8"),
            pytest.param(b"39.9756783,116.33", "field_count", id="cut-off-mid-line"),
        ],
    )
    def test_bad_row_at_the_very_end_is_reported_with_its_line(
        self, huge: tuple[Path, dict[str, np.ndarray]], tmp_path: Path, tail: bytes, kind: str
    ) -> None:
        path, expected = huge
        bad = tmp_path / path.name
        shutil.copyfile(path, bad)
        with bad.open("ab") as fh:
            fh.write(tail)
        table, report = read_user(11, [bad])
        assert report.counts == Counter({kind: 1})
        assert (report.rows_read, report.rows_skipped) == (HUGE_ROWS, 1)
        [issue] = report.issues
        assert (issue.file, issue.line, issue.kind) == (str(bad), 6 + HUGE_ROWS + 1, kind)
        assert str(issue).startswith(f"{bad}:1000007: {kind}: ")
        assert_huge(table, expected)
        bad.unlink()
