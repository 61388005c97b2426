"""The shims over private APIs of Prefect and CPython: each works on the installed versions
(the private names it reaches still exist and behave), and outside its version range it falls back or
fails as its docstring says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prefect import flow, task
from prefect.task_runners import ProcessPoolTaskRunner

from runtime import compat
from runtime.caching import CACHE_POLICY

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def out_of_range(monkeypatch: pytest.MonkeyPatch):
    """Every component's range excludes what is installed."""

    def make(component: str) -> None:
        monkeypatch.setitem(compat.RANGES, component, ((0,), (0, 1)))

    return make


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_installed_versions_are_the_ones_the_shims_were_written_for():
    assert compat.supported("cpython")
    assert compat.supported("prefect")
    assert compat.installed_release("no-such-distribution-nextloc") is None
    low, high = compat.RANGES["prefect"]
    assert low <= compat.installed_release("prefect") < high


class TestExitWithoutTeardown:
    SCRIPT = """
import atexit, sys, threading, time
from runtime import compat
class TornDown:
    def __del__(self):
        print("torn down", flush=True)
kept = TornDown()
def late():
    time.sleep(0.3)
    print("thread finished", flush=True)
threading.Thread(target=late).start()
atexit.register(print, "handler ran", flush=True)
sys.stdout.write("unflushed ")
compat.exit_without_teardown(3)
"""

    def test_threads_and_handlers_finish_then_the_process_ends_at_once(self):
        out = _run(self.SCRIPT)
        assert out.returncode == 3, out.stderr
        assert out.stdout == "unflushed thread finished\nhandler ran\n"  # no "torn down"

    def test_out_of_range_it_exits_the_normal_way(self, out_of_range):
        out_of_range("cpython")
        with pytest.raises(SystemExit) as exited:
            compat.exit_without_teardown(3)
        assert exited.value.code == 3


class TestEndWorkerWithoutTeardown:
    SCRIPT = """
import atexit, multiprocessing, sys
from runtime import compat
atexit.register(compat.end_worker_without_teardown)  # first registered: runs last
atexit.register(print, "handler ran", flush=True)
class TornDown:
    def __del__(self):
        print("torn down", flush=True)
kept = TornDown()
queue = multiprocessing.Queue()
queue.put("delivered")  # through the queue's feeder thread
sys.stdout.write("unflushed ")
"""

    def test_handlers_run_queues_flush_and_the_process_ends_at_once(self):
        out = _run(self.SCRIPT)
        assert out.returncode == 0, out.stderr
        assert out.stdout == "unflushed handler ran\n"

    def test_out_of_range_it_leaves_the_exit_to_the_interpreter(self, out_of_range):
        out_of_range("cpython")
        assert compat.end_worker_without_teardown() is None  # returned: the process goes on


class TestSubmitInOrder:
    def test_one_thread_hands_submissions_over(self):
        with ProcessPoolTaskRunner(max_workers=2) as runner:
            compat.submit_in_order(runner)
            assert runner._resolver_executor._max_workers == 1

    def test_out_of_range_prefects_executor_stays(self, out_of_range):
        out_of_range("prefect")
        with ProcessPoolTaskRunner(max_workers=2) as runner:
            before = runner._resolver_executor
            compat.submit_in_order(runner)
            assert runner._resolver_executor is before


@task(cache_policy=CACHE_POLICY, persist_result=True)
def triple(x: int, offset: int = 0) -> int:
    return 3 * x + offset


@flow
def run_triple(x: int, storage: str) -> int:
    return triple.with_options(result_storage=Path(storage))(x)


class TestEngineCacheKey:
    @pytest.mark.usefixtures("prefect_api")
    def test_the_engine_stores_its_result_under_this_key(self, tmp_path: Path):
        storage = tmp_path / "cache"
        assert run_triple(4, str(storage)) == 12
        key = compat.engine_cache_key(triple, {"x": 4})  # the default offset is bound as the engine binds it
        assert key is not None
        assert [p.name for p in storage.iterdir()] == [key]

    def test_out_of_range_it_fails_loudly(self, out_of_range):
        out_of_range("prefect")
        with pytest.raises(compat.UnsupportedVersion, match="engine_cache_key"):
            compat.engine_cache_key(triple, {"x": 4})


class TestDrainPrefectWorkers:
    def test_drains_the_workers_prefect_started(self, monkeypatch: pytest.MonkeyPatch):
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        drained = []
        for service in (APILogWorker, EventsWorker):
            assert callable(service.drain_all)  # the private base class still gives it
            monkeypatch.setattr(
                service, "drain_all", classmethod(lambda cls, timeout: drained.append((cls, timeout)))
            )
        compat.drain_prefect_workers(timeout_s=5)
        assert drained == [(APILogWorker, 5), (EventsWorker, 5)]

    def test_out_of_range_nothing_is_drained(self, out_of_range, monkeypatch: pytest.MonkeyPatch):
        from prefect.logging.handlers import APILogWorker

        out_of_range("prefect")
        monkeypatch.setattr(
            APILogWorker, "drain_all", classmethod(lambda cls, timeout: pytest.fail("drained"))
        )
        compat.drain_prefect_workers(timeout_s=5)


class TestOneSqliteConnection:
    @staticmethod
    def _engine_pool(tmp_path: Path):
        import asyncio

        from prefect.server.database.configurations import AioSqliteConfiguration

        async def pool():
            config = AioSqliteConfiguration(connection_url=f"sqlite+aiosqlite:///{tmp_path}/prefect.db")
            engine = await config.engine()  # Prefect's own engine: its PRAGMAs, its listeners
            async with engine.connect() as connection:
                mode = (await connection.exec_driver_sql("PRAGMA journal_mode")).scalar()
            await engine.dispose()
            return engine.pool, mode

        return asyncio.run(pool())

    @pytest.fixture
    def restore_create(self, monkeypatch: pytest.MonkeyPatch):
        import prefect.server.database.configurations as configurations

        monkeypatch.setattr(configurations, "create_async_engine", configurations.create_async_engine)

    def test_prefects_sqlite_engine_gets_a_pool_of_one(self, restore_create, tmp_path: Path):
        compat.one_sqlite_connection()
        compat.one_sqlite_connection()  # once is enough: a second call does not wrap it again
        pool, mode = self._engine_pool(tmp_path)
        assert pool.size() == 1
        assert pool._max_overflow == 0  # no connection beyond the one
        assert mode == "wal"  # Prefect's own setup of each connection still runs

    def test_out_of_range_prefects_pool_stays(self, restore_create, out_of_range, tmp_path: Path):
        out_of_range("prefect")
        compat.one_sqlite_connection()
        pool, _ = self._engine_pool(tmp_path)
        assert pool.size() == 5  # SQLAlchemy's default
