"""The one champion rule behind the ``champion`` alias, for every model kind (baselines included).

The decision reads validation only: test is computed, logged and reported by every run, never read here.
The challenger is this run's model kind: its registered version is the seed best on a validation metric
(``promote_metric``), and its evidence is every seed trained, averaged sample by sample on the validation
split (each run's ``val_per_sample.parquet``: the outcomes of its model chosen on validation; for a kind
refit on train + val, the model before the refit). The champion is the version holding the ``champion``
alias, scored on the same validation samples:

* trained on this dataset: its run's own logged validation outcomes (the same samples, the same model the
  challenger's evidence comes from); a run that logged none has its registered model scored on them.
* trained on earlier data (a retraining): its registered model scored on today's validation samples
  translated into its own location and user ids (``nextloc.preprocessing.vocabulary``; locations it never saw
  are new to it, like any unseen location). The split is per user by day, ``train < 0.6 * last day <= val``
  (:func:`nextloc.preprocessing.sequences.assign_split`): when a user's new data comes after their earlier
  data (what a dump of new trajectories adds), the user's validation days all lie at or after the end of
  the days the champion trained on, so it has trained on none of today's validation targets; it may have
  chosen its epoch and fit its new-place head on some of them (its own validation days), as the challenger
  did on all. A dump that adds days *before* a user's earlier data shifts that user's days, and some of
  today's validation days may then be among the champion's training days, which favours the champion: the
  alias then moves less easily. The per-group differences below say which users the difference comes from.
  Validation rather than a forward holdout of the newest days: under the per-user day split the newest
  days are test's, and a holdout carved from them would read test or change the reference splits.

The alias moves only if the challenger is better by at least ``min_effect`` points of the decision metric (a
place metric by default) *and* a paired bootstrap over the samples gives ``p < alpha``
(:func:`nextloc.evaluation.champion.champion_decision`). The bootstrap, the p-value, the per-user-group
differences (users whose data changed since the champion was trained, unchanged users, new users) and the
decision are recorded on the MLflow parent run, the challenger's run and the challenger's registry version
(:func:`tracking.versions.record_decision`). A new champion's run also gets its answers for a few test users
drawn on maps (``maps/<user_id>.png`` and ``.html``, :func:`tracking.registered.champion_maps`), after the
decision.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from prefect import get_run_logger, task
from pydantic import BaseModel, ConfigDict, Field

from nextloc.config import DEFAULT_MATCH_RADIUS_M
from nextloc.evaluation.champion import champion_decision
from nextloc.evaluation.leaderboard import decision_text
from nextloc.evaluation.metrics import PLACE_KEYS, REFERENCE_KEYS
from nextloc.preprocessing.vocabulary import translate_samples, user_data_groups
from runtime.caching import CACHE_POLICY
from runtime.catalog import Catalog
from runtime.locking import registry_lock
from runtime.reuse import call_cached
from tasks.train import DataRef, TrackingConfig
from tracking import mlflow_runs
from tracking.mlflow_runs import selected_name
from tracking.versions import Holder, champion_holder, move_champion, record_decision

# validation metrics of the selected model that choose a kind's version among seeds (MLflow name -> key in
# results.json's ``val``); per-sample validation metrics that decide
PROMOTE_KEYS = {selected_name(key): key for key in (*PLACE_KEYS, *REFERENCE_KEYS)}
PROMOTE_METRICS = tuple(PROMOTE_KEYS)
DECISION_METRICS = tuple(key for key in (*PLACE_KEYS, *REFERENCE_KEYS) if not key.endswith("f1"))
PromoteMetric = Literal[PROMOTE_METRICS]  # type: ignore[valid-type]
DecisionMetric = Literal[DECISION_METRICS]  # type: ignore[valid-type]
DEFAULT_PROMOTE_METRIC = selected_name("place_mrr")
DEFAULT_DECISION_METRIC = "place_mrr"
DEFAULT_MIN_EFFECT = 0.5  # points of the decision metric
DEFAULT_ALPHA = 0.05
DECISION_SPLIT = "val"  # the split whose samples decide; test is never read here
OUTCOMES = f"{DECISION_SPLIT}_per_sample.parquet"  # every trained run's outcomes on it (tasks/train.py)


class PromotionRule(BaseModel):
    """The one champion rule's settings (see the module docstring), checked when made: an unknown metric, a
    negative effect or a radius that is not positive is refused before any work.

    Attributes:
        promote_metric: the validation metric that chooses a kind's version among its seeds.
        decision_metric: the per-sample validation metric the challenger must beat the champion on.
        min_effect: points of ``decision_metric`` the challenger must gain.
        match_radius_m: a champion trained on earlier data reads today's validation places within this
            radius of its own as its own.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    promote_metric: PromoteMetric = DEFAULT_PROMOTE_METRIC
    decision_metric: DecisionMetric = DEFAULT_DECISION_METRIC
    min_effect: Annotated[float, Field(ge=0)] = DEFAULT_MIN_EFFECT
    match_radius_m: Annotated[float, Field(gt=0)] = DEFAULT_MATCH_RADIUS_M


@task(name="champion-challenger", task_run_name="champion vs challenger: {kind}")
def champion_challenger(
    kind: str,
    runs: list[dict[str, Any]],
    data: DataRef,
    rule: PromotionRule,
    tracking_cfg: TrackingConfig,
    parent_run_id: str,
    alpha: float = DEFAULT_ALPHA,
) -> dict[str, Any]:
    """Decide whether this run's ``kind`` replaces the ``champion`` by ``rule`` (see the module docstring).

    Returns:
        The decision: ``promoted`` (bool), ``reason``, both versions and scores, and with a champion the
        paired test's ``delta``, ``ci_low``, ``ci_high``, ``p_value`` and per-group ``groups``.
    """
    decision_metric, promote_metric, min_effect = rule.decision_metric, rule.promote_metric, rule.min_effect
    logger = get_run_logger()
    mlflow_runs.configure(tracking_cfg.tracking_uri, tracking_cfg.experiment)
    mine = [r for r in runs if r["kind"] == kind and r["results"].get("registered_version")]
    if not mine:
        return {"promoted": False, "reason": f"no registered {kind} version in this run"}
    challenger = _best_on_validation(mine, promote_metric)
    outcomes = _outcomes(Catalog(data.data_dir), kind, mine, decision_metric)  # (seeds, val samples)
    head = {
        "metric": f"{DECISION_SPLIT} {decision_metric}",
        "selected_on": promote_metric,
        "challenger_version": str(challenger["results"]["registered_version"]),
        "challenger_run_id": challenger["run_id"],
        "challenger_seed": challenger["seed"],
        "seeds": sorted(r["seed"] for r in mine),
    }
    # one run at a time reads the champion, scores it and moves the alias, on every machine
    with registry_lock():
        champion = champion_holder(kind)
        if champion is None:
            decision = {**head, **champion_decision(outcomes, None)}
        elif champion.version == head["challenger_version"]:
            reason = "the challenger already is the champion (cached)"
            decision = {**head, "champion_version": champion.version, "promoted": False, "reason": reason}
        else:
            head.update(champion_version=champion.version, champion_run_id=champion.run_id)
            scored = _score_cached(kind, champion, data, decision_metric, rule.match_radius_m, tracking_cfg)
            head.update(scored["how"])
            if scored["outcomes"] is None:
                decision = {
                    **head,
                    "promoted": True,
                    "reason": f"the champion cannot be scored: {scored['why']}",
                }
            else:
                verdict = champion_decision(outcomes, scored["outcomes"], scored["groups"], min_effect, alpha)
                decision = {**head, **verdict}
        if decision["promoted"]:
            move_champion(kind, decision["challenger_version"])
        name = mlflow_runs.registered_name(kind)
        decision["decision"] = decision_text(name, decision)  # the one sentence every surface shows
        record_decision(parent_run_id, kind, decision)
    logger.info("%s: %s -> %s", name, decision["reason"], "promoted" if decision["promoted"] else "kept")
    if decision["promoted"]:
        _draw_champion(kind, decision["challenger_version"], challenger["run_id"], data, tracking_cfg)
    return decision


def _draw_champion(kind: str, version: str, run_id: str, data: DataRef, tracking_cfg: TrackingConfig) -> None:
    """The new champion's maps on its run (:func:`tracking.registered.champion_maps`), after the decision is
    recorded: a map that cannot be drawn is a warning, never an undone or unrecorded promotion."""
    from tracking.registered import champion_maps  # torch: only when a new champion is drawn

    logger = get_run_logger()
    try:
        maps = champion_maps(
            kind, version, run_id, Path(data.data_dir), tracking_cfg.tracking_uri, tracking_cfg.experiment
        )
    except Exception as err:  # the drawing is an illustration: it must not fail the training flow
        logger.warning("%s v%s: no maps of its answers (%s: %s)", kind, version, type(err).__name__, err)
        return
    logger.info("%s v%s: its run has %s", kind, version, ", ".join(maps) or "no map (no test user to draw)")


def _best_on_validation(runs: list[dict[str, Any]], promote_metric: str) -> dict[str, Any]:
    """The run whose selected model is best on ``promote_metric`` (a tie goes to the lower seed)."""
    key = PROMOTE_KEYS[promote_metric]
    return max(runs, key=lambda r: (r["results"]["val"].get(key, float("-inf")), -r["seed"]))


def _outcomes(catalog: Catalog, kind: str, runs: list[dict[str, Any]], metric: str) -> np.ndarray:
    """The per-sample validation ``metric`` of every seed of ``kind`` (split order): one row per run."""
    return np.stack([_split_order(catalog.run_dir(kind, r["seed"]) / OUTCOMES)[metric] for r in runs])


def _split_order(path: Path) -> pd.DataFrame:
    """A per-sample outcomes file, sorted by split row."""
    return pd.read_parquet(path).sort_values("index", kind="stable").reset_index(drop=True)


def _score_cached(
    kind: str, champion: Holder, data: DataRef, metric: str, radius_m: float, tracking_cfg: TrackingConfig
) -> dict[str, Any]:
    """:func:`score_champion`, cached per champion version and validation split: a rerun, or a challenger
    that lost, loads no model."""
    scorer = score_champion.with_options(result_storage=Catalog(data.data_dir).cache)
    return call_cached(scorer, kind, champion.version, champion.run_id, data, metric, radius_m, tracking_cfg)


@task(
    name="score-champion",
    task_run_name="score champion: {kind} v{version}",
    cache_policy=CACHE_POLICY,
    persist_result=True,
)
def score_champion(
    kind: str,
    version: str,
    run_id: str,
    data: DataRef,
    metric: str,
    radius_m: float,
    tracking_cfg: TrackingConfig,
) -> dict[str, Any]:
    """The champion's per-sample ``metric`` on the current validation split, the user group of every sample,
    and how the samples were read (``outcomes`` None with ``why`` when it cannot be scored).

    On the same dataset, the champion's evidence is what its own run logged (``val_per_sample.parquet``: the
    outcomes of its model chosen on validation, as the challenger's are), else its registered model scored
    on validation; on earlier data, its registered model scored on validation translated into its ids.
    Cached on the version, its run, the samples' fingerprints, the metric, the radius and the code.
    """
    tags = mlflow_runs.run_tags(run_id)
    catalog = Catalog(data.data_dir)
    same_dataset = tags.get("data_fingerprint") == data.fingerprint
    with tempfile.TemporaryDirectory() as tmp:
        if same_dataset:
            logged = _logged_outcomes(run_id, Path(tmp))
            if logged is not None:
                how = {"champion_scored_on": "its run's own validation outcomes (same dataset, same samples)"}
                groups = np.full(len(logged), "unchanged", dtype=object)
                return {"outcomes": logged[metric].to_numpy(), "groups": groups, "how": how}
        try:
            folder = mlflow_runs.download_run_artifacts(run_id, "vocabulary", Path(tmp))
            users_then = pd.read_parquet(folder / "users.parquet")
            locations_then = pd.read_parquet(folder / "locations.parquet")
        except OSError as err:  # no vocabulary artifact (mlflow_runs.download_run_artifacts)
            return {
                "outcomes": None,
                "groups": None,
                "how": {},
                "why": f"no vocabulary ({type(err).__name__})",
            }
    table = pq.read_table(catalog.samples(DECISION_SPLIT))
    users_now = pd.read_parquet(catalog.vocabulary("users"))
    if same_dataset:
        how = {
            "champion_scored_on": "the same validation split (same dataset; its run logged no validation "
            "outcomes: its registered model scored, which for a refit on train + val has trained on them)"
        }
        groups_by_user = {int(u): "unchanged" for u in users_now["user_id"]}
    else:
        table, stats = translate_samples(
            table,
            pd.read_parquet(catalog.vocabulary("locations")),
            locations_then,
            users_now,
            users_then,
            radius_m,
        )
        how = {
            "champion_scored_on": "the validation split translated into its ids "
            f"(locations matched within {radius_m:g} m)",
            **{f"translation.{k}": round(v, 2) for k, v in stats.items()},
        }
        groups_by_user = user_data_groups(users_now, users_then)
    return _score_registered(
        kind, version, data, table, same_dataset, metric, groups_by_user, how, tracking_cfg
    )


def _logged_outcomes(run_id: str, folder: Path) -> pd.DataFrame | None:
    """The run's logged ``val_per_sample.parquet`` (split order), or None when it logged none."""
    try:
        path = mlflow_runs.download_run_artifacts(run_id, OUTCOMES, folder)
    except OSError:  # a run from before validation's outcomes were logged
        return None
    return _split_order(path)


def _score_registered(
    kind: str,
    version: str,
    data: DataRef,
    table: pa.Table,
    same_dataset: bool,
    metric: str,
    groups_by_user: dict[int, str],
    how: dict[str, Any],
    tracking_cfg: TrackingConfig,
) -> dict[str, Any]:
    """The registered champion's per-sample ``metric`` on ``table`` (validation, in its ids) and each
    sample's user group (:func:`score_champion`'s answer)."""
    # torch: only when a champion is scored (a cached run reads the score back)
    from nextloc.evaluation.evaluate import score_split
    from nextloc.models.batch import SampleTensors
    from nextloc.models.packed import pack_batch
    from tracking.registered import load_registered, registered_scores

    bundle = load_registered(kind, version, tracking_cfg.tracking_uri, tracking_cfg.experiment)
    samples = SampleTensors(table)
    if bundle.routine is not None:
        if not same_dataset:
            why = "a routine kind reads the whole past in its own place ids, which another dataset does not have"
            return {"outcomes": None, "groups": None, "how": how, "why": why}
        scores, _, _ = registered_scores(bundle, Path(data.data_dir), DECISION_SPLIT)
    else:
        scores = lambda batch: bundle.scorer(pack_batch(batch))  # noqa: E731
    per_sample = score_split(scores, samples).accumulator.per_sample()
    groups = np.array([groups_by_user.get(int(u), "new_user") for u in samples.user_id_np], dtype=object)
    return {"outcomes": per_sample[metric].to_numpy(), "groups": groups[per_sample["index"]], "how": how}
