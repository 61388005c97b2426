"""A registered model read back from the MLflow registry: its URI, its bundle (read as data, nothing run),
its scores on a split of a dataset, a champion's answers drawn on maps, and the leaderboard of the tracked
runs."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from nextloc.bundle import BUNDLE_FILE, ModelBundle, load_bundle
from nextloc.io.visits import validate_visits
from nextloc.predict.answer import predict
from nextloc.predict.histories import encode_visits, history_visits
from nextloc.routine.data import RoutineData, read_located
from runtime.catalog import Catalog
from tracking import versions
from tracking.settings import REGISTERED_PREFIX, default_tracking_uri

if TYPE_CHECKING:
    from nextloc.evaluation.evaluate import ScoreFn

logger = logging.getLogger(__name__)


def model_uri(kind: str, alias: str) -> str:
    """``models:/nextloc-<kind>@<alias>``, or ``/<version>`` when ``alias`` is a number."""
    name = f"{REGISTERED_PREFIX}{kind}"
    return f"models:/{name}/{alias}" if alias.isdigit() else f"models:/{name}@{alias}"


def load_registered(kind: str, alias: str, tracking_uri: str | None, experiment: str) -> ModelBundle:
    """A registered model as a :class:`~nextloc.bundle.ModelBundle`, read as data: its JSON config,
    safetensors weights and parquet vocabulary (the logged code is not run).

    A SQLite store's version is read in place, its alias resolved in the registry's tables without
    importing MLflow (:func:`tracking.versions.local_bundle`); any other is downloaded through MLflow.

    Raises:
        ModelNotFound: the store, the registered model or its alias is not there
            (:func:`registered_version`), in one line.
        ValueError: the version holds no bundle (a pickled model logged by an early nextloc): reading it
            would run code chosen by whoever logged it, so it is refused, with how to replace it.
    """
    store = tracking_uri or default_tracking_uri()
    in_place = versions.local_bundle(kind, alias, store)
    if in_place is not None:
        return load_bundle(in_place)
    registered_version(kind, alias, store, experiment)
    uri = model_uri(kind, alias)
    with tempfile.TemporaryDirectory() as tmp:
        folder = versions.download_bundle(uri, Path(tmp))
        if (folder / BUNDLE_FILE).is_file():
            return load_bundle(folder)
    raise ValueError(
        f"{uri} holds no model bundle: it is a pickled model from an early nextloc, and loading it would run "
        f"code chosen by whoever logged it, so nextloc does not. Register the kind again from its data "
        f"(`nextloc train --model {kind}`, which registers a bundle and decides the champion) or move the "
        f"alias to a version that has one"
    )


def registered_version(kind: str, alias: str, tracking_uri: str, experiment: str) -> str:
    """Point MLflow at ``tracking_uri`` and return the version of ``nextloc-<kind>`` that ``alias`` names.

    Raises:
        ModelNotFound: a SQLite store that does not exist (not created: MLflow would make an empty one), or
            no such version (:func:`tracking.versions.require_version`), in one line naming what to run.
    """
    from tracking import mlflow_runs

    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        if not db.is_file():
            raise versions.ModelNotFound(
                f"no tracking store at {db}: nothing was trained here yet. Train and register the model "
                f"with `nextloc train --model {kind}` (or `make run`), or name the store with --tracking-uri"
            )
    mlflow_runs.configure(tracking_uri, experiment)
    return versions.require_version(kind, alias, tracking_uri)


def registered_scores(
    bundle: ModelBundle, data_dir: Path, split: str
) -> tuple[ScoreFn, np.ndarray | None, np.ndarray | None]:
    """A registered model's log-probabilities for the samples of one split of a dataset in the model's ids,
    and (routine kinds) their explore features and windows anchored at each question's now. A routine kind
    reads the dataset's staypoints: every question's whole past, each place's centre as of the question's
    now (as in training's evaluation; the bundle's own centres are for answers)."""
    from nextloc.evaluation.evaluate import routine_scores  # torch: evaluating, not answering
    from nextloc.models.batch import SampleTensors
    from nextloc.models.packed import pack_batch

    if bundle.routine is None:
        return lambda batch: bundle.scorer(pack_batch(batch)).clamp(min=1e-30).log(), None, None
    catalog = Catalog(str(data_dir))
    samples = SampleTensors.from_parquet(catalog.samples(split))
    data = RoutineData.build(
        pd.read_parquet(catalog.staypoints),
        pd.read_parquet(catalog.vocabulary("locations")),
        {split: samples},
        bundle.routine.num_places,
        bundle.preprocess.timezone,
        bundle.preprocess.samples.previous_days,
        read_located(catalog.located),
    )
    model = bundle.routine.model
    answers = routine_scores(data, model, split, model.scores(data.candidates[split]))
    # a model registered before the unseen places' tally was kept reads the explore features alone
    explore = (
        data.explore(model, split) if bundle.routine.unseen is not None else data.candidates[split].explore
    )
    return answers, explore, data.windows[split]


MAP_USERS = 3  # test users drawn for each champion


def champion_maps(
    kind: str,
    version: str,
    run_id: str,
    data_dir: Path,
    tracking_uri: str | None,
    experiment: str,
    k: int = 5,
) -> list[str]:
    """Draw a champion's answers for the :data:`MAP_USERS` test users with the most test samples (each asked
    at their last test target, the place they really went drawn as well: :func:`nextloc.maps.png.map_questions`)
    and log them to the run that trained it as ``maps/<user_id>.png`` and as a web map beside it,
    ``maps/<user_id>.html`` (:func:`nextloc.maps.answers.answers_page`; the MLflow UI shows it in place;
    without Leaflet's files, a warning and the PNG alone).

    Logged when the alias moves (:mod:`tasks.promotion`), so every champion has them; a version that never
    became champion is never drawn. A user whose history is empty to the model is skipped.

    Returns:
        the artifact paths logged.
    """
    from nextloc.maps.answers import answers_page  # folium, matplotlib: only drawing
    from nextloc.maps.png import draw_answer, map_questions
    from tracking import mlflow_runs

    bundle = load_registered(kind, version, tracking_uri, experiment)
    catalog = Catalog(str(data_dir))
    questions = map_questions(
        pd.read_parquet(catalog.samples("test"), columns=["user_id", "staypoint_id"]),
        pd.read_parquet(catalog.staypoints),
        pd.read_parquet(catalog.vocabulary("locations")),
        MAP_USERS,
        bundle.preprocess.samples.previous_days,
    )
    logged = []
    tiles = "env"  # after a map that got no basemap (offline: one warning), the others do not ask again
    with tempfile.TemporaryDirectory() as tmp:
        for question in questions:
            try:
                histories = encode_visits(validate_visits(question.visits, "map"), bundle, question.at)
            except ValueError as err:
                logger.info("no map for user %d: %s", question.user_id, err)
                continue
            (answer,) = predict(bundle, histories, k)
            history = history_visits(histories, 0, bundle.locations)
            png, page = Path(tmp) / f"{question.user_id}.png", Path(tmp) / f"{question.user_id}.html"
            if not draw_answer(history, answer, png, question.actual, tiles).panels[0].basemap:
                tiles = None
            drawn = [png]
            try:
                drawn.append(answers_page([(history, answer)], page, [question.actual]).path)
            except FileNotFoundError as err:  # Leaflet's files (Debian's libjs-leaflet): the PNG stays
                logger.warning("no web map for user %d: %s", question.user_id, err)
            for path in drawn:
                mlflow_runs.log_file_artifact(run_id, path, "maps")
                logged.append(f"maps/{path.name}")
    return logged


def leaderboard_from_mlflow(
    tracking_uri: str | None, experiment: str, latest_data_only: bool = True
) -> tuple[dict, str]:
    """Mean +- std over seeds of every test metric (:data:`nextloc.evaluation.metrics.RESULT_KEYS`) of every model run."""
    from nextloc.evaluation.leaderboard import summarise
    from nextloc.evaluation.metrics import RESULT_KEYS
    from tracking import mlflow_runs

    mlflow_runs.configure(tracking_uri, experiment)
    runs = mlflow_runs.search_model_runs(experiment)
    if runs.empty:
        return {}, f"no model runs in experiment {experiment!r}"
    note = f"experiment {experiment!r}, all datasets"
    if latest_data_only and "tags.data_fingerprint" in runs:
        fingerprint = runs["tags.data_fingerprint"].iloc[0]
        runs = runs[runs["tags.data_fingerprint"] == fingerprint]
        note = f"experiment {experiment!r}, dataset {fingerprint[:12]}"
    # one run per (model, seed): the newest
    runs = runs.drop_duplicates(subset=["tags.model", "tags.seed"], keep="first")
    board: dict[str, dict[str, dict[str, float]]] = {}
    for kind, group in runs.groupby("tags.model"):
        board[kind] = {}
        for key in RESULT_KEYS:
            col = f"metrics.test_{mlflow_runs.mlflow_name(key)}"
            values = group[col].dropna().to_numpy(float) if col in group else np.array([])
            board[kind][key] = summarise(values)
    return board, note
