"""Hostile input for the readers beside GeoLife (nextloc/io/tabular.py, gpx.py), the profiles and the synthetic generator."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nextloc.io.gpx import read_gpx_user
from nextloc.io.inputs import InputSpec, parse_columns
from nextloc.io.tabular import read_positionfix_files, read_visit_files, split_by_user
from nextloc.synth import SynthConfig, generate

HEADER = "user_id,tracked_at,latitude,longitude,elevation\n"
GOOD = "1,2008-10-23T02:53:04Z,39.98,116.32,50\n"


def _csv(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "fixes.csv"
    path.write_text(header + body)
    return path


def _read(path: Path, **spec) -> tuple[pa.Table, dict]:
    table, report = read_positionfix_files([path], InputSpec(format="csv", **spec))
    return table, report.to_dict()


class TestCsvHostile:
    @pytest.mark.parametrize(
        ("row", "kind"),
        [
            ("1,2008-10-23T02:53:05Z,400,116.32,50", "out_of_range"),
            ("1,2008-10-23T02:53:05Z,39.98,-181,50", "out_of_range"),
            ("1,2008-13-45T02:53:05Z,39.98,116.32,50", "bad_timestamp"),
            ("1,yesterday,39.98,116.32,50", "bad_timestamp"),
            ("1,2008-10-23T02:53:05Z,N39.98,116.32,50", "non_numeric"),
            ("1,2008-10-23T02:53:05Z,nan,116.32,50", "non_numeric"),
            ("1,2008-10-23T02:53:05Z,39.98,116.32,high", "non_numeric"),
            ("abc,2008-10-23T02:53:05Z,39.98,116.32,50", "bad_user_id"),
            ("-3,2008-10-23T02:53:05Z,39.98,116.32,50", "bad_user_id"),
            ("1,2008-10-23T02:53:05Z,39.98", "field_count"),
            ("", "empty_row"),
        ],
    )
    def test_bad_row_reported_with_line_and_neighbours_kept(self, tmp_path, row, kind):
        path = _csv(tmp_path, GOOD + row + "\n" + GOOD.replace("04Z", "06Z"))
        table, report = _read(path)
        assert table.num_rows == 2
        assert report["counts"] == {kind: 1}
        assert report["rows_skipped"] == 1
        assert report["issues"][0].startswith(f"{path}:3: {kind}: ")

    def test_missing_column_skips_the_file_and_names_it(self, tmp_path):
        path = _csv(tmp_path, "1,2008-10-23T02:53:04Z,39.98\n", header="user_id,tracked_at,latitude\n")
        table, report = _read(path)
        assert table.num_rows == 0
        assert report["files_skipped"] == 1
        assert "missing_column" in report["issues"][0]
        assert "longitude" in report["issues"][0]

    @pytest.mark.parametrize("content", ["", "\n\n", HEADER])
    def test_empty_file(self, tmp_path, content):
        path = tmp_path / "empty.csv"
        path.write_text(content)
        table, report = _read(path)
        assert table.num_rows == 0
        assert report["counts"] == {"empty_file": 1}
        assert report["files_skipped"] == 1

    def test_one_bad_file_keeps_the_others(self, tmp_path):
        good = _csv(tmp_path, GOOD)
        bad = tmp_path / "bad.csv"
        bad.write_bytes(b"\x00\xff garbage")
        table, report = read_positionfix_files([bad, good], InputSpec(format="csv"))
        assert table.num_rows == 1
        assert report.files_skipped == 1

    def test_naive_times_use_the_timezone_option_and_zoned_times_their_zone(self, tmp_path):
        body = "1,2008-10-23 10:53:04,39.98,116.32,\n1,2008-10-23T10:53:04+08:00,39.98,116.32,\n"
        table, report = _read(_csv(tmp_path, body), timezone="Asia/Shanghai")
        times = table.column("tracked_at").to_pylist()
        assert times[0] == times[1]
        assert times[0].isoformat() == "2008-10-23T02:53:04+00:00"
        assert report["rows_skipped"] == 0

    def test_zoned_times_without_minutes_keep_their_zone(self, tmp_path):
        """An hour-only or basic-format time with a zone is read in that zone, not as a naive time."""
        body = "1,2008-10-23T02Z,39.98,116.32,\n1,20081023T1000+0800,39.98,116.32,\n"
        table, report = _read(_csv(tmp_path, body), timezone="Asia/Shanghai")
        assert [t.isoformat() for t in table.column("tracked_at").to_pylist()] == [
            "2008-10-23T02:00:00+00:00"
        ] * 2
        assert report["rows_skipped"] == 0

    def test_nonexistent_local_time_is_refused(self, tmp_path):
        body = GOOD + "1,2021-03-14 02:30:00,39.98,116.32,\n"  # a DST gap in New York
        table, report = _read(_csv(tmp_path, body), timezone="America/New_York")
        assert table.num_rows == 1
        assert report["counts"] == {"bad_timestamp": 1}

    def test_column_mapping(self, tmp_path):
        path = _csv(tmp_path, "7,2008-10-23T02:53:04Z,39.98,116.32\n", header="uid,time,lat,lon\n")
        mapping = parse_columns("user_id=uid, tracked_at=time,latitude=lat,longitude=lon")
        table, report = _read(path, columns=mapping)
        assert table.column("user_id").to_pylist() == [7]
        assert report["rows_skipped"] == 0

    def test_bad_mapping_is_rejected_naming_it(self):
        with pytest.raises(ValueError, match="unknown column"):
            InputSpec(columns={"lat": "latitude"})
        with pytest.raises(ValueError, match="name=column"):
            parse_columns("user_id")
        with pytest.raises(ValueError, match="unknown timezone"):
            InputSpec(timezone="Mars/Olympus")


class TestParquetHostile:
    def test_typed_parquet_bad_rows(self, tmp_path):
        path = tmp_path / "fixes.parquet"
        pq.write_table(
            pa.table(
                {
                    "user_id": [1, 1, 2],
                    "tracked_at": pa.array([0, 10**9, 2 * 10**9], pa.timestamp("ns", tz="UTC")),
                    "latitude": [39.9, 400.0, 39.9],
                    "longitude": [116.3, 116.3, float("inf")],
                }
            ),
            path,
        )
        table, report = read_positionfix_files([path], InputSpec(format="parquet"))
        assert table.num_rows == 1
        assert report.counts == {"out_of_range": 1, "non_numeric": 1}
        assert str(report.issues[0]).startswith(f"{path}:2: out_of_range")

    def test_microsecond_timestamps_keep_their_time(self, tmp_path):
        """A parquet timestamp in microseconds (Spark's, DuckDB's) is the same time in nanoseconds."""
        path = tmp_path / "fixes.parquet"
        at = pa.array([1_224_730_384_000_000], pa.timestamp("us"))  # 2008-10-23T02:53:04
        pq.write_table(
            pa.table({"user_id": [1], "tracked_at": at, "latitude": [39.9], "longitude": [116.3]}), path
        )
        table, _ = read_positionfix_files([path], InputSpec(format="parquet"))
        assert table.column("tracked_at")[0].as_py().isoformat() == "2008-10-23T02:53:04+00:00"

    def test_typed_nulls_and_user_ids_are_checked_without_text(self, tmp_path):
        """Typed columns skip the text route (fast) and give the same verdicts: an all-null row is
        blank, a null time, a negative or fractional user id and a float user id that is whole."""
        path = tmp_path / "fixes.parquet"
        t = [0, 10**9, 2 * 10**9, 3 * 10**9, 4 * 10**9, None]
        pq.write_table(
            pa.table(
                {
                    "user_id": pa.array([1.0, -1.0, 2.5, 3.0, 4.0, None], pa.float64()),
                    "tracked_at": pa.array([*t[:4], None, None], pa.timestamp("ns", tz="UTC")),
                    "latitude": [39.9, 39.9, 39.9, 39.9, 39.9, None],
                    "longitude": [116.3, 116.3, 116.3, 116.3, 116.3, None],
                }
            ),
            path,
        )
        table, report = read_positionfix_files([path], InputSpec(format="parquet"))
        assert table.column("user_id").to_pylist() == [1, 3]
        assert report.counts == {"bad_user_id": 2, "bad_timestamp": 1, "empty_row": 1}
        assert [str(i).split(": ")[0] for i in report.issues] == [f"{path}:{n}" for n in (6, 2, 3, 5)]

    def test_missing_column(self, tmp_path):
        path = tmp_path / "fixes.parquet"
        pq.write_table(pa.table({"user_id": [1], "latitude": [1.0], "longitude": [1.0]}), path)
        table, report = read_positionfix_files([path], InputSpec(format="parquet"))
        assert table.num_rows == 0
        assert report.counts == {"missing_column": 1}

    def test_split_by_user_keeps_order(self, tmp_path):
        body = "2,2008-10-23T02:53:09Z,1,1,\n1,2008-10-23T02:53:05Z,1,1,\n2,2008-10-23T02:53:01Z,1,1,\n"
        table, _ = _read(_csv(tmp_path, body))
        parts = split_by_user(table)
        assert list(parts) == [1, 2]
        assert [t.second for t in parts[2].column("tracked_at").to_pylist()] == [9, 1]


class TestGpxHostile:
    def _gpx(self, tmp_path: Path, points: str, name: str = "a.gpx") -> Path:
        path = tmp_path / name
        path.write_text(
            '<?xml version="1.0"?><gpx version="1.1" xmlns="http://www.topografix.com/GPX/1/1">'
            f"<trk><trkseg>{points}</trkseg></trk></gpx>"
        )
        return path

    def test_bad_points_reported_and_others_kept(self, tmp_path):
        pts = (
            '<trkpt lat="39.9" lon="116.3"><time>2008-10-23T02:53:04Z</time></trkpt>'
            '<trkpt lat="39.9" lon="116.3"></trkpt>'
            '<trkpt lat="400" lon="116.3"><time>2008-10-23T02:53:05Z</time></trkpt>'
            '<trkpt lat="39.9" lon="116.3"><ele>12.5</ele><time>2008-10-23T10:53:06</time></trkpt>'
        )
        table, report = read_gpx_user(
            5, [self._gpx(tmp_path, pts)], InputSpec(format="gpx", timezone="Asia/Shanghai")
        )
        assert table.num_rows == 2
        assert report.counts == {"bad_timestamp": 1, "out_of_range": 1}
        assert "track 1, segment 1, point 2" in str(report.issues[0])
        assert table.column("tracked_at")[1].as_py().isoformat() == "2008-10-23T02:53:06+00:00"
        assert table.column("elevation").to_pylist()[1] == 12.5

    def test_not_gpx_and_empty_files_skipped(self, tmp_path):
        good = self._gpx(tmp_path, '<trkpt lat="1" lon="1"><time>2008-10-23T02:53:04Z</time></trkpt>')
        bad = tmp_path / "b.gpx"
        bad.write_text("<html>503</html")
        empty = tmp_path / "c.gpx"
        empty.write_text("")
        table, report = read_gpx_user(5, [good, bad, empty])
        assert table.num_rows == 1
        assert report.counts == {"bad_gpx": 1, "empty_file": 1}
        assert report.files_skipped == 2


class TestVisitsHostile:
    def test_bad_visits(self, tmp_path):
        path = tmp_path / "v.csv"
        path.write_text(
            "user_id,started_at,finished_at,latitude,longitude\n"
            "1,2008-10-23T02:00:00Z,2008-10-23T03:00:00Z,39.9,116.3\n"
            "1,2008-10-23T05:00:00Z,2008-10-23T04:00:00Z,39.9,116.3\n"
            "1,2008-10-23T06:00:00Z,never,39.9,116.3\n"
            "1,2008-10-23T07:00:00Z,2008-10-23T08:00:00Z,39.9,400\n"
        )
        table, report = read_visit_files([path], InputSpec(format="visits"))
        assert table.num_rows == 1
        assert report.counts == {"bad_interval": 1, "bad_timestamp": 1, "out_of_range": 1}
        assert any(str(i).startswith(f"{path}:3: bad_interval") for i in report.issues)


class TestSynth:
    def test_seeded_and_readable_in_every_format(self, tmp_path):
        cfg = SynthConfig(n_users=2, n_days=3, seed=1)
        a, b = tmp_path / "a.csv", tmp_path / "b.csv"
        generate(cfg, "csv", a)
        generate(cfg, "csv", b)
        assert a.read_bytes() == b.read_bytes()
        table, report = read_positionfix_files([a], InputSpec(format="csv"))
        assert report.rows_skipped == 0
        assert set(table.column("user_id").to_pylist()) == {1, 2}
        generate(cfg, "gpx", tmp_path / "gpx")
        gpx, rep = read_gpx_user(1, sorted((tmp_path / "gpx" / "001").glob("*.gpx")))
        assert rep.rows_skipped == 0
        assert gpx.num_rows == split_by_user(table)[1].num_rows
        counts = generate(cfg, "visits", tmp_path / "v.parquet")
        visits, _ = read_visit_files([tmp_path / "v.parquet"], InputSpec(format="visits"))
        assert visits.num_rows == counts["visits"]

    def test_synthetic_visits_pass_the_diy_quality_filter(self, tmp_path):
        """The DIY profile's tracking-quality thresholds keep every synthetic user (nights at home); the
        GeoLife-like day records (no nights) fail them, so the default is what a DIY-size run needs."""
        from nextloc.preprocessing.quality import apply_quality_thresholds, filter_users_by_quality
        from nextloc.profiles import load_profile

        quality = load_profile("diy").config().quality
        kept = {}
        for night in (True, False):
            out = tmp_path / f"night{night}.parquet"
            generate(SynthConfig(n_users=12, n_days=80, seed=3, night_at_home=night), "visits", out)
            visits, report = read_visit_files([out], InputSpec(format="visits"))
            assert report.rows_skipped == 0
            frame = visits.to_pandas()
            extents = frame.groupby("user_id", as_index=False).agg(
                started_at=("started_at", "min"), finished_at=("finished_at", "max")
            )
            spanned = filter_users_by_quality(extents, quality)
            kept[night] = set(apply_quality_thresholds(spanned, frame, quality)["user_id"])
        assert kept[True] == set(range(1, 13))
        assert kept[False] == set()


class TestStreaming:
    def test_spilled_users_equal_split_by_user_of_the_whole(self, tmp_path, monkeypatch):
        """Batches spilled per user and read back give each user's rows of the whole read, in order."""
        import nextloc.io.tabular as tabular
        from nextloc.io.geolife import IngestReport
        from nextloc.io.tabular import iter_positionfix_batches, read_spilled, spill_by_user

        monkeypatch.setattr(tabular, "_BATCH_ROWS", 1000)  # many batches, users spread over them
        path = tmp_path / "fixes.parquet"
        generate(SynthConfig(n_users=3, n_days=4, seed=2), "parquet", path)
        files, spec = [path], InputSpec(format="parquet")
        whole, whole_report = read_positionfix_files(files, spec)
        report = IngestReport()
        pieces = spill_by_user(iter_positionfix_batches(files, spec, report), tmp_path / "spill")
        assert report.to_dict() == whole_report.to_dict()
        assert list(pieces) == [1, 2, 3]
        assert max(len(p) for p in pieces.values()) > 1
        for user_id, part in split_by_user(whole).items():
            assert read_spilled(pieces[user_id]).equals(part.combine_chunks())

    def test_parquet_reader_does_not_keep_what_it_has_read(self, tmp_path, monkeypatch):
        """Arrow memory while streaming a parquet file stays about one batch, not the file: the reader's
        pre-buffer cache (on by default) kept every column chunk read, 9.4 GB for 400M fixes."""
        import nextloc.io.tabular as tabular

        monkeypatch.setattr(tabular, "_BATCH_ROWS", 10_000)
        path = tmp_path / "fixes.parquet"
        table = pa.table(
            {"user_id": pa.array(range(400_000), pa.int64()), "x": pa.array(range(400_000), pa.float64())}
        )
        pq.write_table(table, path, row_group_size=10_000, compression="none")
        del table
        before = pa.total_allocated_bytes()
        held = 0
        for frame, _ in tabular._parquet_batches(path):
            held = max(held, pa.total_allocated_bytes() - before)
            del frame
        assert held < path.stat().st_size / 4, (held, path.stat().st_size)

    def test_parquet_sink_gathers_row_groups(self, tmp_path):
        from nextloc.synth import ParquetSink

        cfg = SynthConfig(n_users=2, n_days=5, seed=3)
        plain, grouped = tmp_path / "plain.parquet", tmp_path / "grouped.parquet"
        generate(cfg, "parquet", plain, sink=ParquetSink(plain, row_group_rows=None))  # a group per batch
        generate(cfg, "parquet", grouped, sink=ParquetSink(grouped, row_group_rows=5000))
        a, b = pq.ParquetFile(plain), pq.ParquetFile(grouped)
        assert b.metadata.num_row_groups < a.metadata.num_row_groups
        assert all(b.metadata.row_group(i).num_rows >= 5000 for i in range(b.metadata.num_row_groups - 1))
        assert a.read().equals(b.read())


class TestProfiles:
    def test_shipped_profiles(self):
        from nextloc.config import PreprocessConfig
        from nextloc.profiles import list_profiles, load_profile

        assert {"geolife", "diy"} <= set(list_profiles())
        assert load_profile("geolife").config() == PreprocessConfig()
        diy = load_profile("diy")
        cfg = diy.config({"locations.min_samples": 3})
        assert (cfg.locations.epsilon_m, cfg.quality.min_thres, cfg.quality.mean_thres) == (50.0, 0.6, 0.7)
        assert (cfg.split.train, cfg.locations.min_samples, diy.input.format) == (0.8, 3, "visits")
        assert diy.data_dir == "data/diy"

    def test_a_config_file_applies_on_top_of_the_profile(self, tmp_path):
        """Keys the file sets win over the profile's; the ones it does not set keep the profile's values (not
        the defaults); --set style overrides win over both; a bad key in the file fails as without a profile."""
        from nextloc.profiles import load_profile

        diy = load_profile("diy")
        path = tmp_path / "mine.yaml"
        path.write_text("preprocess:\n  locations:\n    epsilon_m: 40\n  samples:\n    previous_days: 5\n")
        cfg = diy.config(path=path)
        assert (cfg.locations.epsilon_m, cfg.samples.previous_days) == (40.0, 5)
        assert (cfg.quality.min_thres, cfg.quality.mean_thres, cfg.split.train) == (0.6, 0.7, 0.8)  # diy's
        assert diy.config({"locations.epsilon_m": 30}, path).locations.epsilon_m == 30.0
        path.write_text("locations:\n  epsilon: 5\n")
        with pytest.raises(ValueError, match="epsilon"):
            diy.config(path=path)

    def test_unknown_profile_and_bad_key(self, tmp_path):
        from nextloc.profiles import load_profile

        with pytest.raises(FileNotFoundError, match="present"):
            load_profile("nope")
        (tmp_path / "x.yaml").write_text("preprocess:\n  locations:\n    epsilon: 5\n")
        with pytest.raises(ValueError, match="epsilon"):
            load_profile("x", root=tmp_path)
