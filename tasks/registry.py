"""The MLflow model registry after training: downloading a registered version's bundle, the ``champion``
alias (which version holds it, moving it) and the records of a champion decision.

The second MLflow module behind :mod:`tasks.tracking`, kept apart so that each stays under 500 lines.
Registering and describing a version happen inside a training's run and stay in tracking.py
(:func:`tasks.tracking.log_model`, :func:`tasks.tracking.describe_version`), as do the registered models'
names (:func:`tasks.tracking.registered_name`). The rule that decides is :mod:`tasks.promotion` with
:func:`nextloc.evaluate.champion_decision`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import yaml
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from nextloc.serving import BUNDLE_ARTIFACT
from tasks import tracking

CHAMPION = "champion"


def download_bundle(model_uri: str, dst: Path) -> Path:
    """Download a registered model and return its bundle folder, or its model folder for a model logged
    without one (which :func:`tasks.evaluate.load_registered` refuses)."""
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(dst)))
    spec = yaml.safe_load((local / "MLmodel").read_text())
    artifacts = spec.get("flavors", {}).get("python_function", {}).get("artifacts") or {}
    if BUNDLE_ARTIFACT in artifacts:
        return local / artifacts[BUNDLE_ARTIFACT]["path"]
    return local


@dataclass(frozen=True)
class Holder:
    """The registered version holding the alias and the run that logged it."""

    version: str
    run_id: str


def champion_holder(kind: str) -> Holder | None:
    """The version of ``nextloc-<kind>`` holding the ``champion`` alias; None without one (or without the
    registered model)."""
    with contextlib.suppress(MlflowException):
        version = MlflowClient().get_model_version_by_alias(tracking.registered_name(kind), CHAMPION)
        return Holder(str(version.version), version.run_id)
    return None


def move_champion(kind: str, version: str) -> None:
    """Give the ``champion`` alias of ``nextloc-<kind>`` to ``version``."""
    MlflowClient().set_registered_model_alias(tracking.registered_name(kind), CHAMPION, version)


def record_decision(parent_run_id: str, kind: str, decision: dict[str, Any]) -> None:
    """Record a champion decision (with its ``decision`` sentence).

    The parent run gets the scores and test statistics as metrics, the decision as tags and the whole
    decision as ``champion_challenger_<kind>.json``. The challenger's run and registry version get the
    sentence as ``champion_decision``; a champion that stays also gets it as ``champion_kept``, next to the
    decision that made it champion. A rerun of the same trainings (the challenger already is the champion)
    leaves the run and version with that decision.
    """
    prefix = f"champion_challenger.{kind}"
    metric = tracking.mlflow_name(decision.get("metric", "").removeprefix("test "))
    values = {
        f"{prefix}.challenger_test_{metric}": decision.get("challenger_score"),
        f"{prefix}.champion_test_{metric}": decision.get("champion_score"),
        f"{prefix}.delta": decision.get("delta"),
        f"{prefix}.p_value": decision.get("p_value"),
    }
    client = MlflowClient()
    for key, value in values.items():
        if value is not None:
            client.log_metric(parent_run_id, key, float(value))
    verdict = "promoted" if decision["promoted"] else "kept"
    client.set_tag(parent_run_id, f"{prefix}.decision", verdict)
    client.set_tag(parent_run_id, f"{prefix}.reason", decision["reason"][:500])
    tracking.log_dict_artifact(parent_run_id, decision, f"champion_challenger_{kind}.json")
    if decision.get("champion_version") == decision.get("challenger_version"):
        return
    text = decision["decision"][:500]
    if decision.get("challenger_run_id"):
        client.set_tag(decision["challenger_run_id"], "champion_decision", text)
    name = tracking.registered_name(kind)
    if decision.get("challenger_version"):
        client.set_model_version_tag(name, decision["challenger_version"], "champion_decision", text)
    holder = decision.get("champion_version")
    if holder and not decision["promoted"]:
        client.set_model_version_tag(name, holder, "champion_kept", text)
