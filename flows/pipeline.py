"""The ``preprocess-train`` flow: the whole product in one run, and what its deployment runs.

raw GeoLife .plt -> positionfixes -> staypoints -> locations -> samples -> train (models x seeds) ->
evaluate -> register and promote -> summary. Every task is cached, so a rerun on unchanged input and
config is all cache hits (training included) and a changed model parameter retrains only that model.

``raw_dir`` defaults to $NEXTLOC_GEOLIFE_DIR, ``data/raw/geolife``, a local archive, or the download.
``runner.task_runner="dask"`` fans per-user work out to a new ``LocalCluster`` of ``runner.dask_workers``
processes, or to the cluster at ``runner.dask_address``, and the trainings after it, one task per (kind, seed)
(the process pool's results); ``runner.dbscan_tiles`` > 0 runs the dataset-level DBSCAN by that many spatial
tiles there too (same ids).

Each dataset profile is deployed as ``preprocess-train/<name>`` with the parameters :func:`profile_parameters`
gives it (``flows/deployments.py``); a section passed at run time is laid over the profile's key by key (each key
given replaces the profile's, :func:`runtime.sections.over_deployment`): ``training={"models": ["mhsa"]}``
keeps the profile's model presets, ``preprocess={"locations": {...}}`` the rest of its protocol.

Promotion (the one champion rule, :mod:`tasks.promotion`; the ``promotion`` section): per model kind, the
seed best on ``promote_metric`` (validation) is the challenger version; it takes the ``champion`` alias only
if the kind's seeds beat the current champion on validation ``decision_metric`` (a place metric by default)
by at least ``min_effect`` points with a paired bootstrap p < 0.05, both scored on this run's validation
samples (a champion from earlier data reads them in its own ids, matched within ``match_radius_m``); test is
reported, never read by the decision. The bootstrap, the p-value, per-user-group differences and the
decision go to the MLflow parent run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows.preprocess import preprocess as preprocess_flow
from flows.train import train as train_flow
from nextloc.config import PreprocessConfig
from nextloc.io.inputs import InputFormat
from nextloc.models.registry import neural_kinds
from nextloc.profiles import DatasetProfile
from nextloc.training.overrides import resolve_overrides
from runtime.locking import data_dir_lock
from runtime.runners import Runner
from runtime.sections import moved, sectioned_flow
from tasks.pipeline import publish_summary, resolve_raw_dir
from tasks.promotion import PromotionRule
from tasks.train import TrainRun
from tracking.settings import Tracking

#: The flat parameters of ``preprocess-train`` before its sections, and where each went.
RENAMED = {
    **moved("preprocess", PreprocessConfig.model_fields),
    **moved("training", TrainRun.model_fields),
    **moved("promotion", PromotionRule.model_fields),
    **moved("runner", Runner.model_fields),
    **moved("tracking", Tracking.model_fields),
}


@sectioned_flow(
    RENAMED,
    name="preprocess-train",
    flow_run_name="{input_format} {data_dir}: {training.models} x seeds {training.seeds}",
    validate_parameters=True,
)
def preprocess_train(
    raw_dir: str | None = None,
    data_dir: str = "data/geolife",
    input_format: InputFormat = "geolife",
    columns: dict[str, str] | None = None,
    input_timezone: str = "UTC",
    preprocess: PreprocessConfig = PreprocessConfig(),
    training: TrainRun = TrainRun(),
    promotion: PromotionRule = PromotionRule(),
    runner: Runner = Runner(),
    tracking: Tracking = Tracking(),
) -> dict[str, Any]:
    """Preprocess trajectories (GeoLife by default), train and evaluate every model x seed, register and
    promote, summarise (the module docstring has the details).

    Parameters are typed and validated (by pydantic, through Prefect) before any work starts. The inputs
    are flat; the settings are sections, each a frozen model that takes partial JSON (its other keys keep
    their defaults): ``preprocess`` (:class:`nextloc.config.PreprocessConfig`: ``--param
    preprocess='{"locations": {"epsilon_m": 50}}'``), ``training`` (:class:`tasks.train.TrainRun`: models,
    seeds, per-kind ``model_overrides`` / ``train_overrides`` such as ``{"mhsa": {"max_epochs": 2}}``,
    device, workers), ``promotion`` (:class:`tasks.promotion.PromotionRule`), ``runner``
    (:class:`runtime.runners.Runner`) and ``tracking`` (:class:`tracking.settings.Tracking`). A flat name from
    before the sections is refused naming its section (:mod:`runtime.sections`).
    """
    resolve_overrides(training.model_overrides, training.train_overrides)  # before any work
    with data_dir_lock(data_dir):  # one writer per data directory (re-entrant for the subflows)
        found = _raw_input(input_format, raw_dir)
        preprocessed = preprocess_flow.with_options(task_runner=runner.per_user())(
            raw_dir=found,
            data_dir=data_dir,
            config=preprocess,
            input_format=input_format,
            columns=columns,
            input_timezone=input_timezone,
            dbscan_tiles=runner.dbscan_tiles,
        )
        trained = train_flow.with_options(task_runner=runner.trainings(training.workers))(
            data_dir=preprocessed["data_dir"], training=training, promotion=promotion, tracking=tracking
        )
        summary = publish_summary(
            preprocessed, trained, tracking.tracking_uri, tracking.experiment, tracking.mlflow_ui_url
        )
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
    training: dict[str, Any] | None = None,
    **inputs: Any,
) -> dict[str, Any]:
    """The ``preprocess-train`` parameters of a dataset profile, as plain JSON values.

    The one resolution path from a profile to a run: ``nextloc run --dataset NAME`` calls it with the
    command line's choices, ``flows/deployments.py`` with none for the deployment ``preprocess-train/NAME``.

    Args:
        config: the preprocessing config (default: the profile's own, :meth:`DatasetProfile.config`).
        kinds: the neural model kinds to give overrides (default: those the profile has presets for).
        model_set, train_set: keys set on top of the presets for every kind in ``kinds``.
        training: other keys of the ``training`` section (``models``, ``seeds``, ``device``, ``workers``).
        inputs: ``raw_dir``, ``data_dir``, ``input_format``, ``columns``, ``input_timezone`` over the
            profile's (:meth:`DatasetProfile.inputs`).

    Returns:
        The input parameters, the whole ``preprocess`` section, and the ``training`` section: the profile's
        ``model_overrides`` and ``train_overrides`` (and ``training``'s keys).
    """
    config = config or profile.config()
    if kinds is None:
        kinds = [k for k in neural_kinds() if k in profile.models or k in profile.train]
    model_overrides, train_overrides = profile.presets(kinds, model_set, train_set)
    return {
        **profile.inputs(**inputs),
        "preprocess": config.model_dump(mode="json"),
        "training": {
            **(training or {}),
            "model_overrides": model_overrides,
            "train_overrides": train_overrides,
        },
    }
