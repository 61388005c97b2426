"""What ``nextloc evaluate`` and ``nextloc predict`` do with a registered model: its metrics on a split of a
preprocessed dataset, and its answers for a history."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from nextloc.io.visits import parse_time
from nextloc.predict.answer import predict
from nextloc.predict.histories import to_histories
from nextloc.predict.history_reader import read_history
from runtime.catalog import Catalog
from tracking.registered import load_registered, model_uri, registered_scores

logger = logging.getLogger(__name__)


def evaluate_registered(
    kind: str, alias: str, data_dir: Path, split: str, tracking_uri: str | None, experiment: str
) -> dict[str, Any]:
    """Metrics of a registered model on one split of a preprocessed dataset (place metrics first; P(new place)
    from the model's own new-place head, fit on validation when it was trained; with a head, the answer sets'
    coverage and size, :data:`nextloc.evaluation.metrics.SET_KEYS`)."""
    from nextloc.evaluation.evaluate import score_split, without_copies
    from nextloc.models.batch import SampleTensors  # torch: evaluating, not answering
    from nextloc.raw.duplicates import copied_samples

    bundle = load_registered(kind, alias, tracking_uri, experiment)
    data = SampleTensors.from_parquet(Path(data_dir) / "samples" / f"{split}.parquet")
    # log-probabilities: the ranking of the probabilities, and what the new-place features expect (they
    # softmax their input; softmaxing probabilities themselves would flatten them)
    scores, explore, window = registered_scores(bundle, Path(data_dir), split)
    # a routine kind is scored on its one distribution over the places and "a new place", as in training;
    # every kind's answer sets read the distribution `nextloc predict --coverage` answers with
    joint = explore is not None
    scored = score_split(scores, data, explore=explore, head=bundle.head, joint=joint, window=window)
    p_new = bundle.head.predict(scored.features) if bundle.head is not None else None
    metrics = scored.accumulator.compute(p_new)
    if bundle.head is not None:
        metrics.update(scored.answer_sets())
    copied = copied_samples(Catalog(str(data_dir)).staypoints, data.table) if split == "test" else None
    if copied is not None:
        metrics.update(without_copies(scored.accumulator.per_sample(), copied))
    return {"model": model_uri(kind, alias), "split": split, **metrics}


def predict_registered(
    kind: str,
    alias: str,
    history: str,
    k: int,
    tracking_uri: str | None,
    experiment: str,
    at: str | None = None,
    user_id: int | None = None,
    progress: bool = True,
    map_path: Path | None = None,
    coverage: float | None = None,
) -> list[dict[str, Any]]:
    """Answers of a registered model for a history file (visits, positionfixes, samples) or JSON text:
    top-k known places with coordinates and P(new place) (:mod:`nextloc.predict.answer`), with ``coverage``
    the answer set too (:mod:`nextloc.predict.answer_set`; the command line checks it before any work); with
    ``map_path``, the answers drawn on a map there: an ``.html`` web map
    (:func:`nextloc.maps.answers.predictions_page`), else the first ones in a PNG
    (:func:`nextloc.maps.png.draw_predictions`)."""
    bundle = load_registered(kind, alias, tracking_uri, experiment)
    raw = read_history(history, bundle.preprocess, user_id)
    stamp = parse_time(at, "--at", "at") if at else None
    histories = to_histories(raw, bundle, stamp)
    answers = predict(bundle, histories, k, progress=progress, coverage=coverage)
    if map_path is not None and Path(map_path).suffix.lower() in (".html", ".htm"):
        from nextloc.maps.answers import predictions_page  # folium: only with a web map

        page = predictions_page(histories, answers, bundle.locations, Path(map_path))
        logger.info("web map of %d of %d answers: %s", len(page.layers), len(answers), page.path)
    elif map_path is not None:
        from nextloc.maps.png import draw_predictions  # matplotlib: only with a map

        drawn = draw_predictions(histories, answers, bundle.locations, Path(map_path))
        logger.info("map of the first %d of %d answers: %s", len(drawn.panels), len(answers), drawn.path)
    return answers
