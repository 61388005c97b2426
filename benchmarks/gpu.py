"""GPU training against one CPU core, in one script for a short GPU lease: throughput, then accuracy.

    python benchmarks/gpu.py --data-dir data/geolife --out gpu.json            # on the GPU machine
    python benchmarks/gpu.py --data-dir data/geolife --device cpu --out cpu.json   # the same script, here

Runs, one after another, each in its own process, and rewrites ``--out`` after each (a run cut off by the
lease leaves what was measured):

1. ``cpu_core``: each neural kind's training samples/s on one CPU core of this machine (the product's loop,
   ``--epochs`` epochs, one intra-op thread), in a run of its own: the baseline of the 10x target.
2. ``product``: the same on ``--device`` (today's CUDA path: fp16 autocast with a gradient scaler).
3. ``steps``: the training step alone on ``--device`` (the recipe's batches, optimiser, clipping; ``--steps``
   timed steps after ``--warmup``), per variant: ``fp32``; ``fp16_scaler`` (the product's);
   ``bf16`` (autocast, no scaler: bf16 keeps fp32's range); ``bf16_fused`` (+ the fused Adam/AdamW);
   ``bf16_fused_graphs`` (+ ``torch.compile(mode="reduce-overhead")``: CUDA graphs). On a CPU only ``fp32``.
4. ``full``: the product's whole training (``benchmarks/train.py``'s full run) of each kind for each seed,
   seed by seed, until ``--budget-s`` is spent: wall, samples/s, test place Acc@1 (the accuracy check).

Prints and writes one JSON object; ratios to ``cpu_core`` are in ``summary``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # profile_train's step timing
KINDS = "mhsa,pointer,pointer_plus,lstm"
VARIANTS = ("fp32", "fp16_scaler", "bf16", "bf16_fused", "bf16_fused_graphs")


def measure_step(data_dir: Path, kind: str, variant: str, device: str, warmup: int, steps: int) -> dict:
    """Training samples/s of ``kind``'s step in ``variant`` on ``device`` (see the module's docstring)."""
    import torch
    from profile_train import step_rate

    from nextloc.models import build_model
    from nextloc.models.batch import SampleTensors
    from nextloc.models.registry import kind as kind_entry
    from nextloc.models.registry import training_recipe
    from nextloc.training import optim
    from nextloc.training.train import _loss, seed_everything

    dev = torch.device(device)
    meta = json.loads((data_dir / "metadata.json").read_text())
    torch.set_num_threads(1)
    config = training_recipe(kind)
    seed_everything(0, deterministic=False)
    extra = {"max_seq_len": meta["max_hist_len"] + 10} if kind.startswith("pointer") else {}
    model = build_model(kind, meta["total_loc_num"], meta["total_user_num"], **extra).to(dev).train()
    optimizer = optim.make_optimizer(model, config)
    if "fused" in variant:  # the recipe's optimiser and settings, one fused kernel instead of foreach
        accepted = inspect.signature(type(optimizer)).parameters
        settings = {
            k: v for k, v in optimizer.defaults.items() if k in accepted and k not in ("foreach", "fused")
        }
        optimizer = type(optimizer)(model.parameters(), **settings, fused=True)
    train = SampleTensors.from_parquet(data_dir / "samples" / "train.parquet", dev)
    generator = torch.Generator().manual_seed(0)
    batches = list(
        train.batches(
            config.batch_size,
            shuffle=True,
            generator=generator,
            drop_last=True,
            bucket=config.bucket,
            bucket_pool=config.bucket_pool,
        )
    )
    dtype = {"fp16_scaler": torch.float16, "fp32": None}.get(variant, torch.bfloat16)
    scaler = torch.amp.GradScaler(dev.type, enabled=variant == "fp16_scaler")

    def loss_of(batch: Any) -> torch.Tensor:
        with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            if hasattr(model, "training_loss"):
                return model.training_loss(batch, config.label_smoothing)
            return _loss(model(batch), batch.target, kind_entry(kind).log_prob_output, config.label_smoothing)

    loss_fn = torch.compile(loss_of, mode="reduce-overhead") if variant.endswith("graphs") else loss_of

    def step(batch: Any) -> None:
        loss = loss_fn(batch)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm, foreach=True)
        scaler.step(optimizer)
        scaler.update()

    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    return step_rate(step, batches, warmup, steps, sync)


def _child(args: list[str], timeout: float) -> dict:
    """One measurement in a fresh process; its last stdout line is its JSON (or the failure, as JSON)."""
    try:
        proc = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=max(timeout, 1)
        )
    except subprocess.TimeoutExpired:
        return {"error": f"over the budget ({timeout:.0f} s left)"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1], "rc": proc.returncode}
    return json.loads(lines[-1])


def _machine(device: str) -> dict:
    import torch

    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_1min": os.getloadavg()[0],
        "torch": torch.__version__,
    }
    if device == "cuda" and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        out["bf16"] = torch.cuda.is_bf16_supported()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, default=REPO / "data" / "geolife")
    parser.add_argument("--device", default="cuda", help="the device measured against one CPU core")
    parser.add_argument("--kinds", default=KINDS)
    parser.add_argument("--seeds", default="0,1,2,3,4", help="seeds of the full trainings, in order")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the throughput runs")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--budget-s", type=float, default=480, help="no run starts after this many seconds")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--step", nargs=2, metavar=("KIND", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        print(json.dumps(measure_step(args.data_dir, *args.step, args.device, args.warmup, args.steps)))
        return 0
    started = time.perf_counter()
    kinds, seeds = args.kinds.split(","), [int(s) for s in args.seeds.split(",")]
    out: dict[str, Any] = {
        "command": "python benchmarks/gpu.py " + " ".join(sys.argv[1:]),
        "machine": _machine(args.device),
        "cpu_core": {},
        "product": {},
        "steps": {},
        "full": {},
    }

    def left() -> float:
        return args.budget_s - (time.perf_counter() - started)

    def record(section: str, key: str, worker: list[str]) -> None:
        out[section][key] = _child(worker, left()) if left() > 0 else {"error": "not started: budget spent"}
        args.out.write_text(json.dumps(out, indent=1) + "\n")

    train = [
        str(REPO / "benchmarks" / "train.py"),
        "--data-dir",
        str(args.data_dir),
        "--epochs",
        str(args.epochs),
    ]
    for kind in kinds:
        record("cpu_core", kind, [*train, "--device", "cpu", "--worker", kind, "0", "nextloc"])
    for kind in kinds:
        record("product", kind, [*train, "--device", args.device, "--worker", kind, "0", "nextloc"])
    me = [
        __file__,
        "--data-dir",
        str(args.data_dir),
        "--device",
        args.device,
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        "--out",
        os.devnull,
    ]
    for kind in kinds:
        for variant in VARIANTS if args.device != "cpu" else ("fp32",):
            record("steps", f"{kind}/{variant}", [*me, "--step", kind, variant])
    for seed in seeds:
        for kind in kinds:
            record(
                "full",
                f"{kind}/seed{seed}",
                [*train, "--device", args.device, "--worker", kind, str(seed), "full"],
            )
    out["summary"] = _summary(out, kinds)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["summary"], indent=1))
    return 0


def _summary(out: dict, kinds: list[str]) -> dict:
    """Per kind: the product's and each step variant's samples/s over one CPU core's, the full runs' Acc@1."""
    summary: dict[str, Any] = {}
    for kind in kinds:
        core = out["cpu_core"][kind].get("train_samples_per_s")
        product = out["product"][kind].get("train_samples_per_s")
        steps = {
            k.split("/")[1]: v.get("samples_per_s")
            for k, v in out["steps"].items()
            if k.startswith(kind + "/")
        }
        accs = [
            v["place_acc@1"]
            for k, v in out["full"].items()
            if k.startswith(kind + "/") and "place_acc@1" in v
        ]
        summary[kind] = {
            "cpu_core_samples_per_s": core,
            "product_over_cpu_core": round(product / core, 2) if core and product else None,
            "step_samples_per_s": steps,
            "full_runs": len(accs),
            "place_acc@1_mean": round(sum(accs) / len(accs), 2) if accs else None,
            "full_wall_s": round(
                sum(v.get("run_wall_s", 0) for k, v in out["full"].items() if k.startswith(kind + "/")), 1
            ),
        }
    return summary


if __name__ == "__main__":
    sys.exit(main())
