"""Nothing after now, end to end, for the routine kinds and for the samples every other kind reads.

:func:`causal_mismatches`: a question's routine inputs from :meth:`RoutineData.build` on every staypoint
equal those of a build on the staypoints that started before the question's now. Used by
``tests/nextloc/routine/test_data.py`` (a synthetic dataset) and ``tests/test_full_data.py`` (GeoLife).
In the second build the target stays (a question is asked of its target's staypoint id) but is poisoned:
another place, far away, starting a day later (when it starts after the visit before it ended) and
ending two days later; everything after now is gone. Compared, bit for bit: now itself (which must also
be the end of the visit before the target), the candidate places and every candidate feature, the explore
features, ``unseen_return_share`` (a scorer that reads ``log_km``; with and without the DBSCAN effect's
rule), the unseen places' candidate features (matched by their raw place id: their extended ids depend on
which unseen places exist) and the window the new-place head reads.

:func:`sample_mismatches`: a sample's inputs (every history list, its length, its user) equal those of the
samples rebuilt from the user's final staypoints that started before now plus the poisoned target. The
deployment protocol passes it; the reference's ``diff_hist`` counts from the target's day and does not.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa

from nextloc.config import PreprocessConfig
from nextloc.preprocessing.sequences import build_samples, valid_targets
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
    candidates = data.candidates[split]
    rows = candidates.query == i
    fitted_on = {"place": candidates.place[rows], "features": candidates.features[rows]}
    if split not in data.unseen:  # train: only its candidates are built (the ranker is fit on them)
        return fitted_on
    scorer = DistanceRule()
    unseen = data.unseen[split]
    unseen_rows = unseen.query == i
    log = data.unseen_places.log
    raw_of = dict(zip(log.place.tolist(), log.raw_place.tolist(), strict=False))
    extended = unseen.place[unseen_rows]
    raw = np.array([raw_of[p] if p >= data.unseen_places.num_places else -p for p in extended])
    order = np.argsort(raw, kind="stable")
    window = data.windows[split][i]
    return {
        **fitted_on,
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
        if now != leaving_time(staypoints, target, timezone):
            wrong.append(f"{split} question {i} (staypoint {target}): now")
        past = poisoned_past(staypoints, target, started < now)
        alone = {split: one_split([target], samples[split].column("target_loc").to_numpy()[[i]])}
        located_past = None if located is None else located[located_started < now]
        part = RoutineData.build(past, locations, alone, num_places, timezone, located=located_past)
        expected, got = question_inputs(whole, split, i), question_inputs(part, split, 0)
        for name, value in expected.items():
            floats = np.asarray(value).dtype.kind == "f"
            if not np.array_equal(value, got[name], equal_nan=floats):
                wrong.append(f"{split} question {i} (staypoint {target}): {name}")
    return wrong


def leaving_time(staypoints: pd.DataFrame, target: int, timezone: str) -> int:
    """Now, as the question of ``target`` must have it: the end of the user's visit before it (wall-clock
    minutes; when that visit was logged as ending after the target started, the target's start)."""
    row = int(np.flatnonzero(staypoints["id"].to_numpy() == target)[0])
    end = wall_minutes(staypoints["finished_at"].iloc[[row - 1]], timezone)[0]
    return int(min(end, wall_minutes(staypoints["started_at"].iloc[[row]], timezone)[0]))


def poisoned_past(staypoints: pd.DataFrame, target: int, before_now: np.ndarray) -> pd.DataFrame:
    """The staypoints that started before now, and the target, poisoned: another place far away, a day
    later (unless it started before the previous visit ended: then its start is now), two days longer."""
    is_target = staypoints["id"].to_numpy() == target
    past = staypoints[before_now | is_target].copy()
    poisoned = past["id"].to_numpy() == target
    row = int(np.flatnonzero(poisoned)[0])
    past.loc[poisoned, ["latitude", "longitude"]] += 1.0
    past.loc[poisoned, "location_id"] = 1
    past.loc[poisoned, "raw_location_id"] = int(staypoints["raw_location_id"].max()) + 1
    if past["started_at"].iloc[row] >= past["finished_at"].iloc[row - 1]:
        past.loc[poisoned, "started_at"] += pd.Timedelta(days=1)
    past.loc[poisoned, "finished_at"] += pd.Timedelta(days=3)
    return past


SAMPLE_INPUTS = (
    "user",
    "loc_hist",
    "user_hist",
    "weekday_hist",
    "start_min_hist",
    "duration_hist",
    "diff_hist",
)


def sample_mismatches(
    staypoints: pd.DataFrame,
    samples: dict[str, pa.Table],
    config: PreprocessConfig,
    picks: list[tuple[str, int]],
) -> list[str]:
    """The inputs of the picked samples (``(split, row)``) that differ from those of the samples rebuilt
    (:func:`nextloc.preprocessing.sequences.build_samples`, ``config.protocol``) from the user's final
    staypoints (``staypoints.parquet``'s columns) that started before now, the target poisoned (another
    place, a day later, two days longer): a missing question is a mismatch too."""
    wrong = []
    for split, i in picks:
        target = int(samples[split].column("staypoint_id")[i].as_py())
        user = staypoints.loc[staypoints["id"] == target, "user_id"].iloc[0]
        mine = staypoints[staypoints["user_id"] == user].reset_index(drop=True)
        row = int(np.flatnonzero(mine["id"].to_numpy() == target)[0])
        now = mine["finished_at"].iloc[row - 1]
        past = mine[(mine["started_at"] < now).to_numpy() | (mine["id"] == target).to_numpy()].copy()
        poisoned = (past["id"] == target).to_numpy()
        past.loc[poisoned, "location_id"] = 1
        past.loc[poisoned, ["start_day", "weekday"]] += 1
        past.loc[poisoned, "end_day"] += 3
        past.loc[poisoned, "duration"] += 3 * 1440
        past["duration_capped"] = np.minimum(past["duration"], config.samples.duration_cap_min)
        valid = valid_targets(past, config.samples, config.protocol)
        rebuilt = build_samples(past, valid, config.samples.previous_days, config.protocol)[split]
        at = np.flatnonzero(rebuilt.column("staypoint_id").to_numpy() == target)
        if not len(at):
            wrong.append(f"{split} sample {i} (staypoint {target}): not a question")
            continue
        for name in SAMPLE_INPUTS:
            if samples[split].column(name)[i].as_py() != rebuilt.column(name)[int(at[0])].as_py():
                wrong.append(f"{split} sample {i} (staypoint {target}): {name}")
    return wrong
