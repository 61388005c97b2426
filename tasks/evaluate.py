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
from nextloc.metrics import evaluate_scores
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
    """Metrics of a registered model on one split of a preprocessed dataset."""
    scorer = load_scorer(kind, alias, tracking_uri, experiment)
    data = SampleTensors.from_parquet(Path(data_dir) / "samples" / f"{split}.parquet")
    metrics, _ = evaluate_scores(lambda batch: scorer(pack_batch(batch)), data, batch_size=512)
    return {"model": model_uri(kind, alias), "split": split, **metrics}


def predict_top_k(
    kind: str, alias: str, history: str, k: int, tracking_uri: str | None, experiment: str
) -> list[list[dict[str, float]]]:
    """Top-k next locations with probabilities for histories given as JSON text/file or a samples parquet."""
    packed = _read_histories(history)
    scorer = load_scorer(kind, alias, tracking_uri, experiment)
    with torch.no_grad():
        probs = scorer(torch.from_numpy(packed)).numpy()
    return [[{"location_id": loc, "probability": round(p, 6)} for loc, p in row] for row in top_k(probs, k)]


def leaderboard_from_mlflow(
    tracking_uri: str | None, experiment: str, latest_data_only: bool = True
) -> tuple[dict, str]:
    """Mean +- std over seeds of the best-checkpoint test metrics of every model run in the experiment."""
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
        for key in ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "f1"):
            col = f"metrics.test_{key.replace('@', '_at_')}"
            values = group[col].dropna().to_numpy(float) if col in group else np.array([])
            board[kind][key] = summarise(values)
    return board, note


def summarise(values: Any) -> dict[str, float]:
    """Mean, sample standard deviation (0 for one value) and count of a metric over seeds."""
    values = np.asarray(values, dtype=float)
    return {
        "mean": float(values.mean()) if len(values) else float("nan"),
        "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
        "n": int(len(values)),
    }


def pack_batch(batch) -> torch.Tensor:
    """A ``Batch`` back into the packed (B, T, 6) form the registered scorer takes."""
    user = batch.user[:, None].expand_as(batch.loc)
    return torch.stack(
        [batch.loc, batch.time * 15, batch.weekday, batch.duration * 30, batch.diff, user], dim=-1
    )


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
