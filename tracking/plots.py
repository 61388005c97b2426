"""Charts that people look at in the MLflow UI (matplotlib, headless): a model run's training curves and
per-user accuracy, and the parent run's comparison of the kinds."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from nextloc.storage import write_with

logger = logging.getLogger(__name__)

COMPARISON = "leaderboard_chart"  # the parent run's chart, beside leaderboard.json: .png and .html


def _pyplot():
    """matplotlib's pyplot on the headless backend, imported on first use (~0.35 s; cached runs draw nothing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training_curves(history: list[dict[str, float]], path: Path, title: str) -> Path:
    """Train/val loss and val Acc@1 per epoch."""
    plt = _pyplot()
    frame = pd.DataFrame(history)
    epochs = range(1, len(frame) + 1)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(epochs, frame["train_loss"], label="train")
    ax_loss.plot(epochs, frame["val_loss"], label="validation")
    best = int(frame["val_loss"].idxmin()) + 1
    ax_loss.axvline(best, color="grey", linestyle=":", label=f"best epoch {best}")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy", title="loss")
    ax_loss.legend()
    for key, label in (("val_acc@1", "Acc@1"), ("val_acc@5", "Acc@5"), ("val_mrr", "MRR")):
        if key in frame:
            ax_acc.plot(epochs, frame[key], label=label)
    ax_acc.set(xlabel="epoch", ylabel="%", title="validation")
    ax_acc.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_with(lambda tmp: fig.savefig(tmp, dpi=100, format="png"), path)
    plt.close(fig)
    return path


def plot_per_user(per_user: pd.DataFrame, path: Path, title: str) -> Path:
    """Place Acc@1 per user, sorted, one bar per user."""
    plt = _pyplot()
    frame = per_user.sort_values("place_acc@1", ascending=False)
    fig, ax = plt.subplots(figsize=(max(6, 0.25 * len(frame)), 4))
    ax.bar(range(len(frame)), frame["place_acc@1"], color="tab:blue")
    ax.set_xticks(range(len(frame)), [str(u) for u in frame["user"]], rotation=90, fontsize=7)
    ax.set(xlabel="user", ylabel="place Acc@1 (%)", title=title, ylim=(0, 100))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_with(lambda tmp: fig.savefig(tmp, dpi=100, format="png"), path)
    plt.close(fig)
    return path


def log_comparison(parent_run_id: str, board: dict[str, Any]) -> list[str]:
    """The kinds compared (test place Acc@1 and MRR, mean ± std over seeds:
    :func:`nextloc.evaluation.comparison.draw_comparison`) on a training's parent run, beside its
    ``leaderboard.json``: ``leaderboard_chart.png`` and ``leaderboard_chart.html``. A chart that cannot be
    drawn is a warning, never a failed training.

    Returns:
        the artifact paths logged.
    """
    from nextloc.evaluation.comparison import draw_comparison
    from tracking import mlflow_runs

    title = "test place Acc@1 and place MRR per model kind (mean ± std over seeds)"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            chart = draw_comparison(
                board, Path(tmp) / f"{COMPARISON}.png", Path(tmp) / f"{COMPARISON}.html", title
            )
        except (ValueError, OSError) as err:
            logger.warning(
                "no comparison chart on parent run %s (%s: %s)", parent_run_id, type(err).__name__, err
            )
            return []
        for path in (chart.png, chart.html):
            mlflow_runs.log_file_artifact(parent_run_id, path)
    return [f"{COMPARISON}.png", f"{COMPARISON}.html"]
