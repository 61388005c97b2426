"""Tests for :mod:`nextloc.io.geolife`: the GeoLife ``.plt`` reader.

Real files from the GeoLife sample are copied into ``tmp_path`` and corrupted there. Every bad-input test
checks three things: (a) every good row around the bad one is kept, with its values; (b) the report counts
the skip under the right kind; (c) the issue names the file and the 1-based line within the file (the 6
header lines count, so the first data row is line 7).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nextloc.io.geolife import (
    FEET_TO_M,
    MAX_ISSUES_KEPT,
    POSITIONFIXES_SCHEMA,
    IngestIssue,
    IngestReport,
    list_plt_files,
    list_user_dirs,
    read_user,
)

# Once a flow test has configured Prefect logging, the reader's skip warnings also try to reach the Prefect
# API, which warns outside a flow run. That is Prefect plumbing, not the reader's behaviour.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Logger 'nextloc.io.geolife' attempted to send logs:UserWarning"
)

REPO = Path(__file__).resolve().parents[3]
SAMPLE = Path(os.environ.get("NEXTLOC_SAMPLE_DIR", REPO.parent / "shared" / "data" / "geolife-sample"))
HEADER = [
    b"Geolife trajectory",
    b"WGS 84",
    b"Altitude is in Feet",
    b"Reserved 3",
    b"0,2,255,My Track,0,0,2,8421376",
    b"0",
]
FIRST_DATA_LINE = 7
COLUMNS = ["latitude", "longitude", "zero", "altitude_ft", "days", "date", "time"]
# The small real user 087 (8 files, 12..36 rows each).
SMALL_USER = "087"
SRC_A = "20070815003706.plt"  # 36 data rows
SRC_B = "20070815105144.plt"  # 33 data rows
SRC_C = "20070816010102.plt"  # 33 data rows
USER = 87
TRUNCATION_KINDS = {"field_count", "non_numeric", "bad_timestamp"}


# ----------------------------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def sample_root() -> Path:
    """The real GeoLife sample (``Data/NNN/Trajectory/*.plt``); skipped where it is not available."""
    if not (SAMPLE / "Data").is_dir():
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"GeoLife sample not found at {SAMPLE} (CI must have ../shared)")
        pytest.skip(f"GeoLife sample not found at {SAMPLE}")
    return SAMPLE


@pytest.fixture
def traj(tmp_path: Path) -> Path:
    """An empty ``Data/087/Trajectory`` folder in tmp_path."""
    folder = tmp_path / "Data" / SMALL_USER / "Trajectory"
    folder.mkdir(parents=True)
    return folder


def real(sample_root: Path, name: str, user: str = SMALL_USER) -> Path:
    return sample_root / "Data" / user / "Trajectory" / name


def copy(src: Path, folder: Path, name: str | None = None) -> Path:
    dst = folder / (name or src.name)
    shutil.copyfile(src, dst)
    return dst


def data_lines(path: Path) -> list[bytes]:
    """The data rows of a .plt file, without line endings."""
    lines = path.read_bytes().split(b"\r\n")
    assert lines[-1] == b"", "real GeoLife files end with CRLF"
    return lines[len(HEADER) : -1]


def write_plt(path: Path, rows: list[bytes], header: list[bytes] = HEADER, end: bytes = b"\r\n") -> Path:
    path.write_bytes(b"".join(line + end for line in [*header, *rows]))
    return path


def with_row_replaced(src: Path, dst: Path, line_no: int, new: bytes) -> tuple[Path, list[int]]:
    """Copy ``src`` to ``dst`` with the row at 1-based ``line_no`` replaced; also the kept row indices."""
    rows = data_lines(src)
    index = line_no - FIRST_DATA_LINE
    assert 0 <= index < len(rows)
    rows[index] = new
    write_plt(dst, rows)
    return dst, [i for i in range(len(rows)) if i != index]


def reference(path: Path) -> pd.DataFrame:
    """trackintel ``read_geolife`` semantics, read independently with pandas."""
    df = pd.read_csv(path, skiprows=6, header=None, names=COLUMNS)
    tracked_at = pd.to_datetime(df["date"] + " " + df["time"], format="%Y-%m-%d %H:%M:%S").dt.tz_localize(
        "UTC"
    )
    return pd.DataFrame(
        {
            "tracked_at": tracked_at,
            "latitude": df["latitude"].astype("float64"),
            "longitude": df["longitude"].astype("float64"),
            "elevation": df["altitude_ft"].astype("float64") * 0.3048,
        }
    )


def reference_of(*parts: pd.DataFrame) -> pd.DataFrame:
    return pd.concat(parts, ignore_index=True)


def assert_rows(table: pa.Table, expected: pd.DataFrame, user_id: int = USER) -> None:
    """``table`` holds exactly ``expected``'s rows, in order, with exact float values."""
    assert table.schema.equals(POSITIONFIXES_SCHEMA)
    got = table.to_pandas()
    assert len(got) == len(expected)
    assert (got["user_id"] == user_id).all()
    assert got["tracked_at"].tolist() == expected["tracked_at"].tolist()
    for col in ("latitude", "longitude", "elevation"):
        np.testing.assert_array_equal(got[col].to_numpy(), expected[col].to_numpy(), err_msg=col)


def only_issue(report: IngestReport) -> IngestIssue:
    assert len(report.issues) == 1, [str(i) for i in report.issues]
    return report.issues[0]


def assert_issue(issue: IngestIssue, path: Path, line: int | None, kind: str) -> None:
    assert issue.kind == kind, str(issue)
    assert issue.file == str(path)
    assert issue.line == line
    text = str(issue)
    where = f"{path}:{line}" if line is not None else str(path)
    assert text.startswith(where + ":"), text
    assert kind in text


def fmt_row(lat: float, lon: float, alt: float, when: dt.datetime) -> bytes:
    days = (when - dt.datetime(1899, 12, 30)).total_seconds() / 86400
    return f"{lat!r},{lon!r},0,{alt!r},{days!r},{when:%Y-%m-%d},{when:%H:%M:%S}".encode()


# ------------------------------------------------------------------------------------------ list_user_dirs


class TestListUserDirs:
    def test_real_sample_users_sorted(self, sample_root: Path) -> None:
        users, report = list_user_dirs(sample_root)
        expected = sorted(int(p.name) for p in (sample_root / "Data").iterdir() if p.is_dir())
        assert [uid for uid, _ in users] == expected
        assert all(path == sample_root / "Data" / f"{uid:03d}" for uid, path in users)
        assert report.issues == []
        assert sum(report.counts.values()) == 0

    def test_accepts_data_folder_itself(self, tmp_path: Path) -> None:
        for name in ("010", "002", "100"):
            (tmp_path / "Data" / name).mkdir(parents=True)
        users, _ = list_user_dirs(tmp_path / "Data")
        assert users == [
            (2, tmp_path / "Data" / "002"),
            (10, tmp_path / "Data" / "010"),
            (100, tmp_path / "Data" / "100"),
        ]
        assert list_user_dirs(tmp_path)[0] == users

    @pytest.mark.parametrize("bad_name", ["abc", "011_backup", "-12", "1.5", " 12", "²", "١٢"])
    def test_folder_not_a_user_number_is_reported(self, tmp_path: Path, bad_name: str) -> None:
        data = tmp_path / "Data"
        (data / "011").mkdir(parents=True)
        (data / "012").mkdir()
        (data / bad_name).mkdir()
        (data / "README.txt").write_text("a file, not a folder: ignored")
        users, report = list_user_dirs(tmp_path)
        assert users == [(11, data / "011"), (12, data / "012")]
        assert report.counts == Counter({"not_a_user_folder": 1})
        issue = only_issue(report)
        assert_issue(issue, data / bad_name, None, "not_a_user_folder")
        assert report.rows_skipped == 0

    def test_no_user_folders_raises(self, tmp_path: Path) -> None:
        (tmp_path / "Data" / "notes").mkdir(parents=True)
        with pytest.raises(FileNotFoundError, match="no GeoLife user folders"):
            list_user_dirs(tmp_path)

    def test_missing_root_raises(self, tmp_path: Path) -> None:
        with pytest.raises(FileNotFoundError, match="not found"):
            list_user_dirs(tmp_path / "nowhere")


# ------------------------------------------------------------------------------------------ list_plt_files


class TestListPltFiles:
    def test_sorted_by_name_plt_only(self, traj: Path) -> None:
        for name in ("20090101000000.plt", "20080101000000.plt", "20081231235959.PLT"):
            (traj / name).write_bytes(b"")
        (traj / "notes.txt").write_text("x")
        (traj / "20070101000000.plt.bak").write_text("x")
        (traj / "sub.plt").mkdir()
        (traj / ".plt").write_bytes(b"")  # a hidden name, no suffix
        (traj / "20100101000000.plt").symlink_to(traj / "20090101000000.plt")  # a link to a file counts
        (traj / "20110101000000.plt").symlink_to(traj / "gone.plt")  # a dangling link does not
        got = list_plt_files(traj.parent)
        assert [p.name for p in got] == [
            "20080101000000.plt",
            "20081231235959.PLT",
            "20090101000000.plt",
            "20100101000000.plt",
        ]
        assert got[0] == traj / "20080101000000.plt"

    def test_real_user_sorted(self, sample_root: Path) -> None:
        got = list_plt_files(sample_root / "Data" / SMALL_USER)
        assert len(got) == 8
        assert [p.name for p in got] == sorted(p.name for p in got)

    def test_user_without_trajectory_folder(self, tmp_path: Path) -> None:
        (tmp_path / "042").mkdir()
        assert list_plt_files(tmp_path / "042") == []

    def test_empty_trajectory_folder(self, traj: Path) -> None:
        assert list_plt_files(traj.parent) == []


# ----------------------------------------------------------------------------------------------- read_user


class TestReadUserRealData:
    def test_one_real_file_matches_pandas(self, sample_root: Path) -> None:
        path = real(sample_root, "20080926104408.plt", user="011")
        table, report = read_user(11, [path])
        assert_rows(table, reference(path), user_id=11)
        assert table.num_rows == 508
        assert (report.files_read, report.files_skipped, report.rows_read, report.rows_skipped) == (
            1,
            0,
            508,
            0,
        )
        assert report.issues == []
        first = table.slice(0, 1).to_pylist()[0]
        assert first["tracked_at"] == pd.Timestamp("2008-09-26 10:44:08", tz="UTC")
        assert first["latitude"] == 39.9756783
        assert first["longitude"] == 116.3308383
        assert first["elevation"] == 131.2 * FEET_TO_M

    @pytest.mark.parametrize("user", ["060", "087", "099", "181"])
    def test_whole_real_user_matches_pandas(self, sample_root: Path, user: str) -> None:
        files = list_plt_files(sample_root / "Data" / user)
        table, report = read_user(int(user), files)
        assert_rows(table, reference_of(*(reference(f) for f in files)), user_id=int(user))
        assert report.files_read == len(files)
        assert report.rows_read == table.num_rows
        assert report.rows_skipped == report.files_skipped == 0
        assert report.issues == []

    def test_fallback_parser_gives_identical_values(self, sample_root: Path, traj: Path) -> None:
        """One bad row sends its file down the row-by-row path; the good rows must equal the fast path's."""
        files = list_plt_files(sample_root / "Data" / "099")
        fast, _ = read_user(99, files)
        bad = write_plt(traj / "99999999999999.plt", [b"not,a,row"])
        slow, report = read_user(99, [*files, bad])
        assert report.counts == Counter({"field_count": 1})
        assert slow.equals(fast)

    def test_rows_keep_file_order(self, sample_root: Path, traj: Path) -> None:
        # Copy under names whose sort order is the reverse of the files' time order.
        c = copy(real(sample_root, SRC_C), traj, "20000101000000.plt")
        b = copy(real(sample_root, SRC_B), traj, "20000101000001.plt")
        a = copy(real(sample_root, SRC_A), traj, "20000101000002.plt")
        files = list_plt_files(traj.parent)
        assert files == [c, b, a]
        table, _ = read_user(USER, files)
        assert_rows(table, reference_of(reference(c), reference(b), reference(a)))
        # read_user itself keeps the order it is given.
        table2, _ = read_user(USER, [a, c, b])
        assert_rows(table2, reference_of(reference(a), reference(c), reference(b)))

    def test_times_out_of_order_and_duplicated_are_kept(self, sample_root: Path, traj: Path) -> None:
        rows = data_lines(real(sample_root, SRC_A))
        shuffled = [rows[5], rows[0], rows[3], rows[3], rows[1], rows[1], rows[1], *rows[6:], rows[2]]
        path = write_plt(traj / "20070815003706.plt", shuffled)
        table, report = read_user(USER, [path])
        assert report.issues == []
        assert report.rows_skipped == 0
        assert_rows(table, reference(path))
        times = table.column("tracked_at").to_pylist()
        assert times[0] > times[1]  # not sorted
        assert times[2] == times[3]  # not de-duplicated

    def test_lf_line_endings_also_work(self, sample_root: Path, traj: Path) -> None:
        src = real(sample_root, SRC_A)
        path = traj / src.name
        path.write_bytes(src.read_bytes().replace(b"\r\n", b"\n"))
        table, report = read_user(USER, [path])
        assert report.issues == []
        assert_rows(table, reference(src))

    def test_coordinate_bounds_are_valid(self, sample_root: Path, traj: Path) -> None:
        rows = [
            b"90,180,0,0,39309.0,2007-08-15,00:00:00",
            b"-90,-180,0,-777,39309.0,2007-08-15,00:00:01",
            b"0,0,0,0,39309.0,2007-08-15,23:59:59",
        ]
        path = write_plt(traj / "a.plt", rows)
        table, report = read_user(USER, [path])
        assert report.issues == []
        assert_rows(table, reference(path))

    def test_header_only_file_has_no_rows(self, traj: Path) -> None:
        path = write_plt(traj / "a.plt", [])
        table, report = read_user(USER, [path])
        assert table.num_rows == 0
        assert table.schema.equals(POSITIONFIXES_SCHEMA)
        assert report.issues == []
        assert report.files_read == 1


class TestReadUserBadRows:
    """A bad row in the middle of a real file, among other good files of the same user."""

    GOOD_ROW = b"39.9765833333333,116.3307,0,715.223097112861,39309.0336921296,2007-08-15,00:48:31"

    @pytest.mark.parametrize(
        ("row", "kind"),
        [
            pytest.param(b"this is not a GeoLife row", "field_count", id="garbage"),
            pytest.param(GOOD_ROW + b",extra", "field_count", id="8-fields"),
            pytest.param(GOOD_ROW.rsplit(b",", 1)[0], "field_count", id="6-fields"),
            pytest.param(GOOD_ROW.replace(b",", b";"), "field_count", id="semicolons"),
            pytest.param(b"abc,116.3307,0,715.2,39309.03,2007-08-15,00:48:31", "non_numeric", id="lat-text"),
            pytest.param(b"39.97,east,0,715.2,39309.03,2007-08-15,00:48:31", "non_numeric", id="lon-text"),
            pytest.param(b"39.97,116.33,0,high,39309.03,2007-08-15,00:48:31", "non_numeric", id="alt-text"),
            pytest.param(b",116.3307,0,715.2,39309.03,2007-08-15,00:48:31", "non_numeric", id="lat-empty"),
            pytest.param(
                b'"39.97",116.3307,0,715.2,39309.03,2007-08-15,00:48:31', "non_numeric", id="lat-quoted"
            ),
            pytest.param(
                b"3_9.97,116.3307,0,715.2,39309.03,2007-08-15,00:48:31", "non_numeric", id="lat-underscore"
            ),
            pytest.param(b"39.97,0x74,0,715.2,39309.03,2007-08-15,00:48:31", "non_numeric", id="lon-hex"),
            pytest.param(b"nan,116.3307,0,715.2,39309.03,2007-08-15,00:48:31", "non_numeric", id="lat-nan"),
            pytest.param(b"39.97,116.3307,0,inf,39309.03,2007-08-15,00:48:31", "non_numeric", id="alt-inf"),
            pytest.param(
                b"39.97,116.3307,0,1e400,39309.03,2007-08-15,00:48:31", "non_numeric", id="alt-overflow"
            ),
            pytest.param(b"39.97,116.3307,0,nan,39309.03,2007-08-15,00:48:31", "non_numeric", id="alt-nan"),
            pytest.param(
                b"90.000001,116.3307,0,715.2,39309.03,2007-08-15,00:48:31", "out_of_range", id="lat>90"
            ),
            pytest.param(b"-91,116.3307,0,715.2,39309.03,2007-08-15,00:48:31", "out_of_range", id="lat<-90"),
            pytest.param(b"39.97,180.5,0,715.2,39309.03,2007-08-15,00:48:31", "out_of_range", id="lon>180"),
            pytest.param(
                b"39.97,-1163.307,0,715.2,39309.03,2007-08-15,00:48:31", "out_of_range", id="lon<-180"
            ),
            pytest.param(
                b"400.166666666667,116.21539,0,0,40797.0,2011-09-11,00:48:31", "out_of_range", id="real-020"
            ),
            pytest.param(
                b"39.97,116.3307,0,715.2,39309.03,2007-08-15,00:48", "bad_timestamp", id="time-hh:mm"
            ),
            pytest.param(
                b"39.97,116.3307,0,715.2,39309.03,2007-08-15,24:00:00", "bad_timestamp", id="time-24h"
            ),
            pytest.param(
                b"39.97,116.3307,0,715.2,39309.03,2007-08-15,12:60:00", "bad_timestamp", id="time-60min"
            ),
            pytest.param(
                b"39.97,116.3307,0,715.2,39309.03,2007-08-15,0:48:31", "bad_timestamp", id="time-1-digit"
            ),
            pytest.param(
                b"39.97,116.3307,0,715.2,39309.03,2007-08-15,00:48:31.5", "bad_timestamp", id="time-frac"
            ),
            pytest.param(
                b"39.97,116.3307,0,715.2,39309.03,2007-02-30,00:48:31", "bad_timestamp", id="date-feb30"
            ),
            pytest.param(
                b"39.97,116.3307,0,715.2,39309.03,2007/08/15,00:48:31", "bad_timestamp", id="date-slashes"
            ),
            pytest.param(b"39.97,116.3307,0,715.2,39309.03,,00:48:31", "bad_timestamp", id="date-empty"),
            pytest.param(
                b"39.97\xff,116.3307,0,715.2,39309.03,2007-08-15,00:48:31", "non_ascii", id="latin1-lat"
            ),
            pytest.param(
                b"39.97,116.3307,0,715.2,39309.\xe9,2007-08-15,00:48:31", "non_ascii", id="latin1-days"
            ),
            pytest.param(
                b"39.97,116.3307,\xc3\xa9,715.2,39309.03,2007-08-15,00:48:31", "non_ascii", id="utf8-zero"
            ),
            pytest.param(b"\x80\x81\x82\x83", "non_ascii", id="binary"),
            pytest.param(b"", "empty_row", id="blank"),
            pytest.param(b"   \t ", "empty_row", id="whitespace"),
        ],
    )
    def test_bad_row_is_reported_and_neighbours_kept(
        self, sample_root: Path, traj: Path, row: bytes, kind: str
    ) -> None:
        a = copy(real(sample_root, SRC_A), traj)
        bad, kept = with_row_replaced(real(sample_root, SRC_B), traj / SRC_B, 12, row)
        c = copy(real(sample_root, SRC_C), traj)
        table, report = read_user(USER, [a, bad, c])

        expected_b = reference(real(sample_root, SRC_B)).iloc[kept]
        assert_rows(table, reference_of(reference(a), expected_b, reference(c)))
        assert report.counts == Counter({kind: 1})
        assert report.rows_skipped == 1
        assert report.rows_read == table.num_rows == 36 + 32 + 33
        assert (report.files_read, report.files_skipped) == (3, 0)
        assert_issue(only_issue(report), bad, 12, kind)

    @pytest.mark.parametrize("position", ["first", "second", "last"])
    def test_line_number_counts_header(self, sample_root: Path, traj: Path, position: str) -> None:
        src = real(sample_root, SRC_A)
        n = len(data_lines(src))
        line_no = {"first": 7, "second": 8, "last": 6 + n}[position]
        bad, kept = with_row_replaced(src, traj / src.name, line_no, b"1,2,3")
        table, report = read_user(USER, [bad])
        assert_rows(table, reference(src).iloc[kept])
        assert_issue(only_issue(report), bad, line_no, "field_count")

    def test_several_bad_rows_in_several_files(self, sample_root: Path, traj: Path) -> None:
        src_a, src_b = real(sample_root, SRC_A), real(sample_root, SRC_B)
        rows_a, rows_b = data_lines(src_a), data_lines(src_b)
        rows_a[0], rows_a[9], rows_b[-1] = b"x", b"91,0,0,0,0,2007-08-15,00:00:00", b""
        a = write_plt(traj / SRC_A, rows_a)
        b = write_plt(traj / SRC_B, rows_b)
        table, report = read_user(USER, [a, b])
        expected = reference_of(reference(src_a).drop(index=[0, 9]), reference(src_b).iloc[:-1])
        assert_rows(table, expected)
        assert report.counts == Counter({"field_count": 1, "out_of_range": 1, "empty_row": 1})
        assert [(i.file, i.line, i.kind) for i in report.issues] == [
            (str(a), 7, "field_count"),
            (str(a), 16, "out_of_range"),
            (str(b), 6 + len(rows_b), "empty_row"),
        ]
        assert report.rows_skipped == 3

    def test_blank_lines_between_and_after_rows(self, sample_root: Path, traj: Path) -> None:
        src = real(sample_root, SRC_A)
        rows = data_lines(src)
        path = write_plt(traj / src.name, [*rows[:3], b"", *rows[3:], b"", b""])
        table, report = read_user(USER, [path])
        assert_rows(table, reference(src))
        assert report.counts == Counter({"empty_row": 3})
        n = len(rows)
        assert [i.line for i in report.issues] == [10, 7 + n + 1, 7 + n + 2]
        assert all(i.file == str(path) for i in report.issues)

    def test_many_bad_rows_counted_beyond_kept_issues(self, traj: Path) -> None:
        good = b"39.9,116.3,0,100,39309.0,2007-08-15,00:00:00"
        n_bad = MAX_ISSUES_KEPT + 50
        rows = [good, *([b"bad"] * n_bad), good]
        path = write_plt(traj / "a.plt", rows)
        table, report = read_user(USER, [path])
        assert table.num_rows == 2
        assert report.counts == Counter({"field_count": n_bad})
        assert report.rows_skipped == n_bad
        assert len(report.issues) == MAX_ISSUES_KEPT
        assert [i.line for i in report.issues] == list(range(8, 8 + MAX_ISSUES_KEPT))


class TestReadUserBadFiles:
    def test_truncated_last_row_at_every_byte(self, sample_root: Path, traj: Path) -> None:
        """A file cut off anywhere inside its last row: that row is reported, all others kept."""
        src = real(sample_root, SRC_A)
        good = copy(real(sample_root, SRC_B), traj)
        raw = src.read_bytes()
        rows = data_lines(src)
        last = rows[-1]
        last_line = 6 + len(rows)
        body_end = len(raw) - 2 - len(last)  # where the last row starts
        expected = reference_of(reference(src).iloc[:-1], reference(good))
        failures = []
        for cut in range(1, len(last)):
            path = traj / "20070815003706.plt"
            path.write_bytes(raw[: body_end + cut])
            table, report = read_user(USER, [path, good])
            try:
                assert_rows(table, expected)
                issue = only_issue(report)
                assert issue.kind in TRUNCATION_KINDS, str(issue)
                assert_issue(issue, path, last_line, issue.kind)
                assert report.rows_skipped == 1
            except AssertionError as err:
                failures.append(f"cut after {last[:cut]!r}: {err}")
        assert not failures, "\n".join(failures)

    @pytest.mark.parametrize("tail", [b"", b"\r"], ids=["no-newline", "cr-only"])
    def test_complete_last_row_without_newline_is_kept(
        self, sample_root: Path, traj: Path, tail: bytes
    ) -> None:
        src = real(sample_root, SRC_A)
        path = traj / src.name
        path.write_bytes(src.read_bytes()[:-2] + tail)
        table, report = read_user(USER, [path])
        assert report.issues == []
        assert_rows(table, reference(src))

    @pytest.mark.parametrize("content", [b"", b"\r\n", b"  \r\n\r\n"], ids=["0-byte", "crlf", "blank"])
    def test_empty_file(self, sample_root: Path, traj: Path, content: bytes) -> None:
        a = copy(real(sample_root, SRC_A), traj)
        empty = traj / "20070815100000.plt"
        empty.write_bytes(content)
        c = copy(real(sample_root, SRC_C), traj)
        table, report = read_user(USER, [a, empty, c])
        assert_rows(table, reference_of(reference(a), reference(c)))
        assert report.counts == Counter({"empty_file": 1})
        assert (report.files_read, report.files_skipped, report.rows_skipped) == (2, 1, 0)
        assert_issue(only_issue(report), empty, None, "empty_file")

    @pytest.mark.parametrize(
        "header",
        [
            pytest.param([b"lat,lon,zero,alt,days,date,time"], id="csv-header"),
            pytest.param([b"Some other format", *HEADER[1:]], id="altered-first-line"),
            pytest.param([b"\xff\xfeG\x00e\x00o\x00", *HEADER[1:]], id="utf16-bom"),
        ],
    )
    def test_non_geolife_file_is_skipped(self, sample_root: Path, traj: Path, header: list[bytes]) -> None:
        a = copy(real(sample_root, SRC_A), traj)
        rows = data_lines(real(sample_root, SRC_B))
        other = write_plt(traj / "20070815105144.plt", rows, header=header)
        c = copy(real(sample_root, SRC_C), traj)
        table, report = read_user(USER, [a, other, c])
        assert_rows(table, reference_of(reference(a), reference(c)))
        assert report.counts == Counter({"bad_header": 1})
        assert (report.files_read, report.files_skipped) == (2, 1)
        assert_issue(only_issue(report), other, 1, "bad_header")

    @pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"], ids=["plain", "utf8-bom"])
    def test_headerless_file_keeps_its_rows(self, sample_root: Path, traj: Path, bom: bytes) -> None:
        """Valid GeoLife rows without the six header lines: every good row is read, a bad one is reported
        with its real line number, and the file gets a ``missing_header`` warning (it is not skipped)."""
        a = copy(real(sample_root, SRC_A), traj)
        src = real(sample_root, SRC_B)
        rows = data_lines(src)
        rows[3] = b"bad row"
        headerless = traj / src.name
        headerless.write_bytes(bom + b"\r\n".join(rows) + b"\r\n")
        table, report = read_user(USER, [a, headerless])
        assert_rows(table, reference_of(reference(a), reference(src).drop(index=3)))
        assert report.counts == Counter({"missing_header": 1, "field_count": 1})
        assert (report.files_read, report.files_skipped) == (2, 0)
        missing, bad = report.issues
        assert_issue(missing, headerless, 1, "missing_header")
        assert_issue(bad, headerless, 4, "field_count")  # line 4 of the file: no header lines before it

    @pytest.mark.parametrize("n_lines", [1, 3, 5])
    def test_file_cut_off_inside_header(self, sample_root: Path, traj: Path, n_lines: int) -> None:
        a = copy(real(sample_root, SRC_A), traj)
        cut = traj / "20070815105144.plt"
        cut.write_bytes(b"\r\n".join(HEADER[:n_lines]))
        table, report = read_user(USER, [a, cut])
        assert_rows(table, reference(a))
        assert report.counts == Counter({"bad_header": 1})
        assert_issue(only_issue(report), cut, 1, "bad_header")

    @pytest.mark.parametrize("missing", [1, 2, 3, 4, 5])
    def test_short_header_keeps_every_row(self, sample_root: Path, traj: Path, missing: int) -> None:
        """A GeoLife header with one line missing: no data row may be silently eaten as a header line."""
        src = real(sample_root, SRC_A)
        rows = data_lines(src)
        rows[4] = b"bad row"
        header = [line for i, line in enumerate(HEADER) if i != missing]
        path = write_plt(traj / src.name, rows, header=header)
        table, report = read_user(USER, [path])
        assert_rows(table, reference(src).drop(index=4))
        assert report.counts == Counter({"short_header": 1, "field_count": 1})
        short, bad = report.issues
        assert_issue(short, path, 6, "short_header")
        assert_issue(bad, path, 6 + 4, "field_count")  # real line numbers: the header has 5 lines

    def test_empty_user(self) -> None:
        table, report = read_user(5, [])
        assert table.num_rows == 0
        assert table.schema.equals(POSITIONFIXES_SCHEMA)
        assert report.counts == Counter({"empty_user": 1})
        issue = only_issue(report)
        assert issue.kind == "empty_user"
        assert "user 005" in str(issue)

    def test_empty_user_folder(self, traj: Path) -> None:
        table, report = read_user(USER, list_plt_files(traj.parent))
        assert table.num_rows == 0
        assert report.counts == Counter({"empty_user": 1})

    def test_user_with_only_bad_files(self, traj: Path) -> None:
        empty = traj / "a.plt"
        empty.write_bytes(b"")
        csv = traj / "b.plt"
        csv.write_bytes(b"lat,lon\r\n1,2\r\n")
        table, report = read_user(USER, [empty, csv])
        assert table.num_rows == 0
        assert table.schema.equals(POSITIONFIXES_SCHEMA)
        assert report.counts == Counter({"empty_file": 1, "bad_header": 1})
        assert (report.files_read, report.files_skipped) == (0, 2)

    def test_unreadable_file(self, sample_root: Path, traj: Path) -> None:
        a = copy(real(sample_root, SRC_A), traj)
        missing = traj / "20070815105144.plt"
        table, report = read_user(USER, [a, missing])
        assert_rows(table, reference(a))
        assert report.counts == Counter({"unreadable_file": 1})
        assert_issue(only_issue(report), missing, None, "unreadable_file")

    def test_only_the_files_with_bad_rows_are_read_row_by_row(
        self, sample_root: Path, traj: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Bad rows in two files among many: the other files stay on the columnar path, the rows keep the
        files' order and the issues come in file order."""
        import nextloc.io.geolife as geolife

        files = [copy(f, traj) for f in list_plt_files(sample_root / "Data" / SMALL_USER)]
        assert len(files) >= 4
        bad = [files[1], files[-1]]
        expected = [reference(f) for f in files]
        for path in bad:
            i = files.index(path)
            expected[i] = expected[i].drop(index=[2])
            lines = data_lines(path)
            lines[2] = b"x"
            write_plt(path, lines)
        slow_files: list[Path] = []
        row_by_row = geolife._parse_slow

        def spy(bodies, report):  # noqa: ANN001, ANN202
            slow_files.extend(p for p, _, _ in bodies)
            return row_by_row(bodies, report)

        monkeypatch.setattr(geolife, "_parse_slow", spy)
        table, report = read_user(USER, files)
        assert slow_files == bad
        assert_rows(table, reference_of(*expected))
        assert [(i.file, i.line, i.kind) for i in report.issues] == [(str(p), 9, "field_count") for p in bad]

    def test_one_bad_file_among_real_files_keeps_all_good_files(self, sample_root: Path, traj: Path) -> None:
        files = [copy(f, traj) for f in list_plt_files(sample_root / "Data" / SMALL_USER)]
        bad = traj / "20070815999999.plt"  # sorts among the real files
        bad.write_bytes(b"\r\n".join([*HEADER, b"39.9,116.3,0,1,39309.0,2007-08-15,00:00"]))
        all_files = list_plt_files(traj.parent)
        assert bad in all_files[1:-1]
        table, report = read_user(USER, all_files)
        assert_rows(table, reference_of(*(reference(f) for f in files)))
        assert report.counts == Counter({"bad_timestamp": 1})
        assert_issue(only_issue(report), bad, 7, "bad_timestamp")
        assert report.files_read == len(all_files)


# ------------------------------------------------------------------------------------------- IngestReport


class TestIngestReport:
    def test_merge_and_dict_round_trip(self) -> None:
        a, b = (
            IngestReport(files_read=2, rows_read=10),
            IngestReport(files_read=1, files_skipped=1, rows_read=5),
        )
        a.add(IngestIssue("x.plt", 7, "field_count", "m"), rows=1)
        b.add(IngestIssue("y.plt", None, "empty_file", "file is empty"))
        a.merge(b)
        assert (a.files_read, a.files_skipped, a.rows_read, a.rows_skipped) == (3, 1, 15, 1)
        assert a.counts == Counter({"field_count": 1, "empty_file": 1})
        data = a.to_dict()
        assert data["issues"] == ["x.plt:7: field_count: m", "y.plt: empty_file: file is empty"]
        back = IngestReport.from_dict(data)
        assert back.to_dict() == data

    def test_merge_caps_kept_issues(self) -> None:
        a, b = IngestReport(), IngestReport()
        for i in range(MAX_ISSUES_KEPT - 1):
            a.add(IngestIssue("a", i, "k", ""))
        for i in range(5):
            b.add(IngestIssue("b", i, "k", ""))
        a.merge(b)
        assert a.counts["k"] == MAX_ISSUES_KEPT + 4
        assert len(a.issues) == MAX_ISSUES_KEPT


# ------------------------------------------------------------------------------------------ property tests

_LAT = st.floats(-90, 90, allow_nan=False)
_LON = st.floats(-180, 180, allow_nan=False)
_ALT = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6) | st.floats(
    allow_nan=False, allow_infinity=False
)
_WHEN = st.datetimes(dt.datetime(2000, 1, 1), dt.datetime(2020, 12, 31, 23, 59, 59)).map(
    lambda d: d.replace(microsecond=0)
)
_ROW = st.tuples(_LAT, _LON, _ALT, _WHEN)
_BAD_ROW = st.sampled_from(
    [
        (b"", "empty_row"),
        (b"1,2,3", "field_count"),
        (b"91.5,10,0,1,40000.0,2009-06-01,12:00:00", "out_of_range"),
        (b"x,10,0,1,40000.0,2009-06-01,12:00:00", "non_numeric"),
        (b"10,10,0,1,40000.0,2009-06-01,12:00", "bad_timestamp"),
        (b"10,10,0,1,40000.0,2009-06-01,12:00:00\xff", "non_ascii"),
    ]
)
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _expected(rows: list[tuple[float, float, float, dt.datetime]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "tracked_at": pd.to_datetime([r[3] for r in rows]).tz_localize("UTC")
            if rows
            else pd.Series([], dtype="datetime64[ns, UTC]"),
            "latitude": np.array([r[0] for r in rows], dtype=np.float64),
            "longitude": np.array([r[1] for r in rows], dtype=np.float64),
            "elevation": np.array([r[2] for r in rows], dtype=np.float64) * 0.3048,
        }
    )


class TestReadUserProperties:
    @_SETTINGS
    @given(files=st.lists(st.lists(_ROW, min_size=0, max_size=30), min_size=1, max_size=4))
    def test_valid_rows_round_trip(self, files: list[list[tuple[float, float, float, dt.datetime]]]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            paths = [
                write_plt(Path(tmp) / f"{i:014d}.plt", [fmt_row(*r) for r in rows])
                for i, rows in enumerate(files)
            ]
            table, report = read_user(7, paths)
        assert report.issues == []
        assert report.rows_read == table.num_rows == sum(len(rows) for rows in files)
        assert_rows(table, _expected([r for rows in files for r in rows]), user_id=7)

    @_SETTINGS
    @given(
        rows=st.lists(_ROW, min_size=1, max_size=30),
        bad=_BAD_ROW,
        where=st.integers(min_value=0),
        other=st.lists(_ROW, min_size=0, max_size=10),
    )
    def test_one_bad_row_anywhere(
        self,
        rows: list[tuple[float, float, float, dt.datetime]],
        bad: tuple[bytes, str],
        where: int,
        other: list[tuple[float, float, float, dt.datetime]],
    ) -> None:
        index = where % (len(rows) + 1)
        lines = [fmt_row(*r) for r in rows]
        lines.insert(index, bad[0])
        with tempfile.TemporaryDirectory() as tmp:
            path = write_plt(Path(tmp) / "a.plt", lines)
            good = write_plt(Path(tmp) / "b.plt", [fmt_row(*r) for r in other])
            table, report = read_user(7, [path, good])
        assert_rows(table, _expected([*rows, *other]), user_id=7)
        assert report.counts == Counter({bad[1]: 1})
        assert_issue(only_issue(report), path, FIRST_DATA_LINE + index, bad[1])
