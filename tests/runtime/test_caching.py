"""Batched per-user calls: each cached under its own task's key, found by Prefect's engine as its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefect import flow, task

from runtime.caching import (
    CACHE_POLICY,
    Artifact,
    Then,
    cached_batch,
    cached_result,
    relocated,
    stale_output,
    store_result,
)
from runtime.runners import balanced_batches

CALLS: list[str] = []  # what the per-call function really ran, in order (one process, threads)


@task(name="square", task_run_name="square {x}", cache_policy=CACHE_POLICY, persist_result=True)
def square(x: int, fail_marker: str = "") -> int:
    """Records the call; fails once for the call whose marker file exists (then removes it)."""
    CALLS.append(f"square {x}")
    if fail_marker and Path(fail_marker).exists():
        Path(fail_marker).unlink()
        raise RuntimeError(f"transient failure on {x}")
    return x * x


@task(name="plus", task_run_name="plus {y}+{z}", cache_policy=CACHE_POLICY, persist_result=True)
def plus(y: int, z: int) -> int:
    CALLS.append(f"plus {y}+{z}")
    return y + z


@flow
def run_batch(calls: list[dict], storage: str, retries: int = 0, then: Then | None = None) -> list:
    return cached_batch.with_options(retries=retries).submit(square, calls, storage, then).result()


class TestBalancedBatches:
    def test_heaviest_batch_first_and_balanced(self):
        weights = [10, 1, 1, 1, 7, 3, 3, 2, 2]
        batches = balanced_batches(weights, 3)
        loads = [sum(weights[i] for i in b) for b in batches]
        assert loads == sorted(loads, reverse=True)
        assert max(loads) - min(loads) <= max(weights)
        assert sorted(i for b in batches for i in b) == list(range(len(weights)))
        assert all(b == sorted(b) for b in batches)

    def test_never_more_batches_than_items_and_none_empty(self):
        assert balanced_batches([5, 5], 8) == [[0], [1]]
        assert balanced_batches([1, 2, 3], 1) == [[0, 1, 2]]
        assert balanced_batches([], 4) == []
        assert all(balanced_batches([0, 0, 0, 0], 3))

    def test_depends_only_on_the_weights(self):
        weights = [3, 3, 3, 1, 1, 1, 2, 2]
        assert balanced_batches(weights, 3) == balanced_batches(list(weights), 3)
        assert balanced_batches(weights, 3) == [[0, 5, 6], [1, 7], [2, 3, 4]]


def test_stale_output_finds_artifacts_anywhere(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("x")
    art = Artifact.record(path, "fp")
    nested = {"a": [art, (1, "b")], "n": None}
    assert stale_output(nested) is None
    path.write_text("changed size")
    assert stale_output(nested) is not None
    assert stale_output({"a": [1, 2]}) is None


def test_a_file_with_a_new_mtime_is_checked_on_its_content(tmp_path):
    """Size and mtime as written: current without a read. A new mtime (a copy): current if the content has
    the fingerprint written; other bytes of the same size, or no file, are not."""
    import os

    from nextloc.fingerprint import hash_file

    path = tmp_path / "a.bin"
    path.write_bytes(b"abcdef")
    art = Artifact.record(path, hash_file(path))
    assert art.problem() is None
    os.utime(path, ns=(art.mtime_ns + 10**9, art.mtime_ns + 10**9))
    assert art.problem() is None
    assert art.restat().mtime_ns == art.mtime_ns + 10**9
    path.write_bytes(b"fedcba")
    assert art.problem() == "content changed"
    assert stale_output({"x": [art]}) is not None
    path.unlink()
    assert art.problem() == "missing"


def test_keys_are_on_content_not_on_paths(tmp_path):
    """An artifact is keyed by its fingerprint, a raw folder by its files' fingerprint, and a path under the
    data directory whose cache holds the result relative to it."""
    from runtime.catalog import Catalog
    from runtime.compat import engine_cache_key
    from tasks.preprocess import IngestResult, RawUser, generate_staypoints_user, ingest_user

    def key(task, root, **params):
        return engine_cache_key(task.with_options(result_storage=Catalog(str(root)).cache), params)

    a, b = tmp_path / "a", tmp_path / "elsewhere" / "b"
    user = RawUser(3, "/raw/Data/003", "fp", 2)
    out = "01_positionfixes/user_id=003/part-0.parquet"
    assert key(ingest_user, a, user=user, out_path=str(a / out)) == key(
        ingest_user, b, user=RawUser(3, "raw/Data/003", "fp", 2), out_path=str(b / out)
    )
    assert key(ingest_user, a, user=user, out_path=str(a / out)) != key(
        ingest_user, a, user=user, out_path=str(a / out.replace("003", "004"))
    )
    assert key(ingest_user, a, user=user, out_path=str(a / out)) != key(
        ingest_user, a, user=RawUser(3, "/raw/Data/003", "other", 2), out_path=str(a / out)
    )

    def ingested(root, mtime):
        return IngestResult(3, Artifact(str(root / out), "fp", 10, mtime), 5, {})

    params = {"config": None, "tripleg_gap_threshold_min": 1.0}
    assert key(generate_staypoints_user, a, ingested=ingested(a, 1), out_path=str(a / "x"), **params) == key(
        generate_staypoints_user, b, ingested=ingested(b, 2), out_path=str(b / "x"), **params
    )


def test_a_result_read_from_a_moved_data_directory_points_into_the_new_one(tmp_path):
    from tasks.preprocess import IngestResult

    then, now = str(tmp_path / "old"), str(tmp_path / "new")
    result = ([IngestResult(3, Artifact(f"{then}/01/part.parquet", "fp", 1, 2), 5, {"n": 1})], {"k": then})
    moved = relocated(result, then, now)
    assert moved[0][0].positionfixes == Artifact(f"{now}/01/part.parquet", "fp", 1, 2)
    assert moved[1] == {"k": now}
    assert relocated(result, str(tmp_path / "other"), now) is result  # nothing under it: the same object


@pytest.mark.usefixtures("prefect_api")
class TestCachedBatch:
    def test_each_call_is_cached_under_its_own_key(self, tmp_path):
        """The records a batch writes are the ones the per-call task's own engine lookup finds."""
        storage = tmp_path / "cache"
        CALLS.clear()
        assert run_batch([{"x": 2}, {"x": 3}], str(storage)) == [4, 9]
        assert CALLS == ["square 2", "square 3"]
        assert cached_result(square, {"x": 3}, storage) == (True, 9)
        # Prefect's engine, running the per-call task itself, gets a cache hit and does not call it
        state = square.with_options(result_storage=storage)(3, return_state=True)
        assert state.is_completed()
        assert state.name == "Cached"
        assert state.result() == 9
        assert CALLS == ["square 2", "square 3"]
        # the record is a plain Prefect result record (metadata + result), written whole
        record = json.loads((storage / next(p.name for p in storage.iterdir())).read_text())
        assert {"metadata", "result"} <= set(record)
        assert not list(storage.glob(".*.tmp"))

    def test_a_retry_runs_only_the_calls_not_done(self, tmp_path):
        """A batch that failed part-way is retried; the calls it had finished are read back, not rerun."""
        storage = tmp_path / "cache"
        marker = tmp_path / "fail-once"
        marker.write_text("")
        calls = [
            {"x": 1, "fail_marker": ""},
            {"x": 2, "fail_marker": str(marker)},
            {"x": 3, "fail_marker": ""},
        ]
        CALLS.clear()
        assert run_batch(calls, str(storage), retries=1) == [1, 4, 9]
        assert CALLS == ["square 1", "square 2", "square 2", "square 3"]

    def test_a_hit_reads_its_record_once(self, tmp_path, monkeypatch):
        """One read of the record per hit, and no deserialising existence check before it; a miss reads
        nothing."""
        from prefect.results import ResultStore

        storage = tmp_path / "cache"
        store_result(square, {"x": 5}, storage, 26)
        reads, read = [], ResultStore.read

        def counted(self, key, *args, **kwargs):
            reads.append(key)
            return read(self, key, *args, **kwargs)

        monkeypatch.setattr(ResultStore, "read", counted)
        monkeypatch.setattr(ResultStore, "exists", lambda *_a, **_k: pytest.fail("exists() reads the record"))
        assert cached_result(square, {"x": 5}, storage) == (True, 26)
        assert len(reads) == 1
        assert cached_result(square, {"x": 7}, storage) == (False, None)
        assert len(reads) == 1

    def test_a_call_cached_before_is_not_run(self, tmp_path):
        storage = tmp_path / "cache"
        store_result(square, {"x": 5}, storage, 26)  # whatever the record says is what a hit returns
        CALLS.clear()
        assert run_batch([{"x": 5}, {"x": 6}], str(storage)) == [26, 36]
        assert CALLS == ["square 6"]

    def test_a_chained_task_takes_each_result_at_once_and_caches_it_under_its_own_key(self, tmp_path):
        """With ``then``, each call's result goes on to the second task before the next call starts; both
        steps are cached per call, and a retry reads back both steps of the calls it had finished."""
        storage = tmp_path / "cache"
        marker = tmp_path / "fail-once"
        marker.write_text("")
        calls = [{"x": 2}, {"x": 3, "fail_marker": str(marker)}]
        then = Then(plus, "y", [{"z": 10}, {"z": 20}])
        CALLS.clear()
        assert run_batch(calls, str(storage), retries=1, then=then) == [(4, 14), (9, 29)]
        assert CALLS == ["square 2", "plus 4+10", "square 3", "square 3", "plus 9+20"]
        assert cached_result(plus, {"y": 9, "z": 20}, storage) == (True, 29)
        state = plus.with_options(result_storage=storage)(4, 10, return_state=True)
        assert state.name == "Cached"
        CALLS.clear()
        assert run_batch(calls[1:], str(storage), then=Then(plus, "y", [{"z": 20}])) == [(9, 29)]
        assert CALLS == []
