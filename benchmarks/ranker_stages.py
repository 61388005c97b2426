"""Benchmark: the ranker's training stage by stage in one process, with the memory each stage reaches.

Runs what ``nextloc train --model ranker`` runs inside its task (load the samples, fit, evaluate, let go of
the questions, write the bundle, register it in a throwaway SQLite MLflow store), outside Prefect, on a data
directory kept by ``benchmarks/scale.py --keep-data`` (or any preprocessed one), and prints one JSON
document: per stage its seconds, the process's RSS after it and the highest RSS seen during it (sampled
every 20 ms).

    python benchmarks/ranker_stages.py --data-dir /tmp/nextloc-scale/size-16/out-local
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class Stages:
    """Each stage's seconds, RSS after it and peak RSS during it (a thread samples the RSS)."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.peak = self.process.memory_info().rss
        self.started = time.perf_counter()
        self.rows: list[dict] = []
        self.done = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def mark(self, name: str) -> None:
        rss = self.process.memory_info().rss
        now = time.perf_counter()
        self.rows.append(
            {
                "stage": name,
                "seconds": round(now - self.started, 2),
                "rss_gb": round(rss / 2**30, 2),
                "peak_gb": round(max(self.peak, rss) / 2**30, 2),
            }
        )
        print(f"[ranker_stages] {self.rows[-1]}", file=sys.stderr)
        self.peak, self.started = rss, now


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="a preprocessed data directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import mlflow
    import torch

    from nextloc.training import fit_kind
    from runtime.catalog import Catalog
    from tasks.train import _log_bundle, _Run, _save_bundle

    stages, catalog = Stages(), Catalog(str(args.data_dir))
    meta = json.loads((args.data_dir / "metadata.json").read_text())
    cpu = torch.device("cpu")
    splits = fit_kind.load_splits({s: catalog.samples(s) for s in ("train", "val", "test")}, cpu, "ranker")
    stages.mark("load")
    with tempfile.TemporaryDirectory() as tmp:
        fitted = fit_kind.fit_kind(
            "ranker",
            args.seed,
            splits,
            meta,
            model_overrides={},
            train_overrides={},
            device=cpu,
            checkpoint_dir=Path(tmp) / "checkpoints",
            staypoints=catalog.staypoints,
            locations=catalog.vocabulary("locations"),
            located=catalog.located,
        )
        stages.mark("fit")
        evaluation = fitted.evaluate(splits)
        stages.mark("evaluate")
        fitted, splits = fitted.answered(), None
        stages.mark("answered")
        mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
        with mlflow.start_run():
            run = _Run("benchmark", Path(tmp), "ranker", args.seed, meta, catalog, None)
            fitted = _save_bundle(run, fitted, evaluation, Path(tmp) / "bundle")
            stages.mark("save_bundle")
            _log_bundle("ranker", Path(tmp) / "bundle", catalog)
            stages.mark("log_bundle")
    stages.done.set()
    peak = max(row["peak_gb"] for row in stages.rows)
    samples = meta["n_samples"]
    json.dump(
        {"data_dir": str(args.data_dir), "samples": samples, "peak_gb": peak, "stages": stages.rows},
        sys.stdout,
        indent=2,
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
