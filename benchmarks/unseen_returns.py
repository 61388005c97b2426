"""Does the new-place head gain from the ranker's view of the unseen places the user already visited? (issue 34)

A target outside the train vocabulary (class ``1``, "a new place") is often a *return*: a place first visited
after the train period and visited again (27% of validation's new targets, 38% of test's). The routine
counts every such place as the one encoded place ``1``, so the ranker cannot see them apart.

Here the routine is built over *extended* place ids: a known place keeps its id, each raw place outside the
vocabulary gets one of its own (``num_places + k``). The ranker (fit on train, trees chosen on validation, as
the ``ranker`` kind) scores every place the user visited before now, known or not; the new feature is the
share of its calibrated softmax that goes to the unseen ones (``unseen_return_share``). The head is also
compared with the squares of its standardised inputs added (a quadratic logistic head), with and without it.

The head is the product's logistic :class:`~nextloc.routine.novelty.NewPlaceHead` over the ranker's
inputs (:data:`~nextloc.routine.novelty.ROUTINE_FEATURES`), with and without that one column, compared by
5-fold cross-validation on validation (stratified, 3 repeats): ROC-AUC and Brier of the out-of-fold
probabilities. Test is never read.

    python benchmarks/unseen_returns.py --data-dir data/geolife --seeds 0,1,2,3,4 > unseen_returns.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from cross_fit import routine_data

from nextloc.config import PreprocessConfig
from nextloc.evaluation.evaluate import score_split
from nextloc.preprocessing.sequences import UNSEEN
from nextloc.preprocessing.staypoints import to_ns
from nextloc.preprocessing.vocabulary import place_centres
from nextloc.routine.features import Routine, VisitLog, queries_for_targets
from nextloc.routine.novelty import NewPlaceHead
from nextloc.routine.ranking import CandidateSet, RoutineData, RoutineRanker

FOLDS, REPEATS = 5, 3


def extended_routine(staypoints: pd.DataFrame, locations: pd.DataFrame, num_places: int, timezone: str):
    """The routine over extended place ids (a known place its own, each unseen raw place ``num_places + k``)
    and ``(R,)`` which extended ids are unseen places."""
    encoded = staypoints["location_id"].to_numpy(np.int64)
    raw = staypoints["raw_location_id"].to_numpy(np.int64)
    unseen_raw, k = np.unique(raw[encoded == UNSEEN], return_inverse=True)
    place = encoded.copy()
    place[encoded == UNSEEN] = num_places + k
    size = num_places + len(unseen_raw)
    centres = np.full((size, 2), np.nan)
    centres[:num_places] = place_centres(locations, num_places)
    mean = staypoints[encoded == UNSEEN].groupby(k)[["latitude", "longitude"]].mean()
    centres[num_places + mean.index.to_numpy()] = mean.to_numpy()
    log = VisitLog.of(
        staypoints["user"].to_numpy(np.int64),
        to_ns(staypoints["started_at"]),
        to_ns(staypoints["finished_at"]),
        place,
        raw,
        staypoints["id"].to_numpy(np.int64),
        timezone,
    )
    return Routine(log, size, centres), np.arange(size) >= num_places


def unseen_return_share(ranker: RoutineRanker, routine: Routine, unseen: np.ndarray, ids: np.ndarray):
    """``(N,)`` per question (its target's staypoint id): the share of the ranker's calibrated softmax over
    every place the user visited before now that goes to places outside the vocabulary."""
    candidates = CandidateSet.build(routine, queries_for_targets(routine.log, ids))
    q, n = candidates.query, candidates.n
    scores = ranker.scores(candidates) / ranker.calibration.temperature
    top = np.full(n, -np.inf)
    np.maximum.at(top, q, scores)
    z = np.exp(scores - top[q])
    total = np.bincount(q, weights=z, minlength=n)
    return np.bincount(q, weights=z * unseen[candidates.place], minlength=n) / np.maximum(total, 1e-300)


def cross_validated(x: np.ndarray, is_new: np.ndarray) -> dict[str, float]:
    """The logistic head's out-of-fold ROC-AUC (%) and Brier on validation, means over the repeats."""
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold

    names = tuple(f"x{i}" for i in range(x.shape[1]))
    aucs, briers = [], []
    for repeat in range(REPEATS):
        p = np.zeros(len(is_new))
        for fit, held in StratifiedKFold(FOLDS, shuffle=True, random_state=repeat).split(x, is_new):
            p[held] = NewPlaceHead.fit(x[fit], is_new[fit], names=names).predict(x[held])
        aucs.append(100 * roc_auc_score(is_new, p))
        briers.append(float(np.mean((p - is_new) ** 2)))
    return {"auc": round(float(np.mean(aucs)), 2), "brier": round(float(np.mean(briers)), 4)}


def one_seed(data: RoutineData, val, extended: tuple[Routine, np.ndarray], seed: int) -> dict:
    ranker = data.fit("ranker", seed)
    log_p = data.log_probabilities(ranker, "val")
    split = score_split(
        lambda b: torch.from_numpy(log_p[b.index.cpu().numpy()]), val, explore=data.candidates["val"].explore
    )
    share = unseen_return_share(ranker, *extended, val.table.column("staypoint_id").to_numpy())
    is_new = val.target_np == UNSEEN
    x = split.features
    squares = ((x - x.mean(axis=0)) / np.where(x.std(axis=0) > 1e-12, x.std(axis=0), 1.0)) ** 2
    return {
        "head (the ranker's features)": cross_validated(x, is_new),
        "head + unseen_return_share": cross_validated(np.column_stack([x, share]), is_new),
        "head + squares": cross_validated(np.column_stack([x, squares]), is_new),
        "head + squares + unseen_return_share": cross_validated(np.column_stack([x, squares, share]), is_new),
        "mean share, new targets": round(float(share[is_new].mean()), 3),
        "mean share, other targets": round(float(share[~is_new].mean()), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data/geolife"))
    parser.add_argument("--seeds", default="0")
    args = parser.parse_args()
    meta, splits, data = routine_data(args.data_dir)
    extended = extended_routine(
        pd.read_parquet(args.data_dir / "staypoints.parquet"),
        pd.read_parquet(args.data_dir / "vocabulary" / "locations.parquet"),
        meta["total_loc_num"],
        PreprocessConfig.model_validate(meta["config"]).timezone,
    )
    seeds = {int(s): one_seed(data, splits["val"], extended, int(s)) for s in args.seeds.split(",")}
    print(json.dumps({"folds": FOLDS, "repeats": REPEATS, "seeds": seeds}, indent=2))


if __name__ == "__main__":
    main()
