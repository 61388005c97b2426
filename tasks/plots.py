"""PNG charts that people look at in the MLflow UI (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from nextloc.storage import write_with


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
