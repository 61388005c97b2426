"""Accuracy of every kind trained on a data folder, by kind of target, against the reference pointer.

Reads ``<data_dir>/results/<kind>/seed<k>/`` (``results.json`` and ``test_per_sample.parquet``, as the
train flow writes them) and prints one JSON document: per kind, the mean, standard deviation and count
over seeds of the place metrics, the new-place AUC and Brier score and the reference metrics, and place
Acc@1 by what the test target is:

* ``window``: a known place in the sample's 7-day history;
* ``past``: a known place the user visited before, but not in the window (only the routine reaches it);
* ``unvisited``: a known place the user never visited before;
* ``new``: a place outside the train vocabulary (always a miss for a place model).

A routine kind's ``past_places``: its reference metrics, AUC and Brier score when the new-place head's
``unseen_return_share`` leaves out the unseen places with fewer than 2 visits before now (the protocol's
DBSCAN effect, docs/protocol.md), beside the headline.

``ratio_to_reference`` is each kind's mean place Acc@1 over the reference pointer's (kind ``pointer``,
Pointer V45) when it was trained on the same folder. Nothing is chosen here: it reports test once.

``--distribution KIND`` (a routine kind) refits it for ``--seed`` and reports its one distribution over the
known places and "a new place" instead: the reliability table of its top answer on validation with the
ECE (val and test), and the answer sets holding 0.5, 0.8 and 0.9 of it on test (empirical coverage and
mean size).

    python benchmarks/accuracy.py --data-dir data/geolife > accuracy.json
    python benchmarks/accuracy.py --data-dir data/geolife --distribution ranker --seed 0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from nextloc.config import PreprocessConfig
from nextloc.evaluation.leaderboard import summarise
from nextloc.evaluation.metrics import RESULT_KEYS
from nextloc.routine.features import Routine
from nextloc.routine.visits import VisitLog, queries_for_targets

GROUPS = ("window", "past", "unvisited", "new")


def target_groups(data_dir: Path) -> np.ndarray:
    """The group (:data:`GROUPS`) of every test sample, in split order."""
    test = pd.read_parquet(data_dir / "samples" / "test.parquet")
    meta = json.loads((data_dir / "metadata.json").read_text())
    timezone = PreprocessConfig.model_validate(meta["config"]).timezone
    log = VisitLog.from_staypoints(pd.read_parquet(data_dir / "staypoints.parquet"), timezone)
    queries = queries_for_targets(log, test["staypoint_id"].to_numpy())
    query, place = Routine(log, meta["total_loc_num"]).candidates(queries)
    target = test["target_loc"].to_numpy()
    in_past = np.zeros(len(test), dtype=bool)
    in_past[query[place == target[query]]] = True
    in_window = np.array([t in set(h) for t, h in zip(target, test["loc_hist"], strict=True)])
    groups = np.where(in_past, "past", "unvisited").astype(object)
    groups[in_window & (target >= 2)] = "window"
    groups[target < 2] = "new"
    return groups


def kind_report(folder: Path, groups: np.ndarray) -> dict:
    """Mean +- std over the seeds of one kind's folder."""
    seeds = sorted(folder.glob("seed*/results.json"))
    results = [json.loads(path.read_text()) for path in seeds]
    report = {
        key: summarise([r.get(key) if r.get(key) is not None else np.nan for r in results])
        for key in RESULT_KEYS
    }
    by_group: dict[str, list[float]] = {g: [] for g in GROUPS}
    for path in seeds:
        per_sample = pd.read_parquet(path.parent / "test_per_sample.parquet").sort_values("index")
        hits = per_sample["place_acc@1"].to_numpy()
        for group in GROUPS:
            by_group[group].append(float(hits[groups == group].mean()))
    report["place_acc@1_by_target"] = {g: summarise(v) for g, v in by_group.items()}
    past = [r["past_places"] for r in results if "past_places" in r]
    if past:  # a routine kind: the head without the unseen places DBSCAN finds only with the future
        report["past_places"] = {key: summarise([p.get(key, np.nan) for p in past]) for key in past[0]}
    return report


def distribution_report(data_dir: Path, kind: str, seed: int) -> dict:
    """A routine kind refitted for ``seed``: its one distribution's reliability and answer sets (the test
    split's ``set_*`` metrics of :func:`nextloc.evaluation.evaluate.evaluate`)."""
    import tempfile

    import torch

    from nextloc.evaluation.metrics import SET_LEVELS
    from nextloc.training.fit_kind import fit_kind, load_splits

    meta = json.loads((data_dir / "metadata.json").read_text())
    splits = load_splits({s: data_dir / "samples" / f"{s}.parquet" for s in ("train", "val", "test")}, "cpu")
    with tempfile.TemporaryDirectory() as checkpoints:
        fitted = fit_kind(
            kind,
            seed,
            splits,
            meta,
            model_overrides={},
            train_overrides={},
            device=torch.device("cpu"),
            checkpoint_dir=Path(checkpoints),
            staypoints=data_dir / "staypoints.parquet",
            locations=data_dir / "vocabulary" / "locations.parquet",
        )
    evaluation = fitted.evaluate(splits)
    sets = {}
    for level in SET_LEVELS:
        coverage, size = (
            evaluation.test[f"set_{what}_{round(level * 100)}"] for what in ("coverage", "size")
        )
        sets[str(level)] = {"coverage_percent": round(coverage, 2), "mean_size": round(size, 2)}
    keys = ("place_acc@1", "place_mrr", "acc@1", "new_place_auc", "new_place_brier", "top1_ece")
    return {
        "kind": kind,
        "seed": seed,
        "val": {k: evaluation.val.get(k) for k in keys},
        "test": {k: evaluation.test.get(k) for k in keys},
        "val_reliability": evaluation.val_reliability,
        "test_answer_sets": sets,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="data/geolife")
    parser.add_argument("--distribution", default=None, help="a routine kind: its one distribution's report")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data_dir = Path(args.data_dir)
    if args.distribution is not None:
        print(json.dumps(_strict(distribution_report(data_dir, args.distribution, args.seed)), indent=1))
        return
    groups = target_groups(data_dir)
    kinds = {
        folder.name: kind_report(folder, groups)
        for folder in sorted((data_dir / "results").iterdir())
        if any(folder.glob("seed*/results.json"))
    }
    reference = kinds.get("pointer", {}).get("place_acc@1", {}).get("mean")
    for report in kinds.values():
        mean = report["place_acc@1"]["mean"]
        report["ratio_to_reference"] = round(mean / reference, 4) if reference else None
    shares = {g: round(float((groups == g).mean() * 100), 2) for g in GROUPS}
    report = {"data_dir": str(data_dir), "n_test": len(groups), "targets_percent": shares, "kinds": kinds}
    print(json.dumps(_strict(report), indent=1))


def _strict(value):
    """The report as strict JSON: NaN (a metric with no sample to average) becomes null."""
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, float) and value != value:
        return None
    return value


if __name__ == "__main__":
    main()
