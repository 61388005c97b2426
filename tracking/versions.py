"""The MLflow model registry: registering and describing a trained version (:func:`log_model`,
:func:`describe_version`), downloading a registered version's bundle, the ``champion`` alias (which version
holds it, moving it) and the records of a champion decision.

The second MLflow module beside :mod:`tracking.mlflow_runs` (runs, metrics, artifacts), which names the registered
models (:func:`tracking.mlflow_runs.registered_name`). The rule that decides is :mod:`tasks.promotion` with
:func:`nextloc.evaluation.champion.champion_decision`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from nextloc.evaluation.metrics import HEADLINE
from tracking.settings import REGISTERED_PREFIX, redact

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.models import ModelSignature

# MLflow (about 2 s to import, its SQL store 2 s more) is imported where it is called: `nextloc predict`
# reads a SQLite registry without it (local_bundle)
CHAMPION = "champion"


def local_bundle(kind: str, alias: str, tracking_uri: str) -> Path | None:
    """The bundle folder of ``nextloc-<kind>`` at ``alias`` (a version number names itself), read in place
    from a SQLite store: the alias resolved in the registry's own tables, as MLflow's SQL store does
    (``registered_model_aliases``, then the version's ``storage_location``), without importing MLflow.

    None where it cannot be read that way, and the caller asks MLflow (:func:`download_bundle`): another kind
    of store, a version whose artifacts are not a local folder or hold no bundle, tables this does not know.
    """
    if not tracking_uri.startswith("sqlite:///"):
        return None
    name = f"{REGISTERED_PREFIX}{kind}"
    db = Path(tracking_uri.removeprefix("sqlite:///"))
    if not db.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as con:
            if not alias.isdigit():
                found = con.execute(
                    "SELECT version FROM registered_model_aliases WHERE name = ? AND alias = ?", (name, alias)
                ).fetchall()
                if len(found) != 1:
                    return None
                alias = str(found[0][0])
            rows = con.execute(
                "SELECT storage_location, status, current_stage FROM model_versions "
                "WHERE name = ? AND version = ?",
                (name, int(alias)),
            ).fetchall()
    except sqlite3.Error:
        return None
    if len(rows) != 1 or rows[0][1] != "READY" or rows[0][2] == "Deleted_Internal":
        return None
    return _bundle_in(rows[0][0] or "")


def champion_versions(kinds: list[str], tracking_uri: str, experiment: str) -> dict[str, str | None]:
    """The version of ``nextloc-<kind>`` holding the ``champion`` alias, per kind (None without one).

    A SQLite store is read in place, as :func:`local_bundle` reads it (a cached rerun asks this before it
    decides whether anything needs MLflow at all); any other store, or a table this does not know, is asked
    through MLflow (:func:`champion_holder`).
    """
    local = _sqlite_aliases(CHAMPION, tracking_uri)
    if local is not None:
        return {kind: local.get(f"{REGISTERED_PREFIX}{kind}") for kind in kinds}
    from tracking import mlflow_runs

    mlflow_runs.configure(tracking_uri, experiment)
    return {kind: (holder.version if (holder := champion_holder(kind)) else None) for kind in kinds}


def _sqlite_aliases(alias: str, tracking_uri: str) -> dict[str, str] | None:
    """Registered model name -> the version holding ``alias``, read from a SQLite store's own table; an
    empty dict for a store not created yet; None where it cannot be read that way."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = Path(tracking_uri.removeprefix("sqlite:///"))
    if not db.exists():
        return {}
    try:
        with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as con:
            rows = con.execute(
                "SELECT name, version FROM registered_model_aliases WHERE alias = ?", (alias,)
            ).fetchall()
    except sqlite3.Error:
        return None
    return {name: str(version) for name, version in rows}


def _bundle_in(location: str) -> Path | None:
    """The bundle folder inside a logged model's local folder (``file://`` URI), or None."""
    from nextloc.bundle import BUNDLE_ARTIFACT, BUNDLE_FILE  # torch: only when a bundle is read

    parsed = urllib.parse.urlparse(location)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        return None
    model = Path(urllib.parse.unquote(parsed.path))
    try:
        spec = yaml.safe_load((model / "MLmodel").read_text())
    except (OSError, yaml.YAMLError):
        return None
    artifacts = (spec or {}).get("flavors", {}).get("python_function", {}).get("artifacts") or {}
    path = (artifacts.get(BUNDLE_ARTIFACT) or {}).get("path")
    folder = model / path if path else None
    return folder if folder is not None and (folder / BUNDLE_FILE).is_file() else None


def download_bundle(model_uri: str, dst: Path) -> Path:
    """Download a registered model and return its bundle folder, or its model folder for a model logged
    without one (which :func:`tracking.registered.load_registered` refuses)."""
    import mlflow

    from nextloc.bundle import BUNDLE_ARTIFACT  # torch: only when a bundle is read

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
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tracking import mlflow_runs

    with contextlib.suppress(MlflowException):
        version = MlflowClient().get_model_version_by_alias(mlflow_runs.registered_name(kind), CHAMPION)
        return Holder(str(version.version), version.run_id)
    return None


def alias_version(kind: str, alias: str) -> str | None:
    """The version of ``nextloc-<kind>`` that ``alias`` names (a version number names itself); None when
    there is no such alias, version or registered model."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tracking import mlflow_runs

    client = MlflowClient()
    name = mlflow_runs.registered_name(kind)
    with contextlib.suppress(MlflowException):
        found = (
            client.get_model_version(name, alias)
            if alias.isdigit()
            else client.get_model_version_by_alias(name, alias)
        )
        return str(found.version)
    return None


class ModelNotFound(LookupError):
    """A registered model, alias or tracking store that is not there; its message is one line for a person."""


def require_version(kind: str, alias: str, tracking_uri: str) -> str:
    """The version of ``nextloc-<kind>`` that ``alias`` names in the configured store (``tracking_uri``).

    Raises:
        ModelNotFound: there is no such version: which model and alias were looked for, in which store, which
            models the store holds, and the command that trains the one asked for.
    """
    version = alias_version(kind, alias)
    if version is not None:
        return version
    from tracking import mlflow_runs

    held = held_models()
    holds = "; ".join(
        f"{name} ({', '.join(f'{a}: v{v}' for a, v in aliases.items()) or 'no alias'})"
        for name, aliases in held.items()
    )
    looked_for = (
        f"{mlflow_runs.registered_name(kind)}@{alias}"
        if not alias.isdigit()
        else (f"{mlflow_runs.registered_name(kind)} version {alias}")
    )
    raise ModelNotFound(
        f"no {looked_for} in the tracking store {redact(tracking_uri)}; it holds "
        f"{holds or 'no nextloc model'}. Train and register it with `nextloc train --model {kind}`"
        + (" (the champion alias follows the best version)" if alias == CHAMPION else "")
    )


def held_models() -> dict[str, dict[str, str]]:
    """The registered nextloc models of the configured store: name -> {alias: version}, names sorted."""
    from mlflow import MlflowClient

    found = MlflowClient().search_registered_models(filter_string=f"name LIKE '{REGISTERED_PREFIX}%'")
    return {model.name: dict(sorted(model.aliases.items())) for model in sorted(found, key=lambda m: m.name)}


def move_champion(kind: str, version: str) -> None:
    """Give the ``champion`` alias of ``nextloc-<kind>`` to ``version``."""
    from mlflow import MlflowClient

    from tracking import mlflow_runs

    MlflowClient().set_registered_model_alias(mlflow_runs.registered_name(kind), CHAMPION, version)


def record_decision(parent_run_id: str, kind: str, decision: dict[str, Any]) -> None:
    """Record a champion decision (with its ``decision`` sentence).

    The parent run gets the scores (``challenger_<split>_<metric>``, ``champion_<split>_<metric>``, the split
    the decision read: ``decision["metric"]`` is ``"<split> <metric>"``) and the bootstrap's statistics as
    metrics, the decision as tags and the whole
    decision as ``champion_challenger_<kind>.json``. The challenger's run and registry version get the
    sentence as ``champion_decision``; a champion that stays also gets it as ``champion_kept``, next to the
    decision that made it champion. A rerun of the same trainings (the challenger already is the champion)
    leaves the run and version with that decision.
    """
    from mlflow import MlflowClient

    from tracking import mlflow_runs

    prefix = f"champion_challenger.{kind}"
    split, _, metric = decision.get("metric", "").rpartition(" ")
    scored = f"{split}_{mlflow_runs.mlflow_name(metric)}" if split else mlflow_runs.mlflow_name(metric)
    values = {
        f"{prefix}.challenger_{scored}": decision.get("challenger_score"),
        f"{prefix}.champion_{scored}": decision.get("champion_score"),
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
    mlflow_runs.log_dict_artifact(parent_run_id, decision, f"champion_challenger_{kind}.json")
    if decision.get("champion_version") == decision.get("challenger_version"):
        return
    text = decision["decision"][:500]
    if decision.get("challenger_run_id"):
        client.set_tag(decision["challenger_run_id"], "champion_decision", text)
    name = mlflow_runs.registered_name(kind)
    if decision.get("challenger_version"):
        client.set_model_version_tag(name, decision["challenger_version"], "champion_decision", text)
    holder = decision.get("champion_version")
    if holder and not decision["promoted"]:
        client.set_model_version_tag(name, holder, "champion_kept", text)


PYFUNC_CODE = Path(__file__).with_name("pyfunc_model.py")


def model_signature() -> ModelSignature:
    """The registered models' signature: visits as named, typed columns; params ``k``, ``at`` and
    ``coverage`` (none: no answer set).

    Times are ISO 8601 text (a zone may be given; none means UTC): MLflow's ``datetime`` type takes
    zone-naive values only, and text lets the model name the row of an unparsable time.
    """
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(
        inputs=Schema(
            [
                ColSpec("long", "user_id"),
                ColSpec("string", "started_at"),
                ColSpec("string", "finished_at"),
                ColSpec("double", "latitude"),
                ColSpec("double", "longitude"),
                ColSpec("string", "history_id", required=False),
            ]
        ),
        params=ParamSchema(
            [ParamSpec("k", "long", 5), ParamSpec("at", "string", ""), ParamSpec("coverage", "double", None)]
        ),
    )


def log_model(
    bundle_dir: Path, example: pd.DataFrame | None, kind: str, pip_requirements: list[str]
) -> tuple[str, str, str]:
    """Log a model bundle (inside the active run) as a models-from-code pyfunc and register it.

    The code is :data:`PYFUNC_CODE`, the weights and config the bundle (:func:`nextloc.bundle.save_bundle`):
    nothing is pickled. The version is created under :func:`runtime.locking.registry_lock`, after the
    registered model where it is new (``mlflow.register_model`` would try to create the registered model
    every time and recover from the duplicate).

    Returns:
        ``(model_uri, registered version, logged model id)``.
    """
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from nextloc.bundle import BUNDLE_ARTIFACT  # torch: only when a model is registered
    from runtime.locking import registry_lock
    from tracking import mlflow_runs

    info = mlflow.pyfunc.log_model(
        name="model",
        python_model=str(PYFUNC_CODE),
        artifacts={BUNDLE_ARTIFACT: str(bundle_dir)},
        signature=model_signature(),
        input_example=example,
        pip_requirements=pip_requirements,
    )
    name = mlflow_runs.registered_name(kind)
    client = MlflowClient()
    with registry_lock():
        try:
            client.get_registered_model(name)
        except MlflowException:
            client.create_registered_model(name)
        version = client.create_model_version(
            name, info.model_uri, run_id=info.run_id, model_id=info.model_id
        )
    return info.model_uri, str(version.version), info.model_id


VERSION_SCORES = (HEADLINE, "place_mrr", "acc@1", "mrr")


TALLY_NOTICE = (
    ". Personal data: this version carries each training user's routine tally (profile.parquet in its "
    "bundle): visit counts per place, time-of-day slot, kind of day and move between places, and the time of "
    "the last visit per place, and the centre of each place they went to outside the model's vocabulary; "
    "no list of visits. Delete the version to delete the tallies."
)


def describe_version(
    kind: str, version: str, seed: int, data_fingerprint: str, results: dict[str, Any]
) -> None:
    """Tag and describe a registered version so the registry tells versions apart: model kind, seed, data
    fingerprint, test scores, the validation score the champion rule selects seeds by, and the selected epoch.
    (The champion decision is added by :mod:`tasks.promotion`.)"""
    from mlflow import MlflowClient

    from tracking import mlflow_runs

    client = MlflowClient()
    name = mlflow_runs.registered_name(kind)
    val = results.get("val", {})
    tags = {
        "model": kind,
        "seed": str(seed),
        "data_fingerprint": data_fingerprint,
        **{
            f"test_{mlflow_runs.mlflow_name(key)}": f"{results[key]:.2f}"
            for key in VERSION_SCORES
            if key in results
        },
        **{mlflow_runs.selected_name(key): f"{val[key]:.2f}" for key in VERSION_SCORES if key in val},
    }
    if results.get(mlflow_runs.SELECTED_EPOCH) is not None:
        tags[mlflow_runs.SELECTED_EPOCH] = str(results[mlflow_runs.SELECTED_EPOCH])
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    scores = ", ".join(f"{key} {results[key]:.2f}" for key in VERSION_SCORES if key in results)
    description = f"{kind} seed {seed}, data {data_fingerprint[:12]}: test {scores} (%)"
    if results.get("holds_tally"):
        description += TALLY_NOTICE
    client.update_model_version(name, version, description=description)
