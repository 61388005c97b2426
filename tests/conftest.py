"""Shared fixtures: where the real GeoLife data is, and an isolated Prefect API per test session."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tls_network import tls_services  # noqa: F401  (the services over HTTPS on a network address)

from flows import OFFLINE_DEFAULTS  # telemetry off; importing flows sets it too

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from nextloc.io.geolife import IngestReport
    from nextloc.models.batch import SampleTensors

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
STALL_S = 15  # seconds: a Prefect API request slower than this is a stall
ARTIFACTS = REPO / "test-artifacts"

# Isolated Prefect state for the whole session, set before anything imports prefect.
_PREFECT_HOME = tempfile.mkdtemp(prefix="nextloc-prefect-")
os.environ["PREFECT_HOME"] = _PREFECT_HOME
for _key, _value in OFFLINE_DEFAULTS.items():
    os.environ.setdefault(_key, _value)
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "nextloc")
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
os.environ.pop("PREFECT_API_URL", None)
# A stalled request fails the test that met it instead of waiting out Prefect's 60 s default (the client
# still retries a 503 at once: SQLite's "database is locked" is no stall), and local APIs that tests
# start (each CLI command's PREFECT_HOME has one) go soon once their tests are done.
os.environ.setdefault("PREFECT_API_REQUEST_TIMEOUT", str(STALL_S))
os.environ.setdefault("NEXTLOC_LOCAL_API_IDLE_S", "120")
# No map tiles from the internet: the PNG maps are drawn on their plain axes (CI has no network; a set
# $NEXTLOC_MAP_TILES would make the tests ask it). tests/nextloc/maps/test_tiles.py serves its own tiles.
os.environ["NEXTLOC_MAP_TILES"] = "off"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--digests",
        default=None,
        help="one more recording of the recipes' results (benchmarks/train_digest.py's JSON) to hold training "
        "to, beside the repo's and ../shared/machines/': bit for bit where its kernels are this process's, "
        "within a tolerance elsewhere",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``slow`` tests first, each group in collection order: make test's two workers take a file at a
    time in this order (``--dist loadfile --no-loadscope-reorder``), so the minutes-long files start early
    and the short ones fill the end, rather than one worker running the longest file alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def require_data(path: Path, what: str) -> Path:
    """Return ``path``; if it is missing, fail in CI (where the data must be) and skip elsewhere."""
    if path.exists():
        return path
    message = f"{what} not found at {path}"
    if IN_CI:
        pytest.fail(message + " (CI must have ../shared)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    """The real GeoLife sample (11 users, original layout)."""
    return require_data(
        Path(os.environ.get("NEXTLOC_SAMPLE_DIR", SHARED / "geolife-sample")), "GeoLife sample"
    )


@pytest.fixture(scope="session")
def sample_reads(sample_dir) -> dict[int, tuple[pd.DataFrame, IngestReport]]:
    """nextloc's parse of every sample user, in read order: user_id -> (positionfixes as pandas, read report).

    Parsed once per session; treat the frames as read-only (copy before changing them).
    """
    from nextloc.io.geolife import list_plt_files, list_user_dirs, read_user

    users, _ = list_user_dirs(sample_dir)
    out = {}
    for user_id, folder in users:
        table, report = read_user(user_id, list_plt_files(folder))
        out[user_id] = (table.to_pandas(), report)
    return out


@pytest.fixture(scope="session")
def sample_positionfixes(sample_reads) -> dict[int, pd.DataFrame]:
    """user_id -> the user's positionfixes as parsed by nextloc (pandas), in read order; read-only."""
    return {user_id: pfs for user_id, (pfs, _) in sample_reads.items()}


@pytest.fixture(scope="session")
def sample_staypoints(sample_positionfixes) -> tuple[pd.DataFrame, pd.DataFrame]:
    """All sample users' staypoints (sorted by user, start) and per-user tripleg extents, from nextloc alone.

    ``(staypoints, tripleg_extents)`` from :func:`nextloc.preprocessing.staypoints.generate_staypoints` with its defaults;
    read-only.
    """
    import pandas as pd

    from nextloc.preprocessing.staypoints import generate_staypoints

    sps, extents = [], []
    for user_id, pfs in sample_positionfixes.items():
        result = generate_staypoints(pfs)
        sps.append(result.staypoints)
        extents.append(
            {"user_id": user_id, "tripleg_start": result.tripleg_start, "tripleg_end": result.tripleg_end}
        )
    extents = pd.DataFrame(extents)
    for col in ("tripleg_start", "tripleg_end"):
        extents[col] = pd.to_datetime(extents[col], utc=True)
    return pd.concat(sps, ignore_index=True), extents


def build_samples_table(users: list[int], histories: list[list[int]], targets: list[int]) -> pa.Table:
    """A small samples table with the preprocessing output's pyarrow schema (time features all 0).

    ``user_id`` is ``100 + user``, ``staypoint_id`` the row number and ``target_day`` 10.
    """
    import pyarrow as pa

    lengths = [len(h) for h in histories]
    zeros = [[0] * n for n in lengths]
    list32 = pa.list_(pa.int32())
    n = len(users)
    return pa.table(
        {
            "staypoint_id": pa.array(range(n), pa.int64()),
            "user_id": pa.array([100 + u for u in users], pa.int32()),
            "user": pa.array(users, pa.int32()),
            "loc_hist": pa.array(histories, list32),
            "user_hist": pa.array([[u] * k for u, k in zip(users, lengths, strict=True)], list32),
            "weekday_hist": pa.array(zeros, list32),
            "start_min_hist": pa.array(zeros, list32),
            "duration_hist": pa.array(zeros, list32),
            "diff_hist": pa.array(zeros, list32),
            "target_loc": pa.array(targets, pa.int32()),
            "target_weekday": pa.array([0] * n, pa.int32()),
            "target_start_min": pa.array([0] * n, pa.int32()),
            "target_day": pa.array([10] * n, pa.int32()),
            "hist_len": pa.array(lengths, pa.int32()),
        }
    )


@pytest.fixture(scope="session")
def make_samples() -> Callable[..., SampleTensors]:
    """Factory: ``make_samples(users=..., histories=..., targets=...)`` -> a small :class:`SampleTensors`
    split built by :func:`build_samples_table`."""
    from nextloc.models.batch import SampleTensors

    def make(users: list[int], histories: list[list[int]], targets: list[int]) -> SampleTensors:
        return SampleTensors(build_samples_table(users, histories, targets))

    return make


@pytest.fixture(scope="session")
def full_archive() -> Path:
    """The full GeoLife 1.3 archive from ../shared."""
    return require_data(
        Path(os.environ.get("NEXTLOC_GEOLIFE_ARCHIVE", SHARED / "geolife-1.3-raw.tar.xz")),
        "full GeoLife archive",
    )


@pytest.fixture(scope="session")
def prefect_api():
    """The session's local Prefect API (:mod:`services.local_api` in the session's ``PREFECT_HOME``, on
    127.0.0.1), the one the ``nextloc`` commands the tests run also use; stopped at the session's end."""
    from prefect.settings import temporary_settings

    from services import local_api

    api = local_api.attach_or_start(local_api.prefect_home())
    try:
        api.wait(180)
        with temporary_settings(updates=local_api.prefect_settings(api)):
            yield api
    finally:
        api.release()


@pytest.fixture(scope="session")
def _preprocessed_sample(sample_dir, prefect_api, tmp_path_factory) -> Path:
    """The preprocess flow's outputs for the GeoLife sample (default config), run once; never handed out."""
    from flows.preprocess import preprocess

    data_dir = tmp_path_factory.mktemp("preprocessed-sample") / "data"
    preprocess(raw_dir=str(sample_dir), data_dir=str(data_dir))
    return data_dir


@pytest.fixture(scope="session")
def preprocessed_copy(_preprocessed_sample) -> Callable[[Path], Path]:
    """``preprocessed_copy(data_dir)``: a copy of the sample preprocessed by the flow (default config) at
    ``data_dir``, exactly what ``preprocess(raw_dir=sample, data_dir=data_dir)`` writes there (its content
    cache included: a copied data directory is all cache hits, tests/flows/test_content_cache.py); the flow
    and browser tests share it."""

    def copy(data_dir: Path) -> Path:
        shutil.copytree(_preprocessed_sample, data_dir)
        return data_dir

    return copy


@pytest.fixture
def web_answer() -> tuple[pd.DataFrame, dict]:
    """Four visits (the first and the last at one place, the third at a place the model never saw) and an
    answer of three places, one without coordinates."""
    import pandas as pd

    history = pd.DataFrame(
        {
            "started_at": pd.to_datetime(
                ["2008-10-01 08:00", "2008-10-01 12:00", "2008-10-01 18:00", "2008-10-02 08:00"], utc=True
            ),
            "place": [5, 7, 1, 5],
            "latitude": [39.98, 39.99, 40.0, 39.98],
            "longitude": [116.30, 116.32, 116.31, 116.30],
        }
    )
    answer = {
        "user_id": 73,
        "at": "2008-10-02T09:00:00Z",
        "p_new_place": 0.123,
        "places": [
            {
                "rank": 1,
                "location_id": 5,
                "latitude": 39.98,
                "longitude": 116.3,
                "n_visits": 37,
                "probability": 0.6,
            },
            {
                "rank": 2,
                "location_id": 7,
                "latitude": 39.99,
                "longitude": 116.32,
                "n_visits": 12,
                "probability": 0.3,
            },
            {"rank": 3, "location_id": 9, "probability": 0.05},
        ],
    }
    return history, answer


#: What routes a command to a server: a test that runs ``nextloc`` in-process (``commands.main.main``) may set
#: them for the process, as the command does; the next test starts without them.
ROUTING_ENV = ("NEXTLOC_", "MLFLOW_", "PREFECT_API_URL", "PREFECT_UI_URL")


@pytest.fixture(autouse=True)
def restore_routing_env():
    saved = {k: v for k, v in os.environ.items() if k.startswith(ROUTING_ENV)}
    yield
    for key in [k for k in os.environ if k.startswith(ROUTING_ENV) and k not in saved]:
        del os.environ[key]
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def no_stalled_request(request):
    """Fail the test during which the session's local Prefect API logged a request slower than ``STALL_S``
    (its log is kept under ``test-artifacts/``)."""
    log_path = Path(_PREFECT_HOME) / "nextloc-api.log"
    start = log_path.stat().st_size if log_path.exists() else 0
    yield
    stalls = _stalls(log_path, start)
    if stalls:
        kept = _keep_log(log_path, request.node.name)
        pytest.fail(f"the local Prefect API stalled: {stalls}; its log: {kept}")


def _stalls(log_path: Path, start: int) -> list[str]:
    import re

    if not log_path.exists():
        return []
    with open(log_path, errors="replace") as log:
        log.seek(start)
        lines = log.read().splitlines()
    pattern = re.compile(r"slow request: .* took ([0-9.]+) s")
    return [line for line in lines if (m := pattern.search(line)) and float(m.group(1)) > STALL_S]


def _keep_log(log_path: Path, name: str) -> Path:
    import shutil

    target = ARTIFACTS / "local-api" / f"{name}.log"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(log_path, target)
    return target


@pytest.fixture(scope="session", autouse=True)
def stop_local_apis(tmp_path_factory):
    """At the session's end, stop every local Prefect API its tests started (the session's own and those
    of commands run with another ``PREFECT_HOME`` under the session's temporary folders)."""
    yield
    from services import local_api

    stalls = []
    for root in {Path(_PREFECT_HOME), tmp_path_factory.getbasetemp()}:
        for folder, _dirs, files in os.walk(root):
            if local_api.RECORD in files:
                local_api.stop_server(Path(folder))
            if local_api.LOG in files and (found := _stalls(Path(folder) / local_api.LOG, 0)):
                stalls.append(
                    f"{found} (log kept: {_keep_log(Path(folder) / local_api.LOG, Path(folder).name)})"
                )
    if stalls:
        pytest.fail(f"a local Prefect API stalled: {stalls}")


def read_task_states(flow_run_id, expected: int | None = None) -> dict[str, str]:
    """Task-run name -> final state name, read back from the Prefect API for one flow run.

    Task-run states reach the API asynchronously (events), so poll until every run is final.
    """
    import asyncio
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
            return {r.name: (r.state.name if r.state else "") for r in runs}

    deadline = time.monotonic() + 60
    while True:
        states = asyncio.run(read())
        final = all(s in {"Cached", "Completed", "Failed", "Crashed"} for s in states.values())
        if (final and (expected is None or len(states) >= expected)) or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


@pytest.fixture(scope="session")
def task_states() -> Callable[..., dict[str, str]]:
    """``task_states(flow_run_id, expected=None)``: task-run name -> final state name, from the Prefect API."""
    return read_task_states


_MEASURE = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
    "sys.stderr.write(f'PEAK_KB {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n')\n"
    "sys.exit(done.returncode)\n"
)


def _peak_rss_mb(args: list[str], cwd: Path) -> float:
    import subprocess
    import sys

    env = {**os.environ, "PREFECT_HOME": str(cwd / ".prefect")}
    env.pop("PREFECT_API_URL", None)
    nextloc = str(Path(sys.executable).parent / "nextloc")
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, nextloc, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stderr.splitlines() if x.startswith("PEAK_KB"))
    return int(line.split()[1]) / 1024


@pytest.fixture(scope="session")
def peak_rss_mb() -> Callable[[list[str], Path], float]:
    """``peak_rss_mb(args, cwd)``: run ``nextloc args`` in a fresh process; the peak RSS (MB) of its tree."""
    return _peak_rss_mb


@dataclass(frozen=True)
class TeamServices:
    """What :func:`team_services` started: the folder, its services' URLs, each identity's credentials
    (``KEY=VALUE`` of ``.services/auth/<identity>.env``), and the deployment run it made."""

    root: Path
    env: dict[str, str]  # for commands in ``root``: its ports and Prefect home, no credentials
    api: str
    mlflow: str
    pipeline: dict[str, str]
    reader: dict[str, str]
    flow_run_id: str


def _team_env(root: Path) -> dict[str, str]:
    from services.processes import free_port_env

    env = {**os.environ, "PREFECT_HOME": str(root / ".prefect"), "PYTHONPATH": str(REPO)}
    env.update(free_port_env())
    for key in ("PREFECT_API_URL", "NEXTLOC_DB_URL", "NEXTLOC_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    for key in ("PREFECT_API_AUTH_STRING", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(key, None)
    return env


@pytest.fixture(scope="session")
def team_services(sample_dir) -> Iterator[TeamServices]:
    """``nextloc services start`` (authentication on) in a /tmp project folder on free 127.0.0.1 ports
    (PostgreSQL; SQLite without its binaries), and one ``preprocess-train/geolife`` run (markov on the
    sample) triggered with the pipeline's credentials, completed; the services are stopped at the end."""
    import subprocess
    import sys
    import time

    import services as svc_module
    from services import auth
    from services.processes import post_json
    from tracking import access

    root = Path(tempfile.mkdtemp(prefix="nextloc-auth-", dir="/tmp"))
    root.chmod(0o755)  # as root, PostgreSQL runs as the postgres user, which must reach .services/pg
    env = _team_env(root)
    try:
        svc_module.postgres_bin_dir()
    except RuntimeError:
        env["NEXTLOC_SERVICES_BACKEND"] = "sqlite"
    nextloc = [str(Path(sys.executable).parent / "nextloc"), "services"]
    started = subprocess.run([*nextloc, "start"], cwd=root, env=env, capture_output=True, text=True)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        services = svc_module.Services(
            root, *(int(env[f"NEXTLOC_{n}_PORT"]) for n in ("PREFECT", "MLFLOW", "PG")), db_url=None
        )
        pipeline = auth.credentials(services, auth.PIPELINE)
        headers = access.authorization(pipeline[access.PREFECT_AUTH])
        [deployment] = post_json(
            f"{services.api_url}/deployments/filter",
            {"deployments": {"name": {"any_": ["geolife"]}}},
            30,
            headers,
        )
        params = {
            "raw_dir": str(sample_dir),
            "data_dir": "data/auth",
            "training": {"models": ["markov"], "seeds": [0]},
        }
        url = f"{services.api_url}/deployments/{deployment['id']}/create_flow_run"
        run = post_json(url, {"parameters": params}, 30, headers)
        deadline = time.monotonic() + 900
        state = None
        while time.monotonic() < deadline and state not in ("COMPLETED", "FAILED", "CRASHED"):
            time.sleep(2)
            body = {"flow_runs": {"id": {"any_": [run["id"]]}}}
            state = post_json(f"{services.api_url}/flow_runs/filter", body, 30, headers)[0]["state_type"]
        assert state == "COMPLETED", state
        yield TeamServices(
            root,
            env,
            services.api_url,
            services.mlflow_url,
            pipeline,
            auth.credentials(services, auth.READER),
            run["id"],
        )
    finally:
        subprocess.run([*nextloc, "stop"], cwd=root, env=env, capture_output=True, timeout=300)
        shutil.rmtree(root, ignore_errors=True)
