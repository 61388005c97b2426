"""Benchmark: training throughput of nextloc's trainer against a reference-style loop, same run, same data.

    python benchmarks/train.py --data-dir data/geolife            # every recipe, 1 seed each
    python benchmarks/train.py --data-dir data/geolife --five-seeds  # + 5-seed pointer_plus wall time
    python benchmarks/train.py --data-dir data/geolife --repeats 3   # medians of 3 rounds (noisy machines)

The reference-style loop is what both reference repositories do: a per-sample ``Dataset`` building
tensors in ``__getitem__``, a ``pad_sequence`` collate, torch's default thread count, and Acc@k/MRR/NDCG
computed on every training batch with a ``topk`` and a full ``argsort`` over all locations. It trains the
same model class with the same recipe, so the ratio isolates the training machinery. ``nextloc`` is the
default trainer with each kind's recipe (one intra-op thread, everything on the training thread, see
``nextloc.training.train``). The LSTM's reference-style loop trains nextloc's LSTM, one fused call over the padded
batch (the conservative ratio: faster than the reference's packed loop); ``reference_style_packed`` is the
reference's own packed LSTM.
Both processes have the same 2 cores. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=REPO / "data" / "geolife")
    parser.add_argument(
        "--models",
        default="mhsa,pointer,pointer_plus,lstm",
        help="kinds compared with the reference-style loop",
    )
    parser.add_argument("--epochs", type=int, default=3, help="epochs for the throughput comparison")
    parser.add_argument(
        "--five-seeds", action="store_true", help="also time a full 5-seed pointer_plus run (2 workers)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds of the three runs per kind; each mode reports its median run, ratios are of the medians",
    )
    parser.add_argument(
        "--device", default="cpu", help="the device the nextloc runs train on: cpu, cuda or auto"
    )
    parser.add_argument("--worker", nargs=3, metavar=("MODEL", "SEED", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.worker:
        kind, seed, mode = args.worker
        print(json.dumps(_run(args.data_dir, kind, int(seed), mode, args.epochs, args.device)))
        return 0

    out: dict = {
        "machine": {"cpus": os.cpu_count()},
        "data_dir": str(args.data_dir),
        "epochs": args.epochs,
        "repeats": args.repeats,
    }
    for kind in args.models.split(","):
        # the LSTM also against the reference's own packed LSTM (pack_padded_sequence, h_n)
        modes = ("nextloc", "reference") + (("reference_packed",) if kind == "lstm" else ())
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        for round_ in range(args.repeats):  # each round runs every mode, in a rotated order
            shift = round_ % len(modes)
            for mode in modes[shift:] + modes[:shift]:
                runs[mode].append(_subprocess(args.data_dir, kind, 0, mode, args.epochs))
        ours, ref = (_median_run(runs[mode]) for mode in modes[:2])
        out[kind] = {
            "nextloc": ours,
            "reference_style": ref,
            "ratio_train_samples_per_s": _ratio(ours["train_samples_per_s"], ref["train_samples_per_s"]),
            "ratio_epoch_wall": _ratio(ref["epoch_wall_s"], ours["epoch_wall_s"]),
        }
        if "reference_packed" in runs:
            packed = _median_run(runs["reference_packed"])
            out[kind]["reference_style_packed"] = packed
            out[kind]["ratio_train_samples_per_s_packed"] = _ratio(
                ours["train_samples_per_s"], packed["train_samples_per_s"]
            )
        if args.repeats > 1:
            out[kind]["rounds"] = [
                {
                    "train_samples_per_s": {m: runs[m][i]["train_samples_per_s"] for m in modes},
                    "ratio_train_samples_per_s": _ratio(
                        runs["nextloc"][i]["train_samples_per_s"], runs["reference"][i]["train_samples_per_s"]
                    ),
                }
                for i in range(args.repeats)
            ]
    if args.five_seeds:
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=2) as pool:  # 2 training processes at a time, queued
            results = list(
                pool.map(
                    lambda seed: _subprocess(args.data_dir, "pointer_plus", seed, "full", args.epochs),
                    range(5),
                )
            )
        wall = time.perf_counter() - start
        acc = [r["acc@1"] for r in results]
        mrr = [r["mrr"] for r in results]
        out["pointer_plus_5_seeds"] = {
            "wall_s": round(wall, 1),
            "workers": 2,
            "acc@1_mean": round(sum(acc) / 5, 2),
            "mrr_mean": round(sum(mrr) / 5, 2),
            "runs": results,
        }
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _median_run(runs: list[dict]) -> dict:
    """The run with the median train samples/s (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r["train_samples_per_s"])[(len(runs) - 1) // 2]


def _ratio(a: float, b: float) -> float:
    return round(a / b, 2)


def _spawn(data_dir: Path, kind: str, seed: int, mode: str, epochs: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        __file__,
        "--data-dir",
        str(data_dir),
        "--epochs",
        str(epochs),
        "--worker",
        kind,
        str(seed),
        mode,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)


def _subprocess(data_dir: Path, kind: str, seed: int, mode: str, epochs: int) -> dict:
    proc = _spawn(data_dir, kind, seed, mode, epochs)
    stdout, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"worker failed: {kind} {mode}")
    return json.loads(stdout.strip().splitlines()[-1])


def _run(data_dir: Path, kind: str, seed: int, mode: str, epochs: int, device: str = "cpu") -> dict:
    import torch

    from nextloc.evaluation.evaluate import model_scores, score_split
    from nextloc.models import build_model, count_parameters
    from nextloc.models.batch import SampleTensors
    from nextloc.models.registry import kind as kind_entry
    from nextloc.models.registry import training_recipe
    from nextloc.training.train import fit_model, resolve_device

    meta = json.loads((data_dir / "metadata.json").read_text())
    overrides = {"max_seq_len": meta["max_hist_len"] + 10} if kind.startswith("pointer") else {}

    dev = resolve_device(device) if mode in ("nextloc", "full") else torch.device("cpu")

    def build():
        torch.manual_seed(seed)
        return build_model(kind, meta["total_loc_num"], meta["total_user_num"], **overrides).to(dev)

    if mode == "reference":
        return _reference_loop(build(), kind, data_dir, seed, epochs)
    if mode == "reference_packed":
        return _reference_loop(_packed_lstm(build()), kind, data_dir, seed, epochs)
    torch.set_num_threads(1)
    splits = {
        s: SampleTensors.from_parquet(data_dir / "samples" / f"{s}.parquet", dev)
        for s in ("train", "val", "test")
    }
    limit = (
        {}
        if mode == "full"
        else {"max_epochs": epochs, "min_epochs": 0, "patience": 10**6, "refit_on_train_val": False}
    )
    config = training_recipe(kind, seed=seed, **limit)
    start = time.perf_counter()
    selection, refit = fit_model(
        build, splits["train"], splits["val"], config, log_prob_output=kind_entry(kind).log_prob_output
    )
    wall = time.perf_counter() - start
    final = refit or selection
    metrics = score_split(model_scores(final.model), splits["test"]).accumulator.compute()
    return {
        "device": str(dev),
        "train_samples_per_s": round(selection.train_samples_per_s, 1),
        "epoch_wall_s": round(selection.train_seconds / selection.epochs, 2),
        "epochs": selection.epochs,
        "best_epoch": selection.best_epoch,
        "wall_to_best_s": round(selection.seconds_to_best, 1),
        "refit_epochs": refit.epochs if refit else 0,
        "run_wall_s": round(wall, 1),
        "n_params": count_parameters(final.model),
        **{k: round(v, 2) for k, v in metrics.items() if k != "n"},
    }


def _packed_lstm(model):  # noqa: ANN001, ANN202 (the class is made where torch is imported)
    """The reference LSTM's forward around a nextloc LSTM's modules: the padded embeddings packed
    (``pack_padded_sequence``), the LSTM's ``h_n`` of the top layer, LayerNorm, the head."""
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence

    class PackedLSTM(torch.nn.Module):
        def __init__(self, inner) -> None:  # noqa: ANN001
            super().__init__()
            self.inner = inner

        def forward(self, batch):  # noqa: ANN001, ANN202
            emb = self.inner.embedding(batch)
            packed = pack_padded_sequence(emb, batch.lengths, batch_first=True, enforce_sorted=False)
            _, (h_n, _) = self.inner.lstm(packed)
            return self.inner.head(self.inner.layer_norm(h_n[-1]), batch.user)

    return PackedLSTM(model)


def _reference_loop(model, kind: str, data_dir: Path, seed: int, epochs: int) -> dict:
    """Per-sample dataset + pad_sequence collate + metrics on every batch (the reference trainers' way)."""
    import pyarrow.parquet as pq
    import torch
    from torch.nn.utils.rnn import pad_sequence
    from torch.utils.data import DataLoader, Dataset

    from nextloc.models.batch import Batch
    from nextloc.models.registry import training_recipe

    class Samples(Dataset):
        def __init__(self, path: Path) -> None:
            self.rows = pq.read_table(path).to_pylist()

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, i: int):
            r = self.rows[i]
            return (
                torch.tensor(r["loc_hist"]),
                torch.tensor(r["target_loc"]),
                {
                    "user": torch.tensor(r["user"]),
                    "time": torch.tensor(r["start_min_hist"]) // 15,
                    "weekday": torch.tensor(r["weekday_hist"]),
                    "duration": torch.tensor(r["duration_hist"]) // 30,
                    "diff": torch.tensor(r["diff_hist"]),
                },
            )

    def collate(items):
        x = pad_sequence([i[0] for i in items])  # (T, B), seq-first as in the reference
        d = {k: pad_sequence([i[2][k] for i in items]) for k in ("time", "weekday", "duration", "diff")}
        lengths = torch.tensor([len(i[0]) for i in items])
        return Batch(
            loc=x.T,
            time=d["time"].T,
            weekday=d["weekday"].T,
            duration=d["duration"].T,
            diff=d["diff"].T,
            user=torch.stack([i[2]["user"] for i in items]),
            lengths=lengths,
            target=torch.stack([i[1] for i in items]),
            index=torch.arange(len(items)),
        )

    cfg = training_recipe(kind, seed=seed)
    torch.manual_seed(seed)
    loader = DataLoader(
        Samples(data_dir / "samples" / "train.parquet"),
        batch_size=cfg.batch_size,
        shuffle=True,
        drop_last=cfg.drop_last,
        collate_fn=collate,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = (
        torch.optim.AdamW(params, lr=cfg.lr) if kind == "pointer" else torch.optim.Adam(params, lr=cfg.lr)
    )
    criterion = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=cfg.label_smoothing)
    n = 0
    start = time.perf_counter()
    for _ in range(epochs):
        model.train()
        for batch in loader:
            out = model(batch)
            loss = criterion(out, batch.target)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm)
            optimizer.step()
            n += len(batch.target)
            with torch.no_grad():  # the reference's per-batch metrics: topk + argsort over all locations
                top10 = torch.topk(out, 10, dim=-1).indices
                _ = (top10 == batch.target[:, None]).any(dim=1).sum()
                ranks = torch.argsort(torch.argsort(out, dim=-1, descending=True), dim=-1)
                _ = ranks.gather(1, batch.target[:, None])
    wall = time.perf_counter() - start
    return {
        "train_samples_per_s": round(n / wall, 1),
        "epoch_wall_s": round(wall / epochs, 2),
        "threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    sys.exit(main())
