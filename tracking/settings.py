"""Where the tracking and registry store is, without importing MLflow (the ``nextloc predict`` path reads
the registry before anything else and should not pay for MLflow's import: :func:`tracking.versions.local_bundle`)."""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

from pydantic import BaseModel, ConfigDict

REGISTERED_PREFIX = "nextloc-"  # one registered model per kind: tracking.mlflow_runs.registered_name
DEFAULT_EXPERIMENT = "nextloc-geolife"


class Tracking(BaseModel):
    """The ``tracking`` section of the flows: where runs go and where their links point.

    Attributes:
        tracking_uri: the MLflow tracking store (default :func:`default_tracking_uri`).
        experiment: the MLflow experiment.
        mlflow_ui_url: the MLflow UI the run's summary links to (default: none, or the services').
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tracking_uri: str | None = None
    experiment: str = DEFAULT_EXPERIMENT
    mlflow_ui_url: str | None = None


def tracking_server(uri: str) -> str | None:
    """``uri`` where it is an MLflow tracking server's (``http(s)://``: its UI is there too), else None (a
    store this process opens itself)."""
    return uri if uri.startswith(("http://", "https://")) else None


def default_tracking_uri(root: Path | None = None) -> str:
    """``$NEXTLOC_TRACKING_URI`` (set by ``make services`` for its flow runs), else
    ``sqlite:///<root>/mlruns/mlflow.db`` (absolute path)."""
    if os.environ.get("NEXTLOC_TRACKING_URI"):
        return os.environ["NEXTLOC_TRACKING_URI"]
    base = (root or Path.cwd()).resolve() / "mlruns"
    base.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{base / 'mlflow.db'}"


def redact(uri: str) -> str:
    """A tracking store's URI without its password, for messages and logs."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
