"""nextloc's Prefect flows.

Importing this package sets the offline defaults that must be in place before Prefect reads its settings,
so that calling a flow straight from Python (``from flows.pipeline import preprocess_train``) behaves like
the ``nextloc`` command: no telemetry, no analytics. A value the user has set is kept.

:data:`OFFLINE_DEFAULTS` is the one home of these variables: the services, the tests and the benchmarks
put them in the environments they build from here (the Makefile exports the same, for what make runs).
"""

from __future__ import annotations

import os

OFFLINE_DEFAULTS: dict[str, str] = {
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}

for _key, _value in OFFLINE_DEFAULTS.items():
    os.environ.setdefault(_key, _value)
