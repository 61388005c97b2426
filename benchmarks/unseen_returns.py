"""What the new-place head gains from the ranker's view of the unseen places the user already visited (issue 34)

A target outside the train vocabulary (class ``1``, "a new place") is often a *return*: a place first visited
after the train period and visited again (27% of validation's new targets, 38% of test's). The routine
counts every such place as the one encoded place ``1``; :mod:`nextloc.routine.unseen` gives each its own id,
the ranker (fit on train, trees chosen on validation, as the ``ranker`` kind) scores them beside the known
candidates, and ``unseen_return_share`` is the share of its calibrated softmax that falls on them
(:meth:`~nextloc.routine.data.RoutineData.explore`).

The head is the product's :class:`~nextloc.routine.novelty.NewPlaceHead` over the ranker's inputs, without
and with that column, linear (the product's) and quadratic (each input and its standardised square), compared by 5-fold cross-validation on validation (stratified,
3 repeats): ROC-AUC and Brier of the out-of-fold probabilities. Test is never read.

    python benchmarks/unseen_returns.py --data-dir data/geolife --seeds 0,1,2,3,4 > unseen_returns.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from cross_fit import routine_data

from nextloc.evaluation.evaluate import score_split
from nextloc.models.batch import SampleTensors
from nextloc.preprocessing.sequences import UNSEEN
from nextloc.routine.data import RoutineData
from nextloc.routine.novelty import NewPlaceHead

FOLDS, REPEATS = 5, 3


def _with_squares(x: np.ndarray, fit: np.ndarray) -> np.ndarray:
    """``x`` and the squares of its columns standardised by the rows ``fit`` (a quadratic head's inputs)."""
    scale = x[fit].std(axis=0)
    return np.column_stack([x, ((x - x[fit].mean(axis=0)) / np.where(scale > 1e-12, scale, 1.0)) ** 2])


def cross_validated(x: np.ndarray, is_new: np.ndarray, quadratic: bool) -> dict[str, float]:
    """The head's out-of-fold ROC-AUC (%) and Brier on validation, means over the repeats."""
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold

    names = tuple(f"x{i}" for i in range(2 * x.shape[1]))
    aucs, briers = [], []
    for repeat in range(REPEATS):
        p = np.zeros(len(is_new))
        for fit, held in StratifiedKFold(FOLDS, shuffle=True, random_state=repeat).split(x, is_new):
            inputs = _with_squares(x, fit) if quadratic else x
            p[held] = NewPlaceHead.fit(inputs[fit], is_new[fit], names=names[: inputs.shape[1]]).predict(
                inputs[held]
            )
        aucs.append(100 * roc_auc_score(is_new, p))
        briers.append(float(np.mean((p - is_new) ** 2)))
    return {"auc": round(float(np.mean(aucs)), 2), "brier": round(float(np.mean(briers)), 4)}


def one_seed(data: RoutineData, val: SampleTensors, seed: int) -> dict:
    ranker = data.fit("ranker", seed)
    log_p = data.log_probabilities(ranker, "val")
    explore = data.explore(ranker, "val")  # the routine's explore features, then unseen_return_share
    split = score_split(lambda b: torch.from_numpy(log_p[b.index.cpu().numpy()]), val, explore=explore)
    x, share = split.features[:, :-1], split.features[:, -1]
    is_new = val.target_np == UNSEEN
    report = {
        f"head{' + unseen_return_share' if with_share else ''}{' (quadratic)' if quadratic else ''}": (
            cross_validated(split.features if with_share else x, is_new, quadratic)
        )
        for quadratic in (False, True)
        for with_share in (False, True)
    }
    report["mean share, new targets"] = round(float(share[is_new].mean()), 3)
    report["mean share, other targets"] = round(float(share[~is_new].mean()), 3)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data/geolife"))
    parser.add_argument("--seeds", default="0")
    args = parser.parse_args()
    _, splits, data = routine_data(args.data_dir)
    seeds = {int(s): one_seed(data, splits["val"], int(s)) for s in args.seeds.split(",")}
    print(json.dumps({"folds": FOLDS, "repeats": REPEATS, "seeds": seeds}, indent=2))


if __name__ == "__main__":
    main()
