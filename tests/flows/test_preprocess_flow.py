"""The preprocess flow against a real (temporary) Prefect API, on the real GeoLife sample."""

from __future__ import annotations

import json
from pathlib import Path
from uuid import UUID

import pyarrow.parquet as pq
import pytest

from nextloc.config import PreprocessConfig, load_config

pytestmark = pytest.mark.usefixtures("prefect_api")

FINAL = [
    "staypoints.parquet",
    "samples/train.parquet",
    "samples/val.parquet",
    "samples/test.parquet",
    "metadata.json",
]


def _run(sample_dir: Path, data_dir: Path, config: PreprocessConfig | None = None):
    from flows.preprocess import preprocess

    return preprocess(raw_dir=str(sample_dir), data_dir=str(data_dir), config=config, return_state=True)


def _task_states(task_states, state, expected: int | None = None) -> dict[str, str]:
    return task_states(state.state_details.flow_run_id, expected)


def _mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*.parquet")}


@pytest.fixture(scope="module")
def first_run(sample_dir, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("flow") / "out"
    state = _run(sample_dir, data_dir)
    assert state.is_completed()
    return data_dir, state.result()


class TestPreprocessFlow:
    def test_outputs(self, first_run):
        """The documented outputs exist with the documented columns and metadata keys."""
        data_dir, result = first_run
        for name in FINAL:
            assert (data_dir / name).is_file(), name
        sp = pq.read_table(data_dir / "staypoints.parquet").to_pandas()
        for col in [
            "user_id",
            "location_id",
            "start_day",
            "end_day",
            "start_min",
            "end_min",
            "duration",
            "weekday",
            "split",
        ]:
            assert col in sp.columns
        assert set(sp["split"]) == {"train", "val", "test"}
        assert sp["location_id"].min() >= 1
        meta = json.loads((data_dir / "metadata.json").read_text())
        for key in ["n_users", "total_loc_num", "total_user_num", "n_staypoints", "n_samples"]:
            assert key in meta
        for key in ["n_users", "n_staypoints", "n_samples"]:
            assert set(meta[key]) == {"train", "val", "test"}
        assert meta["n_staypoints"] == sp["split"].value_counts().to_dict()
        assert meta["input_fingerprint"]
        assert meta["config"]["locations"]["epsilon_m"] == 20.0
        samples = pq.read_table(data_dir / "samples" / "train.parquet")
        assert samples.num_rows == meta["n_samples"]["train"] == result["stats"]["n_samples"]["train"]
        # the user-partitioned positionfixes
        parts = sorted((data_dir / "01_positionfixes").glob("user_id=*/part-0.parquet"))
        assert len(parts) == 11
        pfs = pq.read_table(parts[0]).schema
        assert str(pfs.field("tracked_at").type) == "timestamp[ns, tz=UTC]"

    def test_per_user_work_runs_in_batches_cached_per_user(self, first_run, sample_dir, task_states):
        """A cold run spends a few batch task runs on the per-user work, not one per user and step (each
        user's ingestion goes straight on to its staypoints in the same batch), and leaves a record per user
        and step that Prefect's engine itself finds when that user's task runs alone."""
        import os

        from nextloc.config import PreprocessConfig
        from runtime.catalog import Catalog
        from tasks.preprocess import discover_raw_users, generate_staypoints_user, ingest_user

        data_dir, result = first_run
        states = task_states(UUID(result["flow_run_id"]))
        per_user = [n for n in states if n.startswith(("ingest user", "ingest-user"))]
        staypoint_runs = [n for n in states if n.startswith(("staypoints user", "generate-staypoints-user"))]
        batches = min(11, 4 * max(2, os.cpu_count() or 2))  # the flow's thread pool, 4 batches per worker
        assert len(per_user) == batches
        assert all("+ generate-staypoints-user" in n for n in per_user)
        assert staypoint_runs == []  # chained, not a second wave of batches
        assert result["users_run"] == {"ingest": 11, "staypoints": 11}

        catalog = Catalog(str(data_dir.resolve()))
        users, _ = discover_raw_users(str(sample_dir), catalog)
        user = users[3]
        state = ingest_user.with_options(result_storage=catalog.cache)(
            user, str(catalog.positionfixes(user.user_id)), return_state=True
        )
        assert state.name == "Cached"
        assert state.result().positionfixes.is_current()
        config = PreprocessConfig()
        state = generate_staypoints_user.with_options(result_storage=catalog.cache)(
            state.result(),
            config.staypoints,
            config.quality.tripleg_gap_threshold_min,
            str(catalog.user_staypoints(user.user_id)),
            return_state=True,
        )
        assert state.name == "Cached"
        assert state.result().staypoints.is_current()

    def test_rerun_is_fully_cached(self, first_run, sample_dir, task_states):
        """A second run on unchanged input recomputes nothing and rewrites no file."""
        data_dir, result = first_run
        before = _mtimes(data_dir)
        state = _run(sample_dir, data_dir)
        states = _task_states(task_states, state, expected=3)
        assert state.result()["users_run"] == {"ingest": 0, "staypoints": 0}  # all 22 read from the cache
        # every cached step was read back from Prefect's cache, none ran: only the three cheap IO tasks did
        assert {n.rsplit("-", 1)[0] for n in states} == {
            "discover-raw-users",
            "write-ingest-report",
            "report-duplicates",
        }
        assert set(states.values()) == {"Completed"}
        assert _mtimes(data_dir) == before
        assert state.result()["stats"] == result["stats"]

    def test_changed_parameter_recomputes_downstream_only(self, first_run, sample_dir, task_states):
        """Changing a DBSCAN parameter reuses ingestion and staypoints, recomputes locations and samples."""
        data_dir, _ = first_run
        before = _mtimes(data_dir)
        config = load_config(overrides={"locations.epsilon_m": 50})
        state = _run(sample_dir, data_dir, config)
        states = _task_states(task_states, state, expected=4)
        assert state.result()["users_run"] == {"ingest": 0, "staypoints": 0}
        assert next(s for n, s in states.items() if n.startswith("locate-staypoints")) == "Completed"
        after = _mtimes(data_dir)
        upstream = [k for k in before if k.startswith(("01_", "02_"))]
        assert all(after[k] == before[k] for k in upstream)
        assert after["staypoints.parquet"] != before["staypoints.parquet"]
        meta = json.loads((data_dir / "metadata.json").read_text())
        assert meta["config"]["locations"]["epsilon_m"] == 50.0
        # back to the defaults: everything is a cache hit again, and the outputs are the first run's
        _run(sample_dir, data_dir)

    def test_the_deployment_protocol_reuses_the_per_user_work(self, first_run, sample_dir, task_states):
        """``protocol: deployment`` keeps every user's positionfixes and staypoints (cached, partitioned as
        the reference's), recomputes the locations and samples, and records the protocol in metadata.json;
        run again, it is all cache hits."""
        data_dir, _ = first_run
        config = load_config(overrides={"protocol": "deployment"})
        state = _run(sample_dir, data_dir, config)
        assert state.result()["users_run"] == {"ingest": 0, "staypoints": 0}
        states = _task_states(task_states, state, expected=4)
        assert next(s for n, s in states.items() if n.startswith("locate-staypoints")) == "Completed"
        meta = json.loads((data_dir / "metadata.json").read_text())
        assert meta["config"]["protocol"] == "deployment"
        assert meta["preprocessing"]["staypoints_new_place"] > 0
        located = pq.read_table(data_dir / "03_locations" / "staypoints_located.parquet")
        assert {"split", "fitted"} <= set(located.column_names)
        before = _mtimes(data_dir)
        again = _run(sample_dir, data_dir, config)
        rerun = _task_states(task_states, again, expected=3)
        assert {n.rsplit("-", 1)[0] for n in rerun} == {
            "discover-raw-users",
            "write-ingest-report",
            "report-duplicates",
        }
        assert _mtimes(data_dir) == before
        _run(sample_dir, data_dir)  # back to the reference

    def test_changed_staypoint_parameter_reruns_staypoints_alone(self, first_run, sample_dir, task_states):
        """A staypoint setting keeps every user's positionfixes (cached), and reruns only the staypoints, in
        batches of the second step alone."""
        data_dir, _ = first_run
        before = _mtimes(data_dir)
        state = _run(sample_dir, data_dir, load_config(overrides={"staypoints.time_threshold_min": 20}))
        assert state.result()["users_run"] == {"ingest": 0, "staypoints": 11}
        names = task_states(UUID(state.result()["flow_run_id"]))
        assert not [n for n in names if n.startswith(("ingest user", "ingest-user"))]
        assert [n for n in names if n.startswith("generate-staypoints-user x")]
        after = _mtimes(data_dir)
        assert all(after[k] == before[k] for k in before if k.startswith("01_"))
        assert any(after[k] != before[k] for k in before if k.startswith("02_"))
        _run(sample_dir, data_dir)  # back to the defaults (all cache hits)

    def test_deleted_output_is_rebuilt(self, first_run, sample_dir):
        """A cached result whose file was deleted is recomputed, not trusted."""
        data_dir, _ = first_run
        (data_dir / "staypoints.parquet").unlink()
        victim = next((data_dir / "02_staypoints").glob("user_id=*/part-0.parquet"))
        victim.unlink()
        assert _run(sample_dir, data_dir).is_completed()
        assert (data_dir / "staypoints.parquet").is_file()
        assert victim.is_file()

    def test_outputs_are_byte_identical_across_runs(self, first_run, sample_dir, tmp_path):
        """Same input and config give byte-identical parquet outputs (fresh directory, fresh cache)."""
        data_dir, _ = first_run
        other = tmp_path / "again"
        assert _run(sample_dir, other).is_completed()
        for name in FINAL:
            assert (other / name).read_bytes() == (data_dir / name).read_bytes(), name
        for part in (data_dir / "01_positionfixes").rglob("*.parquet"):
            assert (other / part.relative_to(data_dir)).read_bytes() == part.read_bytes()


def test_a_direct_python_call_sends_no_telemetry(sample_dir, tmp_path):
    """`from flows.preprocess import preprocess` in a user's script, with no telemetry settings in the
    environment, behaves like the command: the temporary API sends no telemetry heartbeat (it used to
    log `send_telemetry_heartbeat ... database is locked`)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(
        "from flows.preprocess import preprocess\n\n"
        'if __name__ == "__main__":\n'
        f"    preprocess(raw_dir={str(sample_dir)!r}, data_dir={str(tmp_path / 'data')!r})\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in {"DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED"}
    }
    env.pop("PREFECT_API_URL", None)  # its own temporary API, as a user's script gets
    env["PREFECT_HOME"] = str(tmp_path / ".prefect")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "telemetry" not in output.lower(), output[-3000:]
    assert "database is locked" not in output, output[-3000:]
