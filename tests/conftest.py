"""Shared fixtures: where the real GeoLife data is, and an isolated Prefect API per test session."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# Isolated Prefect state for the whole session, set before anything imports prefect.
_PREFECT_HOME = tempfile.mkdtemp(prefix="nextloc-prefect-")
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "nextloc")
os.environ.pop("PREFECT_API_URL", None)


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
def full_archive() -> Path:
    """The full GeoLife 1.3 archive from ../shared."""
    return require_data(
        Path(os.environ.get("NEXTLOC_GEOLIFE_ARCHIVE", SHARED / "geolife-1.3-raw.tar.xz")),
        "full GeoLife archive",
    )


@pytest.fixture(scope="session")
def prefect_api():
    """A real, temporary Prefect API (ephemeral server on 127.0.0.1) for flow tests."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield
