"""Nothing after now, end to end: a question's routine inputs from :meth:`RoutineData.build` on every
staypoint equal those of a build on the staypoints that started before the question's now.

Used by ``tests/nextloc/routine/test_data.py`` (a synthetic dataset) and ``tests/test_full_data.py`` (GeoLife).
In the second build the target stays (a question is asked of its target's staypoint id) but is poisoned:
another place, far away, a day longer; everything after now is gone. Compared, bit for bit: the candidate
places and every candidate feature, the explore features, ``unseen_return_share`` (a scorer that reads
``log_km``; with and without the DBSCAN effect's rule), the unseen places' candidate features (matched by
their raw place id: their extended ids depend on which unseen places exist) and the window the new-place
head reads.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa

from nextloc.routine.data import MIN_PAST_VISITS, RoutineData
from nextloc.routine.ranking import CandidateSet, RoutineRule
from nextloc.routine.visits import wall_minutes


class DistanceRule(RoutineRule):
    """The routine rule, minus the distance from the current place: a scorer that reads ``log_km``."""

    def scores(self, candidates: CandidateSet) -> np.ndarray:
        return super().scores(candidates) - 2.0 * np.nan_to_num(candidates.column("log_km"), nan=5.0)


def one_split(ids: np.ndarray, targets: np.ndarray) -> SimpleNamespace:
    """What :meth:`RoutineData.build` reads of a split's samples."""
    return SimpleNamespace(table=pa.table({"staypoint_id": np.asarray(ids, np.int64)}), target_np=targets)


def question_inputs(data: RoutineData, split: str, i: int) -> dict[str, np.ndarray]:
    """Everything question ``i`` of ``split`` reads, keyed so that two builds compare."""
    scorer = DistanceRule()
    candidates, unseen = data.candidates[split], data.unseen[split]
    rows, unseen_rows = candidates.query == i, unseen.query == i
    log = data.unseen_places.log
    raw_of = dict(zip(log.place.tolist(), log.raw_place.tolist(), strict=False))
    extended = unseen.place[unseen_rows]
    raw = np.array([raw_of[p] if p >= data.unseen_places.num_places else -p for p in extended])
    order = np.argsort(raw, kind="stable")
    window = data.windows[split][i]
    return {
        "place": candidates.place[rows],
        "features": candidates.features[rows],
        "explore": data.explore(scorer, split)[i],
        "explore_past_places": data.explore(scorer, split, min_past_visits=MIN_PAST_VISITS)[i],
        "unseen_raw": raw[order],
        "unseen_features": unseen.features[unseen_rows][order],
        "window": window[window > 0],
    }


def causal_mismatches(
    staypoints: pd.DataFrame,
    locations: pd.DataFrame,
    samples: dict[str, pa.Table],
    num_places: int,
    timezone: str,
    picks: list[tuple[str, int]],
    located: pd.DataFrame | None = None,
) -> list[str]:
    """The inputs of the picked questions (``(split, row)``) that differ between the two builds (with
    ``located``, the located staypoints give the centres: those that started before now in the second)."""
    splits = {
        s: one_split(t.column("staypoint_id"), t.column("target_loc").to_numpy()) for s, t in samples.items()
    }
    whole = RoutineData.build(staypoints, locations, splits, num_places, timezone, located=located)
    started = wall_minutes(staypoints["started_at"], timezone)
    located_started = None if located is None else wall_minutes(located["started_at"], timezone)
    wrong = []
    for split, i in picks:
        target = int(samples[split].column("staypoint_id")[i].as_py())
        now = int(whole.queries[split].now[i])
        past = staypoints[(started < now) | (staypoints["id"].to_numpy() == target)].copy()
        poisoned = past["id"].to_numpy() == target
        past.loc[poisoned, ["latitude", "longitude"]] += 1.0
        past.loc[poisoned, "location_id"] = 1
        past.loc[poisoned, "raw_location_id"] = int(staypoints["raw_location_id"].max()) + 1
        past.loc[poisoned, "finished_at"] += pd.Timedelta(days=1)
        alone = {split: one_split([target], samples[split].column("target_loc").to_numpy()[[i]])}
        located_past = None if located is None else located[located_started < now]
        part = RoutineData.build(past, locations, alone, num_places, timezone, located=located_past)
        expected, got = question_inputs(whole, split, i), question_inputs(part, split, 0)
        for name, value in expected.items():
            floats = np.asarray(value).dtype.kind == "f"
            if not np.array_equal(value, got[name], equal_nan=floats):
                wrong.append(f"{split} question {i} (staypoint {target}): {name}")
    return wrong
