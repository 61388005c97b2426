"""Evaluate, compare and serve registered models (MLflow registry)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pyarrow.parquet as pq
import torch

from nextloc.data import SampleTensors
from nextloc.evaluate import pack_batch, score_split, summarise
from nextloc.metrics import RESULT_KEYS
from nextloc.novelty import NewPlaceHead, novelty_features
from nextloc.sequences import FIRST_PLACE
from nextloc.serving import PACKED_FEATURES, pack_histories, top_k
from tasks import tracking


def model_uri(kind: str, alias: str) -> str:
    """``models:/nextloc-<kind>@<alias>``, or ``/<version>`` when ``alias`` is a number."""
    name = tracking.registered_name(kind)
    return f"models:/{name}/{alias}" if alias.isdigit() else f"models:/{name}@{alias}"


def load_scorer(kind: str, alias: str, tracking_uri: str | None, experiment: str) -> torch.nn.Module:
    """The registered model as a :class:`~nextloc.serving.PackedScorer` (packed histories -> probabilities)."""
    tracking.configure(tracking_uri, experiment)
    return mlflow.pytorch.load_model(model_uri(kind, alias), map_location="cpu").eval()


def evaluate_registered(
    kind: str, alias: str, data_dir: Path, split: str, tracking_uri: str | None, experiment: str
) -> dict[str, Any]:
    """Metrics of a registered model on one split of a preprocessed dataset (place metrics first; P(new place)
    from the model's own new-place head, fit on validation when it was trained)."""
    scorer = load_scorer(kind, alias, tracking_uri, experiment)
    data = SampleTensors.from_parquet(Path(data_dir) / "samples" / f"{split}.parquet")
    scored = score_split(lambda batch: scorer(pack_batch(batch)), data)
    head = load_head(kind, alias, tracking_uri, experiment)
    p_new = head.predict(scored.features) if head is not None else None
    return {"model": model_uri(kind, alias), "split": split, **scored.accumulator.compute(p_new)}


def load_head(kind: str, alias: str, tracking_uri: str | None, experiment: str) -> NewPlaceHead | None:
    """The new-place head logged with a registered model's run (None for runs logged before heads existed)."""
    tracking.configure(tracking_uri, experiment)
    client = tracking.MlflowClient()
    name = tracking.registered_name(kind)
    version = (
        client.get_model_version(name, alias)
        if alias.isdigit()
        else client.get_model_version_by_alias(name, alias)
    )
    try:
        return NewPlaceHead.from_dict(
            mlflow.artifacts.load_dict(f"runs:/{version.run_id}/new_place_head.json")
        )
    except (mlflow.exceptions.MlflowException, OSError, KeyError, ValueError):
        return None


def predict_top_k(
    kind: str, alias: str, history: str, k: int, tracking_uri: str | None, experiment: str
) -> list[list[dict[str, float]]]:
    """Top-k next known places (ids >= 2, probabilities renormalised over places) and P(new place), for
    histories given as JSON text/file or a samples parquet."""
    packed = _read_histories(history)
    scorer = load_scorer(kind, alias, tracking_uri, experiment)
    head = load_head(kind, alias, tracking_uri, experiment)
    with torch.no_grad():
        packed_t = torch.from_numpy(packed)
        probs = scorer(packed_t)
        p_new = head.predict(novelty_features(probs.log(), _batch_of(packed_t))) if head is not None else None
    places = probs[:, FIRST_PLACE:].numpy()
    places = places / np.clip(places.sum(axis=1, keepdims=True), 1e-12, None)
    answers = []
    for i, row in enumerate(top_k(places, k)):
        answer: dict[str, Any] = {
            "places": [{"location_id": loc + FIRST_PLACE, "probability": round(p, 6)} for loc, p in row]
        }
        if p_new is not None:
            answer["p_new_place"] = round(float(p_new[i]), 6)
        answers.append(answer)
    return answers


def _batch_of(packed: torch.Tensor):
    """The :class:`~nextloc.data.Batch` view of packed histories (what the new-place features read)."""
    from nextloc.data import Batch

    loc = packed[..., 0]
    lengths = (loc != 0).sum(dim=1).clamp(min=1)
    zeros = torch.zeros_like(lengths)
    return Batch(loc, loc * 0, loc * 0, loc * 0, loc * 0, packed[:, 0, 5], lengths, zeros, zeros)


def leaderboard_from_mlflow(
    tracking_uri: str | None, experiment: str, latest_data_only: bool = True
) -> tuple[dict, str]:
    """Mean +- std over seeds of every test metric (:data:`nextloc.metrics.RESULT_KEYS`) of every model run."""
    tracking.configure(tracking_uri, experiment)
    runs = mlflow.search_runs(
        experiment_names=[experiment], filter_string="tags.model != ''", order_by=["start_time DESC"]
    )
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
            col = f"metrics.test_{key.replace('@', '_at_')}"
            values = group[col].dropna().to_numpy(float) if col in group else np.array([])
            board[kind][key] = summarise(values)
    return board, note


def _read_histories(source: str) -> np.ndarray:
    path = Path(source)
    if path.suffix == ".parquet" and path.is_file():
        table = pq.read_table(path)
        rows = table.to_pylist()
        histories = [
            {
                "location": r["loc_hist"],
                "start_min": r["start_min_hist"],
                "weekday": r["weekday_hist"],
                "duration_min": r["duration_hist"],
                "diff_days": r["diff_hist"],
                "user": r["user"],
            }
            for r in rows
        ]
        return pack_histories(histories)
    text = path.read_text() if path.suffix == ".json" and path.is_file() else source
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--history is neither a .json/.parquet file nor JSON text: {err}") from err
    histories = data if isinstance(data, list) else [data]
    for i, hist in enumerate(histories):
        if not isinstance(hist, dict):
            raise ValueError(f"history {i} must be an object with fields {list(PACKED_FEATURES)}")
    return pack_histories(histories)
