"""Where a training step's time goes: torch's operator profile of one model kind's recipe, kept as a file.

    python benchmarks/profile_train.py --data-dir data/geolife --kinds mhsa,pointer,pointer_plus

writes ``benchmarks/profiles/train-<kind>-ops.txt``: the command, the training samples/s of the warm-up
batches (one intra-op thread, as the trainings run in worker processes), then the operators of 40
training steps (forward, loss, backward, clipping, optimiser step; the recipe's batches and loss) sorted
by their own CPU time.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def recipe_step(
    data_dir: Path,
    kind: str,
    wrap_loss: Callable[[Callable[[Any], Any]], Callable[[Any], Any]] | None = None,
    foreach: bool = False,
) -> tuple[Callable[[Any], None], list, Any]:
    """A training step of ``kind``'s recipe (forward, loss, backward, clipping, optimiser step) on one intra-op
    thread, with the recipe's dropout draws, the recipe's shuffled training batches (seed 0) and its
    ``TrainConfig``.

    ``wrap_loss`` wraps the batch -> loss function (autocast, ``torch.compile``); ``foreach`` runs Adam and the
    clipping as the trainer does (the same bits, less Python per step).
    """
    import torch

    from nextloc.models import build_model
    from nextloc.models.batch import SampleTensors
    from nextloc.models.dropout import PCG64Dropout, drawing_from
    from nextloc.models.registry import kind as kind_entry
    from nextloc.models.registry import training_recipe
    from nextloc.training.train import _loss, seed_everything

    meta = json.loads((data_dir / "metadata.json").read_text())
    torch.set_num_threads(1)
    overrides = {"max_seq_len": meta["max_hist_len"] + 10} if kind.startswith("pointer") else {}
    config = training_recipe(kind)
    seed_everything(0, config.deterministic)
    model = build_model(kind, meta["total_loc_num"], meta["total_user_num"], **overrides)
    train = SampleTensors.from_parquet(data_dir / "samples" / "train.parquet")
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=foreach)
    generator = torch.Generator().manual_seed(0)
    masks = PCG64Dropout(0) if config.dropout_rng == "pcg64" else None  # CPU: the trainer's, seed 0
    batches = list(
        train.batches(
            config.batch_size,
            shuffle=True,
            generator=generator,
            drop_last=config.drop_last,
            bucket=config.bucket,
            bucket_pool=config.bucket_pool,
        )
    )
    model.train()

    def loss_of(batch: Any) -> Any:
        if hasattr(model, "training_loss"):
            return model.training_loss(batch, config.label_smoothing)
        return _loss(model(batch), batch.target, kind_entry(kind).log_prob_output, config.label_smoothing)

    loss_fn = wrap_loss(loss_of) if wrap_loss is not None else loss_of

    def step(batch: Any) -> None:
        with drawing_from(model, masks):  # the recipe's dropout draws, as the trainer's
            loss = loss_fn(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm, foreach=foreach)
        optimizer.step()

    return step, batches, config


def step_rate(
    step: Callable[[Any], None],
    batches: list,
    warmup: int,
    steps: int,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """Train samples/s of ``steps`` calls of ``step`` after ``warmup`` untimed ones, the batches repeated as
    needed; ``sync`` waits for queued device work (a GPU's) before each clock reading."""
    timed = (batches * (1 + (warmup + steps) // max(1, len(batches))))[: warmup + steps]
    start = time.perf_counter()
    for batch in timed[:warmup]:
        step(batch)
    sync()
    warm = time.perf_counter() - start
    start, n = time.perf_counter(), 0
    for batch in timed[warmup:]:
        step(batch)
        n += len(batch.target)
    sync()
    return {"samples_per_s": round(n / (time.perf_counter() - start), 1), "warmup_s": round(warm, 2)}


def profile_kind(data_dir: Path, kind: str, warmup: int = 40, steps: int = 40) -> str:
    from torch.profiler import ProfilerActivity, profile

    step, batches, config = recipe_step(data_dir, kind)
    start, n = time.perf_counter(), 0
    for batch in batches[:warmup]:
        step(batch)
        n += len(batch.target)
    rate = n / (time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches[warmup : warmup + steps]:
            step(batch)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    return (
        f"# {kind}: batch {config.batch_size}, bucketed {config.bucket} (pools of {config.bucket_pool}), "
        f"dropout draws {config.dropout_rng}, 1 thread; warm-up {warmup} steps "
        f"{rate:.0f} train samples/s\n# operators of the next {steps} steps, by own CPU time:\n{table}\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=REPO / "data" / "geolife")
    parser.add_argument("--kinds", default="mhsa,pointer,pointer_plus")
    args = parser.parse_args()
    command = "python benchmarks/profile_train.py " + shlex.join(sys.argv[1:])
    out_dir = REPO / "benchmarks" / "profiles"
    out_dir.mkdir(parents=True, exist_ok=True)
    for kind in args.kinds.split(","):
        text = f"# command: {command}\n" + profile_kind(args.data_dir, kind)
        (out_dir / f"train-{kind}-ops.txt").write_text(text)
        print(text.splitlines()[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
