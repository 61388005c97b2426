"""The training loop on tiny synthetic samples (CPU, seconds)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from nextloc.data import SampleTensors
from nextloc.models import OUTPUT_IS_LOG_PROB, build_model
from nextloc.train import TrainConfig, _pointer_lr, fit, predict_scores

V, U = 12, 4


def _samples(n: int, seed: int) -> pa.Table:
    """Users cycle deterministically through locations: the next location is (last + user) mod 10 + 2."""
    rng = np.random.default_rng(seed)
    rows = {
        k: []
        for k in ["loc_hist", "user_hist", "weekday_hist", "start_min_hist", "duration_hist", "diff_hist"]
    }
    target, user = [], []
    for _ in range(n):
        u = int(rng.integers(1, U))
        length = int(rng.integers(3, 9))
        start = int(rng.integers(0, 10))
        locs = [(start + k * u) % 10 + 2 for k in range(length)]
        rows["loc_hist"].append(locs)
        rows["user_hist"].append([u] * length)
        rows["weekday_hist"].append([k % 7 for k in range(length)])
        rows["start_min_hist"].append([(60 * k) % 1440 for k in range(length)])
        rows["duration_hist"].append([30] * length)
        rows["diff_hist"].append(sorted(rng.integers(0, 8, length).tolist(), reverse=True))
        target.append((start + length * u) % 10 + 2)
        user.append(u)
    lists = {k: pa.array(v, pa.list_(pa.int32())) for k, v in rows.items()}
    return pa.table(
        {
            "staypoint_id": pa.array(np.arange(n), pa.int64()),
            "user_id": pa.array(user, pa.int32()),
            "user": pa.array(user, pa.int32()),
            **lists,
            "target_loc": pa.array(target, pa.int32()),
            "target_weekday": pa.array([0] * n, pa.int32()),
            "target_start_min": pa.array([0] * n, pa.int32()),
            "target_day": pa.array([0] * n, pa.int32()),
            "hist_len": pa.array([len(x) for x in rows["loc_hist"]], pa.int32()),
        }
    )


@pytest.fixture(scope="module")
def data():
    return SampleTensors(_samples(256, 0)), SampleTensors(_samples(64, 1))


@pytest.mark.parametrize("kind", ["mhsa", "pointer", "lstm"])
def test_loss_falls_and_best_weights_are_loaded(kind, data):
    """A few epochs on a learnable toy task: the loss falls and the returned model is the best epoch's."""
    train, val = data
    torch.set_num_threads(1)
    extra = {"max_seq_len": 16} if kind == "pointer" else {}
    model = build_model(kind, V, U, **extra)
    config = TrainConfig.for_recipe(kind, max_epochs=6, min_epochs=0, batch_size=16, seed=0, lr=3e-3)
    result = fit(model, train, val, config, log_prob_output=OUTPUT_IS_LOG_PROB[kind])
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < losses[0]
    assert result.best_val_loss == min(h["val_loss"] for h in result.history[: result.best_epoch])
    again = predict_scores(result.model, val).compute()
    assert again["acc@1"] == pytest.approx(result.history[result.best_epoch - 1]["val_acc@1"], abs=1e-6)


def test_training_is_deterministic(data):
    """Same seed, same data: the same losses, epoch for epoch."""
    train, val = data
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        model = build_model("pointer", V, U, max_seq_len=16)
        config = TrainConfig.for_recipe("pointer", max_epochs=2, min_epochs=0, batch_size=32, seed=3)
        runs.append([h["train_loss"] for h in fit(model, train, val, config, log_prob_output=True).history])
    assert runs[0] == runs[1]


def test_pointer_schedule_matches_reference():
    """5 warmup epochs reaching the base rate, then cosine towards 1e-6 over 45 epochs."""
    cfg = TrainConfig.for_recipe("pointer")
    assert [round(_pointer_lr(e, cfg), 8) for e in range(5)] == [
        round(6.5e-4 * (e + 1) / 5, 8) for e in range(5)
    ]
    assert _pointer_lr(5, cfg) == pytest.approx(6.5e-4)
    assert _pointer_lr(50, cfg) == pytest.approx(1e-6)


def test_unknown_training_option_is_rejected():
    with pytest.raises(ValueError, match="nope"):
        TrainConfig.for_recipe("mhsa", nope=1)
    with pytest.raises(ValueError, match="recipe"):
        TrainConfig.for_recipe("transformer")


def test_bucketed_batches_cover_every_sample_once(data):
    train, _ = data
    gen = torch.Generator().manual_seed(0)
    seen = torch.cat([b.index for b in train.batches(16, shuffle=True, generator=gen, bucket=True)])
    assert sorted(seen.tolist()) == list(range(len(train)))
