"""What faster arithmetic would buy a reference recipe's training step on this CPU, against eager float32.

    python benchmarks/train_variants.py --data-dir data/geolife --kind mhsa

Each variant runs in its own process, one intra-op thread (as trainings run in worker processes): the
recipe's optimizer, loss, clipping and shuffled batches, ``--warmup`` steps untimed (compilation included
in ``warmup_s``), then ``--steps`` timed steps. Variants: ``eager`` (what nextloc runs, with the
recipe's dropout draws), ``bf16`` (CPU autocast to bfloat16) and ``compile`` (``torch.compile(dynamic=True)`` of the
loss). Both of the latter change the results' bits, so they would be recipe changes. Prints one JSON
object: per variant, train samples/s and the ratio to ``eager`` in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # profile_train's recipe step
VARIANTS = ("eager", "bf16", "compile")


def measure(data_dir: Path, kind: str, variant: str, warmup: int, steps: int) -> dict:
    import torch
    from profile_train import recipe_step, step_rate

    def wrap(loss_of):  # noqa: ANN001, ANN202
        if variant == "compile":
            return torch.compile(loss_of, dynamic=True)
        if variant == "bf16":

            def autocast_loss(batch):  # noqa: ANN001, ANN202
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return loss_of(batch)

            return autocast_loss
        return loss_of

    step, batches, _ = recipe_step(data_dir, kind, wrap, foreach=True)
    return step_rate(step, batches, warmup, steps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=REPO / "data" / "geolife")
    parser.add_argument("--kind", default="mhsa")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # one variant, in a child
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args.data_dir, args.kind, args.variant, args.warmup, args.steps)))
        return 0
    out: dict = {"kind": args.kind, "threads": 1, "steps": args.steps, "variants": {}}
    for variant in VARIANTS:
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--data-dir",
                str(args.data_dir),
                "--kind",
                args.kind,
                "--variant",
                variant,
                "--warmup",
                str(args.warmup),
                "--steps",
                str(args.steps),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        out["variants"][variant] = json.loads(child.stdout.strip().splitlines()[-1])
    eager = out["variants"]["eager"]["samples_per_s"]
    for result in out["variants"].values():
        result["ratio_to_eager"] = round(result["samples_per_s"] / eager, 3)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
