"""MLflow, behind two modules: this one (tracking URI, experiment, runs, their metrics and artifacts, the
leaderboard on the parent run, store copies) and :mod:`tracking.versions` (registering and describing a
version, a registered version's bundle, the ``champion`` alias and the records of its decisions).

Nothing happens at import, and MLflow (slow to import) is imported in the functions that call it: a
cached rerun that has nothing to record (:mod:`runtime.reruns`) never imports it. ``configure()`` chooses the backend explicitly: by default a SQLite store
``mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts`` (MLflow >= 3.7 changed its implicit
default; the file store is in maintenance mode).
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from nextloc.evaluation.leaderboard import build_leaderboard, champions, decision_text, description_markdown
from nextloc.evaluation.metrics import HEADLINE
from runtime.locking import registry_lock
from tracking.settings import DEFAULT_EXPERIMENT, REGISTERED_PREFIX, default_tracking_uri, redact

logger = logging.getLogger(__name__)


# How the MLflow UI (3.17) shows the experiment. Its kind tag says "model training" (not a GenAI app); the UI
# itself opens an experiment on the runs only with ``?workflowType=machine_learning`` in the URL (or once the
# user picked "Model training" in its sidebar, which it remembers). It has no server-side default for the
# runs table's columns, but it has saved views: an experiment tag ``mlflow.sharedViewState.<key>`` holding
# the table's state, listed in the runs page's view menu and opened by ``?viewStateShareKey=<key>``.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
DESCRIPTION_TAG = "mlflow.note.content"  # the UI's description of an experiment, run or model
SAVED_VIEW_TAG = "mlflow.sharedViewState."
COMPARISON_VIEW = "nextloc-comparison"
COMPARISON_VIEW_NAME = "Model comparison"
SELECTED_EPOCH = "selected_epoch"


def mlflow_name(key: str) -> str:
    """MLflow metric names cannot hold '@': ``acc@1`` -> ``acc_at_1``."""
    return key.replace("@", "_at_")


def selected_name(key: str) -> str:
    """The MLflow name of a validation metric of the model selected on validation (at ``selected_epoch``):
    ``place_mrr`` -> ``val_place_mrr_at_selected``."""
    return f"val_{mlflow_name(key)}_at_selected"


# the runs table of the comparison view: test place and reference metrics, P(new place) AUC, selected epoch
COMPARISON_METRICS = (
    *(f"test_{mlflow_name(key)}" for key in (HEADLINE, "place_mrr", "acc@1", "mrr", "new_place_auc")),
    SELECTED_EPOCH,
)
EXPERIMENT_DESCRIPTION = f"""nextloc model training: one parent run per training (named by date and models; \
per model kind the mean and standard deviation over seeds of every test metric, `<kind>.test_<metric>_mean` / \
`_std`, the leaderboard and the champion decisions) and one child run per model and seed (`<kind> s<seed>`).

Compare models: the **{COMPARISON_VIEW_NAME}** view (the view menu at the top right of *Runs*) lists every \
model run, best test place Acc@1 first, with the test metrics and the selected epoch as columns; tick runs \
and press *Compare*. Registered models: *Model registry* (`nextloc-<kind>`; the `champion` alias)."""


def configure(tracking_uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT) -> str:
    """Point MLflow at the store and make sure the experiment exists, tagged; returns the experiment id.

    Creating and tagging happen under :func:`runtime.locking.registry_lock`: runs starting at once on a fresh
    store would otherwise race to insert the same rows.

    Raises:
        tracking.access.ServiceRefused: a tracking server refused this process's credentials.
    """
    import mlflow
    from mlflow import MlflowClient

    from tracking.access import check_mlflow

    uri = tracking_uri or default_tracking_uri()
    check_mlflow(uri)  # a refused credential named, with what to set, before MLflow's own error
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    if exp is not None and not _missing_experiment_tags(exp.tags):
        return exp.experiment_id
    with registry_lock():
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            client.create_experiment(experiment, artifact_location=_artifact_location(uri))
            exp = client.get_experiment_by_name(experiment)
        for key, value in _missing_experiment_tags(exp.tags).items():
            client.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


def experiment_id(tracking_uri: str, experiment: str = DEFAULT_EXPERIMENT) -> str | None:
    """The id of ``experiment`` in the store at ``tracking_uri``, or None where it has none (nothing created)."""
    from mlflow import MlflowClient

    found = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).get_experiment_by_name(
        experiment
    )
    return None if found is None else found.experiment_id


def _artifact_location(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite store; ``mlruns/artifacts`` for a database
    store written directly; the tracking server's own choice (its artifact proxy) for an ``http`` store."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).parent / "artifacts").resolve().as_uri()
    if uri.startswith(("postgresql", "mysql", "mssql")):
        return (Path.cwd() / "mlruns" / "artifacts").resolve().as_uri()
    return None


def comparison_view_state() -> dict[str, Any]:
    """The runs table of the comparison view: every model run flat (sorting by a metric un-nests the children
    under their parent), best test place Acc@1 first, the test metrics and the selected epoch as columns,
    and the registered model version of each run."""
    metrics = [f"metrics.`{name}`" for name in COMPARISON_METRICS]
    run_name, models = "attributes.`Run Name`", "attributes.`Models`"
    return {
        "selectedColumns": [*metrics, models],
        # column ids of the UI's table: the run name, the metrics in this order, the registered version, then
        # the UI's own "Created" and "Duration"
        "columnOrder": [run_name, *metrics, models, "runDateAndNestInfo", "duration"],
        "columnWidths": {run_name: 250},
        "orderByKey": metrics[0],
        "orderByAsc": False,
        "runsHiddenMode": "SHOW_ALL",
    }


def comparison_url(ui_url: str, experiment_id: str) -> str:
    """The MLflow UI's runs page of the experiment, opened on the comparison view."""
    return (
        f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs"
        f"?workflowType=machine_learning&viewStateShareKey={COMPARISON_VIEW}"
    )


def _missing_experiment_tags(tags: dict[str, str]) -> dict[str, str]:
    """The experiment's tags for the MLflow UI (kind, description, the comparison view) that it lacks; a
    description or view the user changed in the UI is kept."""
    wanted = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND, DESCRIPTION_TAG: EXPERIMENT_DESCRIPTION}
    view_key = SAVED_VIEW_TAG + COMPARISON_VIEW
    if view_key not in tags:
        now = int(time.time() * 1000)
        state = json.dumps(comparison_view_state())
        envelope = {"name": COMPARISON_VIEW_NAME, "createdAt": now, "updatedAt": now, "state": state}
        wanted[view_key] = json.dumps(envelope)
    return {key: value for key, value in wanted.items() if key not in tags}


def log_input(dataset: Any, context: str, attempts: int = 5) -> None:
    """``mlflow.log_input`` that survives a concurrent first insert of the same dataset.

    Trainings running side by side log the same dataset; on a fresh SQLite store two of them can race to
    insert its row and one fails with ``UNIQUE constraint failed: datasets...`` (seen on the full data).
    The row exists by then, so logging again succeeds.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    for attempt in range(1, attempts + 1):
        try:
            mlflow.log_input(dataset, context=context)
            return
        except MlflowException as err:
            if "UNIQUE constraint failed" not in str(err) or attempt == attempts:
                raise
            logger.info("dataset row inserted concurrently; logging the input again (%d)", attempt)
            time.sleep(0.2 * attempt)


def close_interrupted_runs(experiment_id: str, tags: dict[str, str]) -> list[str]:
    """Mark as KILLED the runs with these tags still RUNNING: a killed process never ended them.

    Safe only while no other process can be running them: the caller holds the data directory's lock
    (``runtime.locking``) and the tags name the data directory, model and seed.
    """
    from mlflow import MlflowClient

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
    return f"{REGISTERED_PREFIX}{kind}"


def log_dict_artifact(run_id: str, data: Any, name: str) -> None:
    """Log a JSON artifact to a run."""
    from mlflow import MlflowClient

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        MlflowClient().log_artifact(run_id, str(path))


def log_file_artifact(run_id: str, path: Path, artifact_path: str | None = None) -> None:
    """Log a file artifact to a run."""
    from mlflow import MlflowClient

    MlflowClient().log_artifact(run_id, str(path), artifact_path)


def download_run_artifacts(run_id: str, artifact_path: str, dst: Path) -> Path:
    """Download a run's artifact (file or folder) under ``dst`` and return its local path.

    Raises:
        FileNotFoundError: no such run or artifact (MLflow's error, chained), or any ``OSError`` of the
            artifact store.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        return Path(
            mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_path, dst_path=str(dst))
        )
    except MlflowException as err:
        raise FileNotFoundError(f"run {run_id}: no artifact {artifact_path!r} ({err})") from err


def data_tags(fingerprint: str, metadata_path: str | Path) -> dict[str, str]:
    """The tags naming the data a run trained on: ``data_fingerprint`` and ``protocol``, the protocol its
    samples were built under (the config in ``metadata.json``; a dataset written before the switch existed
    is the reference protocol's)."""
    config = json.loads(Path(metadata_path).read_text()).get("config", {})
    return {"data_fingerprint": fingerprint, "protocol": str(config.get("protocol", "reference"))}


def run_tags(run_id: str) -> dict[str, str]:
    """A run's tags."""
    from mlflow import MlflowClient

    return dict(MlflowClient().get_run(run_id).data.tags)


def set_run_tags(run_id: str, tags: Mapping[str, str]) -> None:
    """Set tags on a run, in order."""
    from mlflow import MlflowClient

    client = MlflowClient()
    for key, value in tags.items():
        client.set_tag(run_id, key, value)


def search_model_runs(experiment: str) -> pd.DataFrame:
    """Every model run of the experiment (runs tagged ``model``), newest first, as MLflow's runs table:
    one row per run, columns ``tags.<tag>`` and ``metrics.<metric>``."""
    import mlflow

    return mlflow.search_runs(
        experiment_names=[experiment], filter_string="tags.model != ''", order_by=["start_time DESC"]
    )


def parent_run_name(started: datetime, models: list[str]) -> str:
    """A parent run's name: when (UTC, to the minute) and which models, e.g. ``2026-11-23 21:40 markov, mhsa``."""
    return f"{started:%Y-%m-%d %H:%M} {', '.join(dict.fromkeys(models))}"


def child_run_name(kind: str, seed: int) -> str:
    """A model run's name, short enough for the runs table: ``pointer_plus s0``."""
    return f"{kind} s{seed}"


@contextlib.contextmanager
def parent_run(experiment_id: str, name: str, tags: dict[str, str], params: dict[str, str]) -> Iterator[str]:
    """The parent run of a training flow run (kind ``pipeline``): yields its id; FINISHED on success, FAILED
    on any exception (which propagates). Its description links the Prefect flow run (tags
    ``prefect.flow_run_url`` / ``prefect.root_flow_run_url``, when a Prefect UI is known)."""
    from mlflow import MlflowClient

    client = MlflowClient()
    description = _prefect_links(tags)
    run_tags = {**tags, "kind": "pipeline", **({DESCRIPTION_TAG: description} if description else {})}
    run = client.create_run(experiment_id, run_name=name, tags=run_tags)
    run_id = run.info.run_id
    for key, value in params.items():
        client.log_param(run_id, key, value)
    try:
        yield run_id
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")


def _prefect_links(tags: dict[str, str]) -> str:
    """Markdown links to the Prefect flow runs named in ``tags`` (empty when there is no flow run)."""
    lines = []
    if tags.get("prefect.root_flow_run_url"):
        lines.append(
            f"Prefect flow run: [{tags['prefect.root_flow_run_id']}]({tags['prefect.root_flow_run_url']})"
        )
    if tags.get("prefect.flow_run_id"):
        run = f"`{tags.get('prefect.flow_run_name') or tags['prefect.flow_run_id']}`"
        if tags.get("prefect.flow_run_url"):
            run = f"[{run}]({tags['prefect.flow_run_url']})"
        lines.append(f"Prefect training flow run: {run}")
    return "\n\n".join(lines)


def log_leaderboard(
    parent_run_id: str, board: dict[str, Any], runs: list[dict[str, Any]], promotion: dict[str, Any]
) -> None:
    """The leaderboard on the parent run: ``leaderboard.json`` (with the runs and the champion decisions, each
    with its ``decision`` sentence), per model kind the mean and standard deviation over seeds of every test
    metric (``<kind>.test_<metric>_mean`` / ``_std``), and the leaderboard as the run's description."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    promotion = {
        kind: {"decision": decision_text(registered_name(kind), d), **d} for kind, d in promotion.items()
    }
    log_dict_artifact(
        parent_run_id, {"leaderboard": board, "promotion": promotion, "runs": runs}, "leaderboard.json"
    )
    metrics = []
    now = int(time.time() * 1000)
    for kind, row in board.items():
        for key, summary in row.items():
            for stat in ("mean", "std"):
                if summary[stat] == summary[stat]:  # NaN is not logged
                    name = f"{kind}.test_{mlflow_name(key)}_{stat}"
                    metrics.append(Metric(name, float(summary[stat]), now, 0))
    client = MlflowClient()
    for start in range(0, len(metrics), 1000):  # MLflow's batch limit
        client.log_batch(parent_run_id, metrics=metrics[start : start + 1000])
    links = client.get_run(parent_run_id).data.tags.get(DESCRIPTION_TAG, "")
    ranked = build_leaderboard(board, champions(promotion, registered_name))
    client.set_tag(parent_run_id, DESCRIPTION_TAG, description_markdown(ranked, links))


#: Tables never copied: the schema version (checked instead) and the live server's scheduler state.
_NOT_COPIED = frozenset({"alembic_version", "scheduler_leases", "job_locks"})
#: A target holding rows in any of these is not empty: copy-store refuses to merge into it.
_CONTENT_TABLES = ("runs", "registered_models", "logged_models", "trace_info", "evaluation_datasets")


def copy_store(source_uri: str, target_uri: str, batch: int = 5_000) -> dict[str, int]:
    """Copy a whole MLflow store (e.g. SQLite) into an empty one (e.g. PostgreSQL), table by table.

    MLflow has no command for this (``mlflow migrate-filestore`` reads only file stores), and its client
    cannot keep run ids, timestamps or logged-model ids, which model versions, aliases and artifact paths
    refer to. Both stores share MLflow's schema (the target is created at the installed version's head;
    the source must be at the same revision: ``mlflow db upgrade SOURCE`` first), so every row is copied
    as it is: experiments, runs, params, tags, full metric histories, datasets, logged models, registered
    models, versions, aliases, traces. Artifact locations are copied as written: artifacts stay where
    they are on disk. Identity sequences of the target are moved past the copied ids.

    Returns:
        rows copied per table (tables with rows only).

    Raises:
        RuntimeError: different schema revisions, or a target that already holds runs or models.
    """

    import sqlalchemy as sa
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.model_registry.dbmodels import models as _registry_models  # noqa: F401
    from mlflow.store.tracking.dbmodels import models as _tracking_models  # noqa: F401
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    if source_uri.startswith("sqlite:///") and not Path(source_uri[len("sqlite:///") :]).is_file():
        raise RuntimeError(f"no MLflow store at {source_uri}")
    SqlAlchemyStore(target_uri, (Path.cwd() / "mlruns" / "artifacts").resolve().as_uri())  # schema at head
    src = sa.create_engine(source_uri)
    dst = sa.create_engine(target_uri)
    try:
        revisions = []
        for engine in (src, dst):
            with engine.connect() as conn:
                revisions.append(conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar())
        if revisions[0] != revisions[1]:
            raise RuntimeError(
                f"schema revisions differ: source {revisions[0]}, target {revisions[1]}; "
                f"run `mlflow db upgrade {source_uri}` first"
            )
        present = set(sa.inspect(src).get_table_names()) & set(sa.inspect(dst).get_table_names())
        tables = [t for t in Base.metadata.sorted_tables if t.name in present and t.name not in _NOT_COPIED]
        counts: dict[str, int] = {}
        with src.connect() as read, dst.begin() as write:
            for name in _CONTENT_TABLES:
                if name in present and write.execute(sa.text(f"SELECT COUNT(*) FROM {name}")).scalar():
                    raise RuntimeError(f"the target store already holds {name}; copy into an empty store")
            for table in reversed(tables):  # the new store's default experiment, and anything else seeded
                write.execute(table.delete())
            for table in tables:
                result = read.execute(sa.select(table))
                n = 0
                while rows := result.mappings().fetchmany(batch):
                    write.execute(table.insert(), [dict(r) for r in rows])
                    n += len(rows)
                if n:
                    counts[table.name] = n
            if dst.dialect.name == "postgresql":
                _advance_sequences(write, tables)
        logger.info("copied MLflow store %s -> %s: %s", redact(source_uri), redact(target_uri), counts)
        return counts
    finally:
        src.dispose()
        dst.dispose()


def _advance_sequences(conn: Any, tables: list) -> None:
    """Move each serial/identity sequence past the largest copied id (PostgreSQL)."""
    import sqlalchemy as sa

    for table in tables:
        for column in table.primary_key.columns:
            if not isinstance(column.type, sa.Integer):
                continue
            seq = conn.execute(
                sa.text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": table.name, "c": column.name}
            ).scalar()
            if seq:
                conn.execute(
                    sa.text(
                        f'SELECT setval(:s, COALESCE((SELECT MAX("{column.name}") FROM "{table.name}"), 0) + 1, false)'
                    ),
                    {"s": seq},
                )


# --- one training's run (tasks/train.py) ---------------------------------------------------------------


@contextlib.contextmanager
def training_run(
    experiment_id: str, kind: str, seed: int, tags: dict[str, str], parent_run_id: str | None
) -> Iterator[str]:
    """The run of one training (``kind`` seed ``seed``), a child of ``parent_run_id`` when given: yields its id.

    Runs of the same ``tags`` left RUNNING by a killed attempt are closed first (:func:`close_interrupted_runs`).
    The run ends FINISHED, or FAILED on an exception (which propagates).
    """
    import mlflow

    close_interrupted_runs(experiment_id, tags)
    run_tags = {**tags, **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {})}
    with mlflow.start_run(
        experiment_id=experiment_id, run_name=child_run_name(kind, seed), tags=run_tags
    ) as run:
        yield run.info.run_id


def log_split_inputs(dataset: str, samples: dict[str, tuple[str, str]]) -> None:
    """Dataset lineage of the active run: each split's samples file (``split -> (path, fingerprint)``) as an
    input named ``<dataset>-<split>`` with the fingerprint as digest, in context training/validation/testing."""

    from mlflow.data.dataset_source_registry import get_registered_sources
    from mlflow.data.meta_dataset import MetaDataset

    local = next(s for s in get_registered_sources() if s._get_source_type() == "local")
    contexts = {"train": "training", "val": "validation", "test": "testing"}
    for split, (path, fingerprint) in samples.items():
        source = local(str(Path(path).resolve()))
        meta = MetaDataset(source=source, name=f"{dataset}-{split}", digest=fingerprint[:32])
        log_input(meta, context=contexts.get(split, split))


def log_training(params: dict[str, Any], history: list[dict[str, float]]) -> None:
    """The active run's parameters and its per-epoch metrics (step = epoch, from 1)."""
    import mlflow

    mlflow.log_params(params)
    for step, record in enumerate(history, start=1):
        mlflow.log_metrics({mlflow_name(k): v for k, v in record.items()}, step=step)


def log_run_metrics(metrics: dict[str, float], model_id: str | None = None) -> None:
    """Metrics logged once on the active run (names through :func:`mlflow_name`), linked to the logged
    model ``model_id`` when given."""
    import mlflow

    mlflow.log_metrics({mlflow_name(k): v for k, v in metrics.items()}, model_id=model_id)
