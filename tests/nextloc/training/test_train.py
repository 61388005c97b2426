"""The training loop on tiny synthetic samples (CPU, seconds)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import nextloc.training.train as train_module
from nextloc.evaluation.evaluate import model_scores, score_split
from nextloc.models import build_model
from nextloc.models.batch import SampleTensors, by_length
from nextloc.models.dropout import PCG64Dropout
from nextloc.models.registry import kind as kind_entry
from nextloc.models.registry import training_recipe
from nextloc.training.optim import pointer_lr
from nextloc.training.train import (
    REFIT_CHECKPOINT,
    SELECTION_CHECKPOINT,
    FitResult,
    check_kind_overrides,
    fit,
    fit_model,
    fit_seed_ensemble,
    seed_everything,
)

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
    config = training_recipe(kind, max_epochs=6, min_epochs=0, batch_size=16, seed=0, lr=3e-3)
    result = fit(model, train, val, config, log_prob_output=kind_entry(kind).log_prob_output)
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < losses[0]
    assert result.best_val_loss == min(h["val_loss"] for h in result.history[: result.best_epoch])
    again = score_split(model_scores(result.model), val).accumulator.compute()
    assert again["acc@1"] == pytest.approx(result.history[result.best_epoch - 1]["val_acc@1"], abs=1e-6)


def test_training_is_deterministic(data):
    """Same seed, same data: the same losses, epoch for epoch."""
    train, val = data
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        model = build_model("pointer", V, U, max_seq_len=16)
        config = training_recipe("pointer", max_epochs=2, min_epochs=0, batch_size=32, seed=3)
        runs.append([h["train_loss"] for h in fit(model, train, val, config, log_prob_output=True).history])
    assert runs[0] == runs[1]


def test_pointer_schedule_matches_reference():
    """5 warmup epochs reaching the base rate, then cosine towards 1e-6 over 45 epochs."""
    cfg = training_recipe("pointer")
    assert [round(pointer_lr(e, cfg), 8) for e in range(5)] == [
        round(6.5e-4 * (e + 1) / 5, 8) for e in range(5)
    ]
    assert pointer_lr(5, cfg) == pytest.approx(6.5e-4)
    assert pointer_lr(50, cfg) == pytest.approx(1e-6)


@pytest.mark.parametrize(
    ("kind", "pool"), [("mhsa", 8), ("mhsa_diagonal", 8), ("pointer", 4), ("pointer_plus", 50)]
)
def test_batches_come_from_length_sorted_pools_and_the_reference_batches_are_one_override_away(kind, pool):
    """The recipes draw their batches from pools sorted by length (sizes chosen on validation, see
    nextloc.training.train); ``bucket=False`` gives the reference's plain shuffled batches, the rest unchanged."""
    ours = training_recipe(kind)
    assert (ours.bucket, ours.bucket_pool) == (True, pool)
    assert training_recipe(kind, bucket=False) == ours.model_copy(update={"bucket": False})


def test_a_pool_smaller_than_a_batch_is_rejected_with_the_recipe():
    with pytest.raises(ValueError, match="bucket_pool must be >= 1 batch, got 0"):
        training_recipe("mhsa", bucket_pool=0)


def test_the_lstm_keeps_the_reference_plain_batches():
    """No pool size kept the LSTM's validation means (nextloc.training.train): it trains on plain shuffled batches."""
    assert training_recipe("lstm").bucket is False
    mhsa = training_recipe("mhsa")
    lstm = training_recipe("lstm", dropout_rng="torch")
    assert lstm.model_copy(update={"bucket": mhsa.bucket, "bucket_pool": mhsa.bucket_pool}) == mhsa


def test_unknown_training_option_is_rejected():
    with pytest.raises(ValueError, match="nope"):
        training_recipe("mhsa", nope=1)
    with pytest.raises(ValueError, match="recipe"):
        training_recipe("transformer")


def test_bucketed_batches_cover_every_sample_once(data):
    train, _ = data
    gen = torch.Generator().manual_seed(0)
    seen = torch.cat([b.index for b in train.batches(16, shuffle=True, generator=gen, bucket=True)])
    assert sorted(seen.tolist()) == list(range(len(train)))


@pytest.mark.parametrize("pool", [1, 2, 4, 50])
def test_each_bucket_pool_is_a_slice_of_the_shuffled_order(data, pool):
    """A pool of ``pool`` batches holds the next ``pool * batch`` shuffled samples, sorted by length."""
    train, _ = data
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(3)).tolist()
    batches = list(
        train.batches(
            16, shuffle=True, generator=torch.Generator().manual_seed(3), bucket=True, bucket_pool=pool
        )
    )
    assert sorted(torch.cat([b.index for b in batches]).tolist()) == list(range(len(train)))
    pools = [set(order[start : start + 16 * pool]) for start in range(0, len(train), 16 * pool)]
    by_pool: dict[int, list[list[int]]] = {}
    for batch in batches:
        rows = set(batch.index.tolist())
        owners = [i for i, members in enumerate(pools) if rows <= members]
        assert len(owners) == 1, "a batch mixes samples of two pools"
        by_pool.setdefault(owners[0], []).append(batch.lengths.tolist())
    assert sorted(by_pool) == list(range(len(pools)))
    for cut in by_pool.values():
        # the pool sorted by length, then cut: each batch is sorted and ends where the next one starts
        cut.sort(key=lambda lengths: (lengths[0], lengths[-1]))
        flat = [length for lengths in cut for length in lengths]
        assert flat == sorted(flat)


def test_smaller_bucket_pools_pad_more_and_a_pool_must_hold_a_batch(data):
    train, _ = data

    def padded(**kw):
        gen = torch.Generator().manual_seed(0)
        return sum(b.loc.numel() for b in train.batches(16, shuffle=True, generator=gen, **kw))

    plain, pool4, pool50 = padded(), padded(bucket=True, bucket_pool=4), padded(bucket=True, bucket_pool=50)
    assert pool50 <= pool4 < plain
    with pytest.raises(ValueError, match="bucket_pool"):
        next(train.batches(16, shuffle=True, bucket=True, bucket_pool=0))


def test_scoring_by_length_gives_each_sample_its_row_in_the_batch_order(data):
    """Pieces are length-sorted and trimmed; the rows come back where the batch had them."""
    _, val = data
    batch = next(val.batches(64))
    calls = []

    def per_sample(b):  # depends on each sample's own tokens only: exact whatever the padding
        calls.append((b.loc.shape[1], b.lengths.clone()))
        return torch.stack([b.index.float(), (b.loc * (b.loc > 0)).sum(1).float(), b.lengths.float()], 1)

    rows = by_length(per_sample, batch, piece=8)
    widths = [width for width, _ in calls]
    assert len(widths) == 8
    assert sorted(widths) == widths
    assert widths[0] < widths[-1] == batch.loc.shape[1]
    for width, lengths in calls:  # each piece: sorted lengths, trimmed to the longest
        assert torch.equal(lengths, lengths.sort().values)
        assert width == lengths.max()
    assert torch.equal(rows, per_sample(batch))
    assert torch.equal(by_length(per_sample, batch, piece=64), per_sample(batch))  # one piece: the batch


@pytest.mark.parametrize("kind", ["mhsa", "pointer", "lstm"])
def test_models_score_a_sample_alike_whatever_the_padding(kind, data):
    """Scoring in length-sorted pieces (the default on a CPU) gives each model's rows to within rounding:
    validation, test metrics and the early stop read the same scores."""
    _, val = data
    torch.manual_seed(0)
    model = build_model(kind, V, U, **({"max_seq_len": 16} if kind == "pointer" else {})).eval()
    with torch.no_grad():
        whole = torch.cat([model(b) for b in val.batches(32)])
        pieces = torch.cat([by_length(model, b, piece=8) for b in val.batches(32)])
        default = torch.cat([by_length(model, b) for b in val.batches(32)])
    torch.testing.assert_close(pieces, whole, rtol=1e-5, atol=1e-5)
    assert torch.equal(default, whole)  # 32 samples: under the CPU piece of 64, scored whole


# --- resuming after a crash -------------------------------------------------------------------------

# mhsa on the toy task with a tight early stop: the scheduler runs until epoch 4, the first early stop
# (best-reload, lr x 0.1) fires at epoch 4, the second at 5, the third ends training at epoch 6 of 10.
MHSA_DROPS = {"max_epochs": 10, "patience": 1, "es_delta": 0.2, "lr_drops": 2, "batch_size": 32, "lr": 3e-3}
RESUME_CASES = {
    # the reference's plain shuffled batches and F.dropout's draws
    "mhsa": ("mhsa", {**MHSA_DROPS, "bucket": False, "dropout_rng": "torch"}),
    # the recipe's pools of 8, with PCG64 masks
    "mhsa_pooled": ("mhsa", {"max_epochs": 3, "batch_size": 16, "lr": 3e-3, "dropout_rng": "pcg64"}),
    "pointer": (
        "pointer",
        {"max_epochs": 4, "min_epochs": 0, "batch_size": 32, "bucket": False, "dropout_rng": "torch"},
    ),
    "pointer_bucket": ("pointer", {"max_epochs": 4, "min_epochs": 0, "batch_size": 32, "bucket": True}),
    "lstm": ("lstm", {"max_epochs": 3, "batch_size": 32, "lr": 3e-3}),
}


class Crash(Exception):
    """Stands in for a SIGKILL: raised from the per-epoch callback."""


def _crash_at(epoch: int, seen: list[int] | None = None):
    """A ``log_metrics`` callback that records the epochs it sees and raises at ``epoch``."""

    def log_metrics(metrics: dict[str, float], step: int) -> None:
        if seen is not None:
            seen.append(step)
        if step == epoch:
            raise Crash(f"killed after epoch {step}")

    return log_metrics


def _build(kind: str, seed: int = 0, **overrides):
    """A freshly initialised model, the same for the same arguments (as ``tasks.train`` builds them)."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    extra = {"max_seq_len": 16} if kind.startswith("pointer") else {}
    return build_model(kind, V, U, **{**extra, **overrides})


def _run(case: str, data, resume_path: Path | None = None, log_metrics=None, **changes) -> FitResult:
    kind, overrides = RESUME_CASES[case]
    model_overrides = changes.pop("model", {})
    train, val = changes.pop("samples", data)
    config = training_recipe(kind, **{**overrides, **changes})
    return fit(
        _build(kind, **model_overrides),
        train,
        val,
        config,
        log_prob_output=kind_entry(kind).log_prob_output,
        log_metrics=log_metrics,
        resume_path=resume_path,
    )


_REFERENCE: dict[str, FitResult] = {}


def _reference(case: str, data) -> FitResult:
    """The uninterrupted run of a case (no resume file), computed once per module."""
    if case not in _REFERENCE:
        _REFERENCE[case] = _run(case, data)
    return _REFERENCE[case]


def _assert_identical(got: FitResult, want: FitResult) -> None:
    """Bit-identical weights, the same history (exact floats), the same best epoch and epoch count."""
    got_state, want_state = got.model.state_dict(), want.model.state_dict()
    assert list(got_state) == list(want_state)
    for name, tensor in want_state.items():
        assert torch.equal(got_state[name], tensor), name
    assert got.history == want.history
    assert got.best_epoch == want.best_epoch
    assert got.best_val_loss == want.best_val_loss
    assert got.epochs == want.epochs


def _written_by_crash(case: str, data, path: Path, epoch: int = 2) -> None:
    with pytest.raises(Crash):
        _run(case, data, path, _crash_at(epoch))
    assert path.exists()


def test_mhsa_case_exercises_the_early_stops(data):
    """The mhsa resume case covers the scheduler, both lr drops and the early end of training."""
    ref = _reference("mhsa", data)
    lrs = [h["lr"] for h in ref.history]
    assert ref.epochs == 6 < MHSA_DROPS["max_epochs"]
    assert lrs[4] == pytest.approx(lrs[3] * 0.1)  # first drop after epoch 4, schedule frozen since
    assert lrs[5] == pytest.approx(lrs[3] * 0.01)
    assert lrs[0] < lrs[1]  # warmup: the scheduler was stepping before the drops


@pytest.mark.parametrize(
    ("case", "crash_epoch"),
    [
        ("mhsa", 2),  # scheduler still active
        ("mhsa", 4),  # the epoch of the first early stop
        ("mhsa", 5),  # between the drops
        ("mhsa", 6),  # the epoch that ended training: the resumed call trains nothing
        ("mhsa_pooled", 2),
        ("pointer", 2),
        ("pointer_bucket", 3),
        ("lstm", 1),
    ],
)
def test_resume_after_crash_is_identical(case, crash_epoch, data, tmp_path):
    """Killed after epoch k, rerun with a fresh model: the same weights, history and best epoch."""
    want = _reference(case, data)
    path = tmp_path / "resume.pt"
    seen: list[int] = []
    with pytest.raises(Crash):
        _run(case, data, path, _crash_at(crash_epoch, seen))
    assert seen == list(range(1, crash_epoch + 1))

    seen.clear()
    got = _run(case, data, path, _crash_at(-1, seen))
    _assert_identical(got, want)
    assert got.resumed_from_epoch == crash_epoch
    assert seen == list(range(crash_epoch + 1, want.epochs + 1))  # restored epochs are not reported again
    assert not list(tmp_path.glob("*.tmp"))


def test_resuming_a_finished_run_trains_nothing(data, tmp_path):
    """The resume file of a completed run is kept; calling again returns the same result at once."""
    want = _reference("mhsa", data)
    path = tmp_path / "resume.pt"
    first = _run("mhsa", data, path)
    _assert_identical(first, want)
    seen: list[int] = []
    again = _run("mhsa", data, path, _crash_at(-1, seen))
    _assert_identical(again, want)
    assert again.resumed_from_epoch == want.epochs
    assert seen == []


def test_fit_model_resumes_a_crash_inside_the_refit(data, tmp_path, monkeypatch):
    """A refit on train + val (the library's fit_model; no kind of the pipeline refits): selection finished,
    refit killed after its first epoch; the rerun matches both."""
    train, val = data
    config = training_recipe(
        "pointer_plus", max_epochs=4, batch_size=32, monitor="val_mrr", refit_on_train_val=True
    )

    def build():
        return _build("pointer_plus")

    want_selection, want_refit = fit_model(build, train, val, config, log_prob_output=True)
    assert want_refit is not None
    assert want_refit.epochs >= 2, "the refit must run past the crash epoch for this test to mean anything"

    real_fit = train_module.fit

    def crashing_refit(*args, **kwargs):
        if kwargs.get("resume_path") is not None and kwargs["resume_path"].name == REFIT_CHECKPOINT:
            kwargs["log_metrics"] = _crash_at(1)
        return real_fit(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(train_module, "fit", crashing_refit)
        with pytest.raises(Crash):
            fit_model(build, train, val, config, log_prob_output=True, checkpoint_dir=tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {SELECTION_CHECKPOINT, REFIT_CHECKPOINT}

    selection, refit = fit_model(build, train, val, config, log_prob_output=True, checkpoint_dir=tmp_path)
    assert refit is not None
    _assert_identical(selection, want_selection)
    _assert_identical(refit, want_refit)
    assert selection.resumed_from_epoch == want_selection.epochs
    assert refit.resumed_from_epoch == 1


@pytest.mark.parametrize(
    "change",
    [
        {"lr": 2e-3},  # training config
        {"seed": 1},  # training seed (batch order, dropout)
        {"model": {"dropout": 0.2}},  # same shapes, different model config
        {"model": {"d_model": 16}},  # different architecture
        {"model": {"seed": 1}},  # same architecture, different initial weights
        {"samples": "other"},  # different training samples
    ],
    ids=["train-config", "seed", "model-config", "architecture", "init", "data"],
)
def test_resume_file_of_another_run_is_ignored(change, data, tmp_path, caplog):
    """A resume file written for another config/model/data is ignored with a warning: a fresh start."""
    path = tmp_path / "resume.pt"
    _written_by_crash("mhsa", data, path)
    if change.get("samples") == "other":
        change = {"samples": (SampleTensors(_samples(256, 7)), data[1])}
    want = _run("mhsa", data, **change)
    with caplog.at_level(logging.WARNING, logger="nextloc"):
        got = _run("mhsa", data, path, **change)
    assert got.resumed_from_epoch == 0
    assert "another training config" in caplog.text
    _assert_identical(got, want)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "not-a-resume-file", "bad-content"])
def test_unusable_resume_file_is_ignored(damage, data, tmp_path, caplog):
    """A truncated, corrupt or foreign file does not crash training: a warning, then a fresh start."""
    path = tmp_path / "resume.pt"
    _written_by_crash("mhsa", data, path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00not a checkpoint" * 100)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "not-a-resume-file":
        torch.save({"model": _build("mhsa").state_dict(), "epoch": 2}, path)
    else:  # the right run, but a state that does not fit the optimizer: loading fails half-way
        state = torch.load(path, weights_only=True)
        state["optimizer"]["param_groups"] = []
        torch.save(state, path)
    with caplog.at_level(logging.WARNING, logger="nextloc"):
        got = _run("mhsa", data, path)
    assert got.resumed_from_epoch == 0
    assert "training from scratch" in caplog.text
    _assert_identical(got, _reference("mhsa", data))


def test_seed_ensemble_members_are_the_single_models_of_their_seeds(data, tmp_path):
    """Seed 1 of a 2-member ensemble trains seeds 2 and 3, each exactly as a single model of that seed;
    member checkpoints live in their own folders, and refit recipes are refused."""
    train, val = data
    config = training_recipe("pointer_plus", max_epochs=2, batch_size=64, seed=1)
    ensemble, members = fit_seed_ensemble(
        lambda seed: _build("pointer_plus", seed),
        train,
        val,
        config,
        2,
        log_prob_output=True,
        checkpoint_dir=tmp_path,
    )
    assert len(ensemble.members) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["member0", "member1"]
    for member, seed in zip(members, (2, 3), strict=True):
        single, _ = fit_model(
            lambda seed=seed: _build("pointer_plus", seed),
            train,
            val,
            training_recipe("pointer_plus", max_epochs=2, batch_size=64, seed=seed),
            log_prob_output=True,
        )
        want = single.model.state_dict()
        assert list(member.model.state_dict()) == list(want)
        for name, got in member.model.state_dict().items():
            torch.testing.assert_close(got, want[name], rtol=0, atol=0, msg=name)
    with pytest.raises(ValueError, match="train only"):
        fit_seed_ensemble(
            lambda seed: _build("pointer_plus", seed),
            train,
            val,
            training_recipe("pointer_plus", max_epochs=2, refit_on_train_val=True),
            2,
            log_prob_output=True,
        )


@pytest.mark.parametrize(
    ("kind", "draws"),
    [
        ("mhsa", "torch"),
        ("mhsa_diagonal", "torch"),
        ("lstm", "pcg64"),
        ("pointer", "pcg64"),
        ("pointer_plus", "pcg64"),
    ],
)
def test_recipes_dropout_draws_and_the_reference_draws_are_one_override_away(kind, draws):
    """PCG64 masks where they kept the validation means (nextloc.training.train); ``dropout_rng="torch"`` gives
    F.dropout's draws, the rest of the recipe unchanged."""
    ours = training_recipe(kind)
    assert ours.dropout_rng == draws
    assert training_recipe(kind, dropout_rng="torch") == ours.model_copy(update={"dropout_rng": "torch"})
    with pytest.raises(
        ValueError, match="training option dropout_rng='mt': expected one of \\['torch', 'pcg64'\\]"
    ):
        training_recipe(kind, dropout_rng="mt")


def test_pcg64_dropout_leaves_torch_generator_alone_and_follows_the_seed(data, monkeypatch):
    """mhsa's only random draws are dropout's: with PCG64 masks (not its recipe's), training leaves torch's
    global generator where seeding put it, and the same seed gives the same weights while another seed of
    the dropout stream alone gives others."""
    train, val = data
    config = training_recipe("mhsa", max_epochs=2, batch_size=32, dropout_rng="pcg64")

    def weights(dropout_seed: int | None = None) -> dict[str, torch.Tensor]:
        if dropout_seed is not None:  # another dropout stream, everything else as seeded
            monkeypatch.setattr(train_module, "PCG64Dropout", lambda seed: PCG64Dropout(dropout_seed))
        return fit(_build("mhsa"), train, val, config, log_prob_output=False).model.state_dict()

    first = weights()
    after = torch.get_rng_state()
    seed_everything(config.seed)
    assert torch.equal(after, torch.get_rng_state())
    again, other = weights(), weights(dropout_seed=1)
    assert all(torch.equal(again[k], v) for k, v in first.items())
    assert not all(torch.equal(other[k], v) for k, v in first.items())


def test_deterministic_mode_without_importing_inductor():
    """seed_everything turns torch's deterministic algorithms on (warn-only) without loading torch._inductor."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from nextloc.training.train import seed_everything\n"
        "seed_everything(0)\n"
        "print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),"
        " 'torch._inductor' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "False"]


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("monitor", "val_foo", "'val_loss', 'val_acc@1', 'val_mrr', 'val_place_acc@1', 'val_place_mrr'"),
        ("recipe", "foo", "'mhsa', 'pointer'"),
        ("dropout_rng", "numpy", "'torch', 'pcg64'"),
    ],
)
def test_a_misspelt_training_choice_fails_before_any_work_naming_it(option, value, allowed) -> None:
    """A training option with a fixed set of values is checked when the config is made (before the
    flows start), not when training first reads it (an epoch later, or never)."""
    with pytest.raises(
        ValueError, match=rf"pointer_plus: training option {option}='{value}': expected one of \[{allowed}\]"
    ):
        check_kind_overrides("pointer_plus", {}, {option: value})
