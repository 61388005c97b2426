"""Does the ranker gain from a network's scores when its trees see honest ones? (issue 34, item 1)

The ranker's trees are fit on train's questions. A network's scores on train are better than on any question
it did not see (it was fit on them), so trees that read them lean on a signal that is weaker on validation.
Cross-fitting gives the trees honest train scores: each user's train samples are cut into ``--folds``
contiguous time blocks, and block ``k`` is scored by a ``pointer_plus`` trained (its recipe, epochs chosen on
validation) on the other blocks. Validation is scored by the network trained on all of train (``full``) or
by the mean of the fold networks' probabilities (``fold_mean``).

Per candidate the trees read three more features: the network's log-probability of the place, the log of
its rank among all places, its share among the question's candidates. Each variant is the ranker's
LambdaRank (its parameters, trees chosen on validation by early stopping) for the same seed; the report is
validation only (place Acc@1 of the top candidate, candidate MRR): this chooses, so test is never read.

    python benchmarks/cross_fit.py --data-dir data/geolife --seeds 0,1 > cross_fit.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from nextloc.config import PreprocessConfig
from nextloc.evaluation.evaluate import model_scores
from nextloc.models import build_model
from nextloc.models.batch import SampleTensors
from nextloc.models.registry import training_recipe
from nextloc.routine.counts import grouped_softmax
from nextloc.routine.data import RoutineData, read_located
from nextloc.routine.ranking import CandidateSet, RoutineRanker, candidate_mrr
from nextloc.training.train import fit_model

NETWORK = "pointer_plus"


def time_blocks(user: np.ndarray, folds: int) -> np.ndarray:
    """``(N,)`` each sample's block: each user's samples (in split order, i.e. by time) cut into ``folds``."""
    block = np.zeros(len(user), dtype=np.int64)
    for u in np.unique(user):
        idx = np.flatnonzero(user == u)
        block[idx] = np.arange(len(idx)) * folds // len(idx)
    return block


def network_log_probs(fit_on: SampleTensors, splits: dict, meta: dict, seed: int) -> dict[str, np.ndarray]:
    """Train the network on ``fit_on`` (epochs chosen on val) and score train and val, ``(N, V)`` each."""

    def build() -> torch.nn.Module:
        torch.manual_seed(seed)
        return build_model(
            NETWORK, meta["total_loc_num"], meta["total_user_num"], max_seq_len=int(meta["max_hist_len"]) + 10
        )

    selection, _ = fit_model(
        build, fit_on, splits["val"], training_recipe(NETWORK, seed=seed), log_prob_output=True
    )
    score = model_scores(selection.model)
    with torch.no_grad():
        return {s: torch.cat([score(b) for b in splits[s].batches(512)]).numpy() for s in ("train", "val")}


def with_network(candidates: CandidateSet, log_p: np.ndarray) -> CandidateSet:
    """The candidates with the network's log-probability, log rank and candidate share appended."""
    q, place = candidates.query, candidates.place
    lp = log_p[q, place]
    rank = (log_p[q] > lp[:, None]).sum(axis=1)
    _, z, total = grouped_softmax(q, lp, candidates.n)
    share = z / total[q]
    features = np.hstack([candidates.features, np.column_stack([lp, np.log1p(rank), share])])
    return CandidateSet(q, place, features, candidates.explore, candidates.n)


def ranker_on_val(train: CandidateSet, train_target, val: CandidateSet, val_target, seed: int) -> dict:
    """The ranker (its LambdaRank, trees chosen on val) on these features: trees, val place Acc@1 (top
    candidate) and candidate MRR."""
    ranker = RoutineRanker(seed).fit(train, train_target, val, val_target)
    scores = ranker.scores(val)
    order = np.lexsort((val.place, -scores, val.query))  # ties: the lower place id, as the metrics do
    first = np.unique(val.query[order], return_index=True)[1]
    top = np.zeros(val.n, dtype=np.int64)
    top[val.query[order][first]] = val.place[order][first]
    return {
        "trees": ranker.best_iteration,
        "val_place_acc@1": round(100 * float((top == val_target).mean()), 2),
        "val_candidate_mrr": round(candidate_mrr(val, scores, val_target), 2),
    }


def one_seed(data: RoutineData, splits: dict, meta: dict, seed: int, folds: int) -> dict:
    full = network_log_probs(splits["train"], splits, meta, seed)
    block = time_blocks(splits["train"].user_np, folds)
    out_of_fold, val_probs = np.zeros_like(full["train"]), []
    for k in range(folds):
        rest = SampleTensors(splits["train"].table.take(np.flatnonzero(block != k)))
        fold = network_log_probs(rest, splits, meta, seed)
        out_of_fold[block == k] = fold["train"][block == k]
        val_probs.append(np.exp(fold["val"]))
    fold_mean = np.log(np.mean(val_probs, axis=0) + 1e-30)
    train, val = data.candidates["train"], data.candidates["val"]
    variants = {
        "routine features only (the ranker)": (train, val),
        "in-sample network scores": (with_network(train, full["train"]), with_network(val, full["val"])),
        "cross-fit, val from full": (with_network(train, out_of_fold), with_network(val, full["val"])),
        "cross-fit, val from fold_mean": (with_network(train, out_of_fold), with_network(val, fold_mean)),
    }
    targets = data.targets["train"], data.targets["val"]
    return {name: ranker_on_val(t, targets[0], v, targets[1], seed) for name, (t, v) in variants.items()}


def routine_data(data_dir: Path) -> tuple[dict, dict[str, SampleTensors], RoutineData]:
    """A processed dataset's metadata, its train and val samples, and their :class:`RoutineData` (test is
    not read)."""
    meta = json.loads((data_dir / "metadata.json").read_text())
    splits = {s: SampleTensors.from_parquet(data_dir / "samples" / f"{s}.parquet") for s in ("train", "val")}
    data = RoutineData.build(
        pd.read_parquet(data_dir / "staypoints.parquet"),
        pd.read_parquet(data_dir / "vocabulary" / "locations.parquet"),
        splits,
        meta["total_loc_num"],
        PreprocessConfig.model_validate(meta["config"]).timezone,
        PreprocessConfig.model_validate(meta["config"]).samples.previous_days,
        read_located(data_dir / "03_locations" / "staypoints_located.parquet"),
    )
    return meta, splits, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data/geolife"))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--folds", type=int, default=4)
    args = parser.parse_args()
    meta, splits, data = routine_data(args.data_dir)
    seeds = [int(s) for s in args.seeds.split(",")]
    report = {
        "network": NETWORK,
        "folds": args.folds,
        "seeds": {s: one_seed(data, splits, meta, s, args.folds) for s in seeds},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
