"""Benchmark: a routine kind's evaluation per question, from sparse answers and from ``(B, V)`` ones, as the
number of places grows.

For each vocabulary size ``V`` (GeoLife has about 1,200 places; the synthetic 16x data 16,545), 2,048
questions with 20 candidates each and places' popularities drawn from a Zipf law (what fixes the tail's
levels), both paths read one batch of 512 answers as the evaluation does (``score_split``): the answers, the
new-place head's inputs, the one distribution with P(new place), its top answer and answer sets, and the
ranks of both families. ``dense``: :func:`nextloc.routine.ranking.log_probabilities` with ``rows`` and the
``(B, V)`` functions; ``sparse``: :class:`nextloc.routine.sparse.SparseAnswers`. Prints one JSON object: per
size, the milliseconds per question of each path (the best of ``--repeat``), the levels, and
``dense_over_sparse``::

    python benchmarks/sparse_answers.py --sizes 1000,4000,16000,64000
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from nextloc.evaluation.metrics import SET_LEVELS, SET_TOLERANCE, set_outcomes
from nextloc.evaluation.tensor_metrics import place_ranks, target_ranks
from nextloc.models.batch import Batch
from nextloc.routine.calibration import Calibration
from nextloc.routine.novelty import history_features, novelty_features, with_new_place
from nextloc.routine.ranking import CandidateSet, log_probabilities
from nextloc.routine.sparse import SparseAnswers, Tail

QUESTIONS, CANDIDATES, BATCH, HISTORY = 2048, 20, 512, 20


def problem(v: int, seed: int = 0) -> tuple[CandidateSet, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The questions (candidates, scores), the places' popularity, histories and targets for ``v`` places."""
    rng = np.random.default_rng(seed)
    query = np.repeat(np.arange(QUESTIONS), CANDIDATES)
    place = np.concatenate([rng.choice(np.arange(2, v), CANDIDATES, replace=False) for _ in range(QUESTIONS)])
    scores = rng.normal(size=len(query))
    popularity = np.minimum(rng.zipf(1.6, v), 10 * v).astype(np.float64)
    loc = rng.integers(2, v, (QUESTIONS, HISTORY))
    target = rng.integers(1, v, QUESTIONS)
    candidates = CandidateSet(query, place, np.zeros((len(query), 1)), np.zeros((QUESTIONS, 1)), QUESTIONS)
    return candidates, scores, popularity, loc, target


def dense_batch(candidates, scores, popularity, calibration, loc, target, rows) -> None:
    answer = torch.from_numpy(log_probabilities(candidates, scores, popularity, calibration, rows))
    t = torch.from_numpy(target[rows])
    batch = Batch(*(torch.from_numpy(loc[rows]) for _ in range(5)), t, t, t, torch.from_numpy(rows))
    features = novelty_features(answer, batch).numpy()
    one = with_new_place(answer.numpy(), 1 / (1 + np.exp(-features[:, 0])))
    (
        one.max(axis=1),
        one.argmax(axis=1),
        set_outcomes(np.exp(one.astype(np.float64)), target[rows], SET_LEVELS),
    )
    target_ranks(torch.from_numpy(one), t), place_ranks(torch.from_numpy(one), t)


def sparse_batch(candidates, scores, tail, calibration, loc, target, rows) -> None:
    picked = np.concatenate([np.flatnonzero(candidates.query == r) for r in rows])
    query = np.repeat(
        np.arange(len(rows)), np.bincount(candidates.query[picked] - rows[0], minlength=len(rows))
    )
    answer = SparseAnswers.of_candidates(
        tail, query, candidates.place[picked], scores[picked], len(rows), calibration
    )
    features = np.concatenate([answer.novelty_scores(loc[rows]), history_features(loc[rows])], axis=1)
    one = answer.with_new_place(1 / (1 + np.exp(-features[:, 0])))
    one.top(), one.set_outcomes(target[rows], SET_LEVELS, SET_TOLERANCE)
    one.ranks(target[rows]), one.top(), one.ranks(target[rows], 2), one.top(2)


def measure(v: int, repeat: int) -> dict:
    candidates, scores, popularity, loc, target = problem(v)
    calibration = Calibration(1.3, 0.08, 0.7)
    tail = Tail.of(popularity, calibration)
    batches = [np.arange(start, start + BATCH) for start in range(0, QUESTIONS, BATCH)]
    out = {"places": v, "levels": len(tail.share), "questions": QUESTIONS}
    for name, run, arg in (("dense", dense_batch, popularity), ("sparse", sparse_batch, tail)):
        best = float("inf")
        for _ in range(repeat):
            started = time.perf_counter()
            for rows in batches:
                run(candidates, scores, arg, calibration, loc, target, rows)
            best = min(best, time.perf_counter() - started)
        out[f"{name}_ms_per_question"] = round(1000 * best / QUESTIONS, 4)
    out["dense_over_sparse"] = round(out["dense_ms_per_question"] / out["sparse_ms_per_question"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,4000,16000,64000", help="comma list of place counts")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [measure(int(v), args.repeat) for v in args.sizes.split(",")]
    first = sizes[0]
    for row in sizes:
        for name in ("dense", "sparse"):
            key = f"{name}_ms_per_question"
            row[f"{name}_ratio_to_smallest"] = round(row[key] / first[key], 2)
    print(
        json.dumps(
            {"command": "python benchmarks/sparse_answers.py --sizes " + args.sizes, "sizes": sizes}, indent=1
        )
    )


if __name__ == "__main__":
    main()
