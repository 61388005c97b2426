"""MLflow, in one place: tracking URI, experiment, runs, model logging, registry and aliases.

Nothing happens at import. ``configure()`` chooses the backend explicitly: by default a SQLite store
``mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts`` (MLflow >= 3.7 changed its implicit
default; the file store is in maintenance mode).
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow import MlflowClient
from mlflow.models import infer_signature

from nextloc.serving import PackedScorer

logger = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "nextloc-geolife"
CHAMPION = "champion"


def default_tracking_uri(root: Path | None = None) -> str:
    """``sqlite:///<root>/mlruns/mlflow.db`` (absolute path)."""
    base = (root or Path.cwd()).resolve() / "mlruns"
    base.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{base / 'mlflow.db'}"


def configure(tracking_uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT) -> str:
    """Point MLflow at the store and make sure the experiment exists; returns the experiment id."""
    uri = tracking_uri or default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    if exp is not None:
        return exp.experiment_id
    artifact_location = None
    if uri.startswith("sqlite:///"):
        artifact_location = (Path(uri[len("sqlite:///") :]).parent / "artifacts").resolve().as_uri()
    try:
        return client.create_experiment(experiment, artifact_location=artifact_location)
    except mlflow.exceptions.MlflowException:  # created concurrently
        return client.get_experiment_by_name(experiment).experiment_id


def log_input(dataset: Any, context: str, attempts: int = 5) -> None:
    """``mlflow.log_input`` that survives a concurrent first insert of the same dataset.

    Trainings running side by side log the same dataset; on a fresh SQLite store two of them can race to
    insert its row and one fails with ``UNIQUE constraint failed: datasets...`` (seen on the full data).
    The row exists by then, so logging again succeeds.
    """
    for attempt in range(1, attempts + 1):
        try:
            mlflow.log_input(dataset, context=context)
            return
        except mlflow.exceptions.MlflowException as err:
            if "UNIQUE constraint failed" not in str(err) or attempt == attempts:
                raise
            logger.info("dataset row inserted concurrently; logging the input again (%d)", attempt)
            time.sleep(0.2 * attempt)


def close_interrupted_runs(experiment_id: str, tags: dict[str, str]) -> list[str]:
    """Mark as KILLED the runs with these tags still RUNNING: a killed process never ended them.

    Safe only while no other process can be running them: the caller holds the data directory's lock
    (``tasks.locking``) and the tags name the data directory, model and seed.
    """
    query = " and ".join([*(f"tags.{k} = '{v}'" for k, v in tags.items()), "attributes.status = 'RUNNING'"])
    client = MlflowClient()
    stale = [r.info.run_id for r in client.search_runs([experiment_id], query)]
    for run_id in stale:
        client.set_tag(run_id, "nextloc.interrupted", "true")
        client.set_terminated(run_id, "KILLED")
        logger.warning("MLflow run %s was left RUNNING by an interrupted process; marked KILLED", run_id)
    return stale


def registered_name(kind: str) -> str:
    """One registered model per model kind."""
    return f"nextloc-{kind}"


def log_dict_artifact(run_id: str, data: Any, name: str) -> None:
    """Log a JSON artifact to a run."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        MlflowClient().log_artifact(run_id, str(path))


def log_file_artifact(run_id: str, path: Path, artifact_path: str | None = None) -> None:
    """Log a file artifact to a run."""
    MlflowClient().log_artifact(run_id, str(path), artifact_path)


def log_torch_model(
    model: torch.nn.Module, example: np.ndarray, kind: str, log_prob_output: bool, pip_requirements: list[str]
) -> tuple[str, str]:
    """Log a model (inside the active run) with signature and input example, and register it.

    Returns:
        ``(model_uri, registered version)``.
    """
    scorer = PackedScorer(model.cpu().eval(), log_prob_output)
    with torch.no_grad():
        output = scorer(torch.from_numpy(example)).numpy()
    info = mlflow.pytorch.log_model(
        scorer,
        name="model",
        signature=infer_signature(example, output),
        input_example=example,
        serialization_format="pickle",
        registered_model_name=registered_name(kind),
        pip_requirements=pip_requirements,
    )
    return info.model_uri, str(info.registered_model_version)


def promote_champion(kind: str, metric: str, data_fingerprint: str | None = None) -> dict[str, Any]:
    """Give the alias ``champion`` to the registered version whose run is best on ``metric`` (higher wins).

    Only versions trained on the dataset with ``data_fingerprint`` compete (validation scores on other
    data are not comparable); a champion trained on other data is replaced.
    """
    client = MlflowClient()
    name = registered_name(kind)
    best: tuple[float, str, str] | None = None
    for version in client.search_model_versions(f"name='{name}'"):
        if not version.run_id:
            continue
        run = client.get_run(version.run_id)
        if data_fingerprint and run.data.tags.get("data_fingerprint") != data_fingerprint:
            continue
        score = run.data.metrics.get(metric)
        if score is not None and (best is None or score > best[0]):
            best = (score, version.version, version.run_id)
    if best is None:
        return {"promoted": False, "reason": f"no version of {name} has {metric}"}
    current = None
    with contextlib.suppress(mlflow.exceptions.MlflowException):
        current = client.get_model_version_by_alias(name, CHAMPION)
    if current is not None and current.version != best[1]:
        current_run = client.get_run(current.run_id)
        current_score = current_run.data.metrics.get(metric)
        same_data = (
            current_run.data.tags.get("data_fingerprint") == data_fingerprint or data_fingerprint is None
        )
        if same_data and current_score is not None and current_score >= best[0]:
            return {
                "promoted": False,
                "champion_version": current.version,
                "champion_score": current_score,
                "challenger_score": best[0],
            }
    client.set_registered_model_alias(name, CHAMPION, best[1])
    logger.info("%s@%s -> version %s (%s %.3f)", name, CHAMPION, best[1], metric, best[0])
    return {"promoted": True, "champion_version": best[1], "champion_score": best[0], "run_id": best[2]}
