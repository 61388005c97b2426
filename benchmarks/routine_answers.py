"""The routine kinds' answers on a processed data folder, written so that two versions of the code compare.

``record``: fits ``ranker``, ``routine`` and ``ranker_refit`` for seed 0 on ``--data-dir`` (as the train task
does) and writes, per kind, the validation, test and past-places metrics, every test sample's outcomes
(:meth:`~nextloc.evaluation.evaluate.Evaluation.per_sample`), the new-place head, sha256 digests of the
model's state (a ranker's trees) and of its test candidates' scores, and the fit and evaluation seconds.
``compare``: prints, per kind, which metrics and per-sample columns are equal between two records and the
largest difference of the others. Run ``record`` with each version on the same data, then ``compare``::

    python benchmarks/routine_answers.py record --data-dir data/geolife --out before.json
    python benchmarks/routine_answers.py compare before.json after.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch

from nextloc.models import registry
from nextloc.preprocessing.sequences import SPLITS
from nextloc.training import fit_kind
from runtime.catalog import Catalog

KINDS = registry.kinds("routine")
PARTS = ("val", "test", "past_places")


def record(data_dir: Path, kinds: tuple[str, ...]) -> dict:
    """Each kind's metrics, per-sample outcomes, head, digests and seconds on ``data_dir``."""
    catalog, cpu = Catalog(str(data_dir)), torch.device("cpu")
    meta = json.loads((data_dir / "metadata.json").read_text())
    paths = {s: data_dir / "samples" / f"{s}.parquet" for s in SPLITS}
    splits = fit_kind.load_splits(paths, cpu, "ranker")  # train's ids and targets, as a routine kind's task
    files = {"staypoints": catalog.staypoints, "located": catalog.located}
    report = {}
    for kind in kinds:
        started = time.perf_counter()
        fitted = fit_kind.fit_kind(
            kind, 0, splits, meta, model_overrides={}, train_overrides={}, device=cpu,
            checkpoint_dir=data_dir / "_routine_answers", locations=catalog.vocabulary("locations"), **files,
        )  # fmt: skip
        fitted_at = time.perf_counter()
        evaluation = fitted.evaluate(splits)
        per_sample = evaluation.per_sample()
        scores = fitted.model.scores(fitted.routine_data.candidates["test"])
        state = json.dumps(fitted.model.state(), sort_keys=True)
        report[kind] = {
            "val": evaluation.val,
            "test": evaluation.test,
            "past_places": evaluation.past_places or {},
            "per_sample": {c: per_sample[c].tolist() for c in per_sample.columns},
            "head": evaluation.head.to_dict(),
            "state_sha256": hashlib.sha256(state.encode()).hexdigest(),
            "scores_sha256": hashlib.sha256(np.asarray(scores, np.float64).tobytes()).hexdigest(),
            "fit_s": round(fitted_at - started, 2),
            "evaluate_s": round(time.perf_counter() - fitted_at, 2),
        }
    return report


def compare(before: dict, after: dict) -> dict:
    """Per kind: the equal metrics and per-sample columns, the largest difference of the others, and
    whether the model's state and scores are the same bytes."""
    out = {}
    for kind in before:
        a, b = before[kind], after[kind]
        row: dict = {"state_and_scores_identical": a["state_sha256"] == b["state_sha256"]}
        row["state_and_scores_identical"] &= a["scores_sha256"] == b["scores_sha256"]
        for part in PARTS:
            differ = {k: abs(a[part][k] - b[part][k]) for k in a[part] if a[part][k] != b[part][k]}
            row[part] = {"equal": len(a[part]) - len(differ), "differ": differ}
        columns = {
            c: (np.asarray(v, float), np.asarray(b["per_sample"][c], float))
            for c, v in a["per_sample"].items()
        }
        same = {c for c, (x, y) in columns.items() if np.array_equal(x, y, equal_nan=True)}
        row["per_sample_identical"] = sorted(same)
        row["per_sample_max_difference"] = {
            c: float(np.nanmax(np.abs(x - y))) for c, (x, y) in columns.items() if c not in same
        }
        out[kind] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record")
    rec.add_argument("--data-dir", type=Path, required=True)
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--kinds", default=",".join(KINDS))
    cmp = commands.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        report = record(args.data_dir, tuple(args.kinds.split(",")))
        args.out.write_text(json.dumps(report, default=float))
        print(
            json.dumps(
                {
                    k: {"test": v["test"], "fit_s": v["fit_s"], "evaluate_s": v["evaluate_s"]}
                    for k, v in report.items()
                }
            )
        )
    else:
        print(
            json.dumps(
                compare(json.loads(args.before.read_text()), json.loads(args.after.read_text())), indent=1
            )
        )


if __name__ == "__main__":
    main()
