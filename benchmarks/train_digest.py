"""A fingerprint of each training recipe's results: tiny deterministic runs, their weights' digest and history.

    python benchmarks/train_digest.py > benchmarks/results/train-digest-<when>.json

trains tiny models with :func:`nextloc.training.train.fit_model` (one intra-op thread, CPU) on small synthetic
samples (a user cycles through the locations; the same samples on every machine) for a few epochs with each
recipe, and prints JSON: per setup the sha256 of the final weights (state-dict tensors' bytes, keys sorted),
the best epoch, the epoch count and the history, with the kernels they ran on
(:func:`nextloc.training.kernels.kernel_fingerprint`: the CPU, torch's and NumPy's builds and dispatch, the
overrides; the last bits depend on all of it).

A refactoring of the training loop must leave these unchanged; ``tests/nextloc/training/test_kernels.py``
holds them to every recording (this repo's and ``../shared/machines/``'s): bit for bit where the kernels are
the recorded ones, within a tolerance elsewhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LOCATIONS, USERS = 12, 4
# setup -> (model kind, training overrides); "mhsa_drops" runs both learning-rate drops and the early end
SETUPS: dict[str, tuple[str, dict[str, Any]]] = {
    "mhsa": ("mhsa", {"max_epochs": 3, "batch_size": 32}),
    "mhsa_drops": (
        "mhsa",
        {"max_epochs": 10, "patience": 1, "es_delta": 0.2, "lr_drops": 2, "batch_size": 32, "lr": 3e-3},
    ),
    "pointer": ("pointer", {"max_epochs": 3, "min_epochs": 0, "batch_size": 32}),
    "pointer_plus": ("pointer_plus", {"max_epochs": 3, "batch_size": 32}),
    "lstm": ("lstm", {"max_epochs": 3, "batch_size": 32}),
}


def synthetic_samples(n: int, seed: int) -> Any:
    """``n`` samples as a pyarrow table: user ``u`` visits ``(start + k * u) % 10 + 2`` at step ``k``."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    names = ["loc_hist", "user_hist", "weekday_hist", "start_min_hist", "duration_hist", "diff_hist"]
    rows: dict[str, list[list[int]]] = {k: [] for k in names}
    target, user = [], []
    for _ in range(n):
        u = int(rng.integers(1, USERS))
        length = int(rng.integers(3, 9))
        start = int(rng.integers(0, 10))
        rows["loc_hist"].append([(start + k * u) % 10 + 2 for k in range(length)])
        rows["user_hist"].append([u] * length)
        rows["weekday_hist"].append([k % 7 for k in range(length)])
        rows["start_min_hist"].append([(60 * k) % 1440 for k in range(length)])
        rows["duration_hist"].append([30] * length)
        rows["diff_hist"].append(sorted(rng.integers(0, 8, length).tolist(), reverse=True))
        target.append((start + length * u) % 10 + 2)
        user.append(u)
    zeros = pa.array([0] * n, pa.int32())
    return pa.table(
        {
            "staypoint_id": pa.array(np.arange(n), pa.int64()),
            "user_id": pa.array(user, pa.int32()),
            "user": pa.array(user, pa.int32()),
            **{k: pa.array(v, pa.list_(pa.int32())) for k, v in rows.items()},
            "target_loc": pa.array(target, pa.int32()),
            "target_weekday": zeros,
            "target_start_min": zeros,
            "target_day": zeros,
            "hist_len": pa.array([len(x) for x in rows["loc_hist"]], pa.int32()),
        }
    )


def weights_digest(state: dict[str, Any]) -> str:
    """sha256 over the state dict: each key (sorted) and its tensor's raw bytes."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous().reshape(-1)
        digest.update(name.encode() + b"\n")
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def run_setup(name: str) -> dict[str, Any]:
    """Train setup ``name`` from scratch (model seed 0) and describe its result."""
    import torch

    from nextloc.models import build_model
    from nextloc.models.batch import SampleTensors
    from nextloc.models.registry import kind as kind_entry
    from nextloc.models.registry import training_recipe
    from nextloc.training.train import fit_model

    kind, overrides = SETUPS[name]
    torch.set_num_threads(1)
    train = SampleTensors(synthetic_samples(256, 0))
    val = SampleTensors(synthetic_samples(64, 1))
    extra = {"max_seq_len": 16} if kind.startswith("pointer") else {}

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return build_model(kind, LOCATIONS, USERS, **extra)

    config = training_recipe(kind, **overrides)
    result, _ = fit_model(build, train, val, config, log_prob_output=kind_entry(kind).log_prob_output)
    return {
        "weights_sha256": weights_digest(result.model.state_dict()),
        "best_epoch": result.best_epoch,
        "epochs": result.epochs,
        "history": result.history,
    }


def digests(names: list[str] | None = None) -> dict[str, Any]:
    """The JSON document: the kernels and each setup's result."""
    from nextloc.training.kernels import kernel_fingerprint

    return {
        "kernels": kernel_fingerprint(),
        "runs": {name: run_setup(name) for name in names or list(SETUPS)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setups", default=",".join(SETUPS), help="comma-separated setups to run")
    args = parser.parse_args()
    print(json.dumps(digests(args.setups.split(",")), indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
