"""nextloc's Prefect flows.

Importing this package sets the offline defaults that must be in place before Prefect reads its settings,
so that calling a flow straight from Python (``from flows.pipeline import preprocess_train``) behaves like
the ``nextloc`` command: no telemetry, no analytics. A value the user has set is kept.

:func:`configure_environment` adds the embedded defaults every command and deployment runs with (the
project's ``.prefect`` home, library logs in the flow-run logs). :data:`OFFLINE_DEFAULTS` is the one home of
the telemetry variables: the services, the tests and the benchmarks
put them in the environments they build from here (the Makefile exports the same, for what make runs).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

OFFLINE_DEFAULTS: dict[str, str] = {
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}

for _key, _value in OFFLINE_DEFAULTS.items():
    os.environ.setdefault(_key, _value)


def configure_environment(project_dir: Path | None = None) -> None:
    """Set the embedded defaults (only where the user has not chosen otherwise); call before importing prefect."""
    root = project_dir or Path.cwd()
    defaults = {
        **OFFLINE_DEFAULTS,
        "PREFECT_HOME": str(root / ".prefect"),
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "PREFECT_LOGGING_EXTRA_LOGGERS": "nextloc",
        "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    logging.getLogger("nextloc").setLevel(logging.INFO)
