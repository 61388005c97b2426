"""Do more routine features move the ranker? (issue 34: the place targets need the 7-day window's targets
ranked better)

Each group of features is computed before ``now`` from the visit log (nothing after the question, never the
target's time) and appended to :data:`~nextloc.routine.features.CANDIDATE_FEATURES`; the ranker (its
LambdaRank, trees chosen on validation by early stopping) is fit on train for each seed. The report is
validation only: place Acc@1 of the top candidate and candidate MRR (test is never read).

* ``decay``: the user's visits to the place weighted ``exp(-age / tau)``, tau 1, 3, 14 and 60 days;
* ``same_time_before``: whether the place is where the user went next after this time of day yesterday,
  and after this time a week ago;
* ``last_moves``: whether the place is where the user went the last and the second-last time they left
  the current place;
* ``usual_dwell``: log1p of the user's mean minutes at the current place (beside the minutes there now);
* ``windows``: visits to the place in the last 1, 3 and 30 days (beside the 7-day window's).

    python benchmarks/ranker_features.py --data-dir data/geolife --seeds 0,1 > ranker_features.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from cross_fit import ranker_on_val, routine_data

from nextloc.routine.features import Routine
from nextloc.routine.ranking import CandidateSet
from nextloc.routine.visits import MINUTES_PER_DAY, Queries, queries_for_targets

Feature = Callable[[Routine, Queries, np.ndarray, np.ndarray], np.ndarray]  # (routine, queries, q, place)


def _latest_before(keys: np.ndarray, times: np.ndarray, key: np.ndarray, now: np.ndarray, back: int = 1):
    """Index of the ``back``-th latest event of ``key`` before ``now`` in events sorted by (key, time), and
    whether there is one."""
    at = np.searchsorted(keys.astype(np.float64) * 1e10 + times, key.astype(np.float64) * 1e10 + now) - back
    safe = np.maximum(at, 0)
    return safe, (at >= 0) & (keys[safe] == key)


def decayed(tau_days: float) -> Feature:
    def feature(routine: Routine, queries: Queries, q: np.ndarray, place: np.ndarray) -> np.ndarray:
        log, tau = routine.log, tau_days * MINUTES_PER_DAY
        keys = log.user * routine.num_places + log.place
        order = np.lexsort((log.start, keys))
        keys, times = keys[order], log.start[order].astype(np.float64)
        weight = np.ones(len(keys))  # sum of exp(-(t_i - t_j) / tau) over the key's visits j <= i
        for i in range(1, len(keys)):
            if keys[i] == keys[i - 1]:
                weight[i] += weight[i - 1] * np.exp(-(times[i] - times[i - 1]) / tau)
        now = queries.now[q].astype(np.float64)
        last, ok = _latest_before(keys, times, queries.user[q] * routine.num_places + place, now)
        return np.where(ok, weight[last] * np.exp(-(now - times[last]) / tau), 0.0)

    return feature


def next_after(lag_days: float) -> Feature:
    def feature(routine: Routine, queries: Queries, q: np.ndarray, place: np.ndarray) -> np.ndarray:
        log, now = routine.log, queries.now[q]
        after = now - int(lag_days * MINUTES_PER_DAY)
        first = np.searchsorted(log.user * 1e10 + log.start, queries.user[q] * 1e10 + after)
        first = np.minimum(first, len(log) - 1)
        went = (log.user[first] == queries.user[q]) & (log.start[first] < now) & (log.place[first] == place)
        return went.astype(np.float64)

    return feature


def last_move(back: int) -> Feature:
    def feature(routine: Routine, queries: Queries, q: np.ndarray, place: np.ndarray) -> np.ndarray:
        log, size = routine.log, routine.num_places
        move = np.flatnonzero(log.user[1:] == log.user[:-1]) + 1
        keys = log.user[move] * size + log.place[move - 1]
        order = np.lexsort((log.start[move], keys))
        keys, times, to = keys[order], log.start[move][order].astype(np.float64), log.place[move][order]
        at, ok = _latest_before(
            keys, times, queries.user[q] * size + queries.current[q], queries.now[q], back
        )
        return (ok & (to[at] == place)).astype(np.float64)

    return feature


def usual_dwell(routine: Routine, queries: Queries, q: np.ndarray, place: np.ndarray) -> np.ndarray:
    u, now, current = queries.user[q], queries.now[q], queries.current[q]
    visits = routine.count("place", now, u=u, p=current)
    total = routine.counts["place"].total(routine.key("place", u=u, p=current), now, None)
    return np.log1p(np.divide(total, visits, out=np.zeros(len(visits)), where=visits > 0))


def visits_within(days: float) -> Feature:
    def feature(routine: Routine, queries: Queries, q: np.ndarray, place: np.ndarray) -> np.ndarray:
        u, now = queries.user[q], queries.now[q]
        since = now - int(days * MINUTES_PER_DAY)
        return routine.count("place", now, u=u, p=place) - routine.count("place", since, u=u, p=place)

    return feature


GROUPS: dict[str, tuple[Feature, ...]] = {
    "decay": tuple(decayed(d) for d in (1, 3, 14, 60)),
    "same_time_before": (next_after(1), next_after(7)),
    "last_moves": (last_move(1), last_move(2)),
    "usual_dwell": (usual_dwell,),
    "windows": tuple(visits_within(d) for d in (1, 3, 30)),
}


def with_features(candidates: CandidateSet, routine: Routine, queries: Queries, group) -> CandidateSet:
    q, place = candidates.query, candidates.place
    extra = np.column_stack([f(routine, queries, q, place) for f in group])
    features = np.hstack([candidates.features, extra])
    return CandidateSet(q, place, features, candidates.explore, candidates.n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data/geolife"))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--groups", default=",".join(GROUPS), help="comma-separated: " + ", ".join(GROUPS))
    args = parser.parse_args()
    _, splits, data = routine_data(args.data_dir)
    routine, seeds = data.routine, [int(s) for s in args.seeds.split(",")]
    queries = {
        s: queries_for_targets(routine.log, splits[s].table.column("staypoint_id").to_numpy()) for s in splits
    }
    targets = data.targets["train"], data.targets["val"]
    chosen = {name: GROUPS[name] for name in args.groups.split(",")}
    groups = {"routine features only (the ranker)": (), **chosen}
    if len(chosen) > 1:
        groups["all of them"] = sum(chosen.values(), ())
    report = {}
    for name, group in groups.items():
        train, val = (
            with_features(data.candidates[s], routine, queries[s], group) if group else data.candidates[s]
            for s in ("train", "val")
        )
        runs = {seed: ranker_on_val(train, targets[0], val, targets[1], seed) for seed in seeds}
        mean = {k: round(float(np.mean([r[k] for r in runs.values()])), 2) for k in runs[seeds[0]]}
        report[name] = {"seeds": runs, "mean": mean}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
