"""A training rerun with nothing new: every training cached and every champion where the last decision left it.

Such a rerun adds no MLflow parent run and needs no MLflow at all: its results and champion decisions are the
ones already on the parent run that recorded them, which the record below names. The record is keyed on what
the decisions read (the trainings' MLflow runs, in order; the champion alias of each kind, read after the
decisions; the decision rule; the store and experiment; the ingest report; the library code), so any change
(a training that reruns, an alias moved by another run, another rule) finds no record and the rerun records
and decides as usual. Records live in the data directory's cache (``<cache>/reruns/<key>.json``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel

from nextloc.atomic import write_text_atomic
from nextloc.fingerprint import hash_file, hash_text
from runtime.caching import library_fingerprint
from runtime.catalog import Catalog

_FOLDER = "reruns"


@dataclass(frozen=True)
class Settled:
    """Where the results of a set of cached trainings, and the decisions on them, are recorded."""

    parent_run_id: str
    experiment_id: str
    promotion: dict[str, Any]


def settled_key(
    catalog: Catalog,
    runs: list[dict[str, Any]],
    champions: dict[str, str | None],
    rule: BaseModel,
    decided: list[str],
    tracking_uri: str,
    experiment: str,
) -> str:
    """The key of a rerun's record: see the module docstring for what it reads (``rule``: the champion rule,
    :class:`tasks.promotion.PromotionRule`; ``decided``: the kinds it decides)."""
    report = catalog.ingest_report
    payload = {
        "runs": [run["run_id"] for run in runs],
        "champions": champions,
        "rule": {**rule.model_dump(), "kinds": decided},
        "store": [tracking_uri, experiment],
        "ingest_report": hash_file(report) if report.is_file() else None,
        "library": library_fingerprint(),
    }
    return hash_text(json.dumps(payload, sort_keys=True, default=str))


def read_settled(catalog: Catalog, key: str) -> Settled | None:
    """The record under ``key``; None without one (or with one that cannot be read: the rerun records anew)."""
    path = catalog.cache / _FOLDER / f"{key}.json"
    try:
        return Settled(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_settled(catalog: Catalog, key: str, settled: Settled) -> None:
    """Record ``settled`` under ``key`` (written to a temporary file and renamed)."""
    path = catalog.cache / _FOLDER / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(asdict(settled), sort_keys=True, default=str))
