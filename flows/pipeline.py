"""The ``preprocess-train`` flow: the whole product in one run, and what its deployment runs.

raw GeoLife .plt -> positionfixes -> staypoints -> locations -> samples -> train (models x seeds) ->
evaluate -> register and promote -> summary. Every task is cached, so a rerun on unchanged input and
config is all cache hits (training included) and a changed model parameter retrains only that model.

``raw_dir`` defaults to $NEXTLOC_GEOLIFE_DIR, ``data/raw/geolife``, a local archive, or the download.
``task_runner="dask"`` fans per-user work out to a new ``LocalCluster`` of ``dask_workers`` processes, or to
the cluster at ``dask_address``, and the trainings after it, one task per (kind, seed) (the process pool's
results); ``dbscan_tiles`` > 0 runs the dataset-level DBSCAN by that many spatial tiles there too (same ids).

Each dataset profile is deployed as ``preprocess-train/<name>`` with the parameters :func:`profile_parameters`
gives it (``flows/serve.py``); a section passed at run time replaces the profile's section.

Promotion (the one champion rule, :mod:`tasks.promotion`): per model kind, the seed best on ``promote_metric``
(validation) is the challenger version; it takes the ``champion`` alias only if the kind's seeds beat the
current champion on test ``decision_metric`` (a place metric by default) by at least ``min_effect`` points
with a paired bootstrap p < 0.05, both scored on this run's test samples (a champion from earlier data reads
them in its own ids, matched within ``match_radius_m``). The test, the p-value, per-user-group differences
and the decision go to the MLflow parent run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from prefect import flow
from pydantic import Field

from flows.preprocess import preprocess
from flows.train import DEFAULT_MODELS, train
from nextloc.config import (
    DuplicateConfig,
    LocationConfig,
    PreprocessConfig,
    QualityConfig,
    SampleConfig,
    SplitConfig,
    StaypointConfig,
)
from nextloc.io.inputs import InputFormat
from nextloc.models.registry import neural_kinds
from nextloc.profiles import DatasetProfile
from nextloc.training.overrides import ModelOverrides, TrainOverrides, resolve_overrides
from runtime.locking import data_dir_lock
from runtime.runners import make_task_runner, make_training_runner
from tasks.pipeline import publish_summary, resolve_raw_dir
from tasks.promotion import (
    DEFAULT_DECISION_METRIC,
    DEFAULT_MIN_EFFECT,
    DEFAULT_PROMOTE_METRIC,
    DecisionMetric,
    PromoteMetric,
)
from tasks.train import ModelKind
from tracking import mlflow_runs

Seed = Annotated[int, Field(ge=0)]


@flow(
    name="preprocess-train",
    flow_run_name="{input_format} {data_dir}: {models} x seeds {seeds}",
    validate_parameters=True,
)
def preprocess_train(
    raw_dir: str | None = None,
    data_dir: str = "data/geolife",
    input_format: InputFormat = "geolife",
    columns: dict[str, str] | None = None,
    input_timezone: str = "UTC",
    timezone: str = "UTC",
    staypoints: StaypointConfig = StaypointConfig(),
    quality: QualityConfig = QualityConfig(),
    locations: LocationConfig = LocationConfig(),
    split: SplitConfig = SplitConfig(),
    samples: SampleConfig = SampleConfig(),
    duplicates: DuplicateConfig = DuplicateConfig(),
    models: list[ModelKind] = DEFAULT_MODELS,
    seeds: Annotated[list[Seed], Field(min_length=1)] = [0],  # noqa: B006 (a JSON default for the UI)
    model_overrides: ModelOverrides | None = None,
    train_overrides: TrainOverrides | None = None,
    device: Literal["auto", "cpu", "cuda"] = "auto",
    workers: Annotated[int, Field(ge=1)] = 2,
    promote_metric: PromoteMetric = DEFAULT_PROMOTE_METRIC,
    decision_metric: DecisionMetric = DEFAULT_DECISION_METRIC,
    min_effect: Annotated[float, Field(ge=0)] = DEFAULT_MIN_EFFECT,
    match_radius_m: Annotated[float, Field(gt=0)] = 50.0,
    task_runner: Literal["local", "dask"] = "local",
    dask_address: str | None = None,
    dask_workers: Annotated[int, Field(ge=1)] | None = None,
    dbscan_tiles: Annotated[int, Field(ge=0)] = 0,
    tracking_uri: str | None = None,
    experiment: str = mlflow_runs.DEFAULT_EXPERIMENT,
    mlflow_ui_url: str | None = None,
) -> dict[str, Any]:
    """Preprocess trajectories (GeoLife by default), train and evaluate every model x seed, register and
    promote, summarise (the module docstring has the details).

    Parameters are typed and validated (by pydantic, through Prefect) before any work starts. The config
    sections (``staypoints``, ``locations``, ...) take partial JSON: ``--param locations='{"epsilon_m": 50}'``
    sets one key and keeps the other defaults; ``model_overrides`` / ``train_overrides`` set keys of a neural
    kind's model config and training recipe (``{"mhsa": {"max_epochs": 2}}``, :mod:`nextloc.training.overrides`).
    """
    per_kind_model, per_kind_train = resolve_overrides(model_overrides, train_overrides)  # before any work
    sections = {"staypoints": staypoints, "quality": quality, "locations": locations, "split": split}
    config = PreprocessConfig(timezone=timezone, samples=samples, duplicates=duplicates, **sections)
    with data_dir_lock(data_dir):  # one writer per data directory (re-entrant for the subflows)
        found = _raw_input(input_format, raw_dir)
        runner = make_task_runner(task_runner, dask_workers, dask_address)
        preprocessed = preprocess.with_options(task_runner=runner)(
            raw_dir=found,
            data_dir=data_dir,
            config=config,
            input_format=input_format,
            columns=columns,
            input_timezone=input_timezone,
            dbscan_tiles=dbscan_tiles,
        )
        trainings = make_training_runner(
            task_runner, dask_workers if task_runner == "dask" else workers, dask_address
        )
        trained = train.with_options(task_runner=trainings)(
            data_dir=preprocessed["data_dir"],
            models=list(models),
            seeds=list(seeds),
            model_overrides=per_kind_model,
            train_overrides=per_kind_train,
            tracking_uri=tracking_uri,
            experiment=experiment,
            device=device,
            promote_metric=promote_metric,
            decision_metric=decision_metric,
            min_effect=min_effect,
            match_radius_m=match_radius_m,
        )
        summary = publish_summary(preprocessed, trained, tracking_uri, experiment, mlflow_ui_url)
        return {
            **{key: preprocessed[key] for key in ("data_dir", "stats", "ingest", "users_run")},
            "preprocess_flow_run_id": preprocessed["flow_run_id"],
            **trained,
            "summary": summary,
        }


def _raw_input(input_format: str, raw_dir: str | None) -> str:
    """Where the raw input is: GeoLife's is found (:func:`tasks.pipeline.resolve_raw_dir`), another format's
    must exist.

    Raises:
        FileNotFoundError: naming the missing path.
    """
    if input_format == "geolife":
        return resolve_raw_dir(raw_dir)
    if raw_dir and Path(raw_dir).exists():
        return raw_dir
    raise FileNotFoundError(f"raw_dir {raw_dir!r} does not exist ({input_format} input)")


def profile_parameters(
    profile: DatasetProfile,
    config: PreprocessConfig | None = None,
    kinds: list[str] | None = None,
    model_set: dict[str, Any] | None = None,
    train_set: dict[str, Any] | None = None,
    **inputs: Any,
) -> dict[str, Any]:
    """The ``preprocess-train`` parameters of a dataset profile, as plain JSON values.

    The one resolution path from a profile to a run: ``nextloc run --dataset NAME`` calls it with the
    command line's choices, ``flows/serve.py`` with none for the deployment ``preprocess-train/NAME``.

    Args:
        config: the preprocessing config (default: the profile's own, :meth:`DatasetProfile.config`).
        kinds: the neural model kinds to give overrides (default: those the profile has presets for).
        model_set, train_set: keys set on top of the presets for every kind in ``kinds``.
        inputs: ``raw_dir``, ``data_dir``, ``input_format``, ``columns``, ``input_timezone`` over the
            profile's (:meth:`DatasetProfile.inputs`).

    Returns:
        The input parameters, one per config section (``timezone``, ``staypoints``, ...: the whole section),
        ``model_overrides`` and ``train_overrides``.
    """
    config = config or profile.config()
    if kinds is None:
        kinds = [k for k in neural_kinds() if k in profile.models or k in profile.train]
    model_overrides, train_overrides = profile.presets(kinds, model_set, train_set)
    sections = config.model_dump(mode="json")
    return {
        **profile.inputs(**inputs),
        **{section: sections[section] for section in PreprocessConfig.model_fields},
        "model_overrides": model_overrides,
        "train_overrides": train_overrides,
    }
