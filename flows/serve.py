"""Serve the deployments: ``preprocess-train/geolife`` and ``retrain/geolife-dumps``.

``python -m flows.serve`` (``make services`` starts it in the background) registers both deployments with
the Prefect API in ``PREFECT_API_URL`` and runs their flow runs in subprocesses of this process, in the
current folder, until interrupted. ``retrain/geolife-dumps`` also runs on a cron schedule
(``$NEXTLOC_RETRAIN_CRON``, default hourly at minute 17) over ``data/incoming``.
"""

from __future__ import annotations

import os
import sys

from flows.cli import configure_environment

RETRAIN_CRON = os.environ.get("NEXTLOC_RETRAIN_CRON", "17 * * * *")


def deployments() -> list:
    """The two deployments, with the GeoLife defaults as their parameters."""
    from flows.pipeline import preprocess_train
    from flows.retrain import retrain

    return [
        preprocess_train.to_deployment(
            name="geolife",
            description="GeoLife 1.3: preprocess (reference protocol), train and evaluate, promote the champion.",
            tags=["nextloc", "geolife"],
        ),
        retrain.to_deployment(
            name="geolife-dumps",
            cron=RETRAIN_CRON,
            description="Merge new trajectory dumps from data/incoming, reprocess what changed, retrain, "
            "champion vs challenger.",
            tags=["nextloc", "geolife", "retrain"],
        ),
    ]


def main() -> int:
    """Serve until SIGINT/SIGTERM."""
    configure_environment()
    if not os.environ.get("PREFECT_API_URL"):
        sys.stderr.write("PREFECT_API_URL is not set: start a server (make services) or export its URL\n")
        return 2
    from prefect import serve

    serve(*deployments(), limit=int(os.environ.get("NEXTLOC_SERVE_LIMIT", "1")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
