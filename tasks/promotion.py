"""The one champion rule behind the ``champion`` alias, for every model kind (baselines included).

The challenger is this run's model kind: its registered version is the seed best on a *validation* metric
(``promote_metric``), and its evidence is every seed trained, averaged sample by sample on the test split.
The champion is the version holding the ``champion`` alias, scored on the same test samples: a champion
trained on this dataset reads them as they are; one trained on earlier data reads them translated into its
own location and user ids (``nextloc.vocabulary``; locations it never saw are new to it, like any unseen
test location). The alias moves only if the challenger is better by at least ``min_effect`` points of the
decision metric (a place metric by default) *and* a paired bootstrap over the samples gives ``p < alpha``
(:func:`nextloc.evaluate.champion_decision`). The test, the p-value, the per-user-group differences (users
whose data changed since the champion was trained, unchanged users, new users) and the decision are
recorded on the MLflow parent run, the challenger's run and the challenger's registry version.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Literal

import mlflow
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from prefect import get_run_logger, task

from nextloc.data import SampleTensors
from nextloc.evaluate import champion_decision, pack_batch, score_split
from nextloc.leaderboard import decision_text
from nextloc.metrics import PLACE_KEYS, REFERENCE_KEYS
from nextloc.vocabulary import translate_samples, user_data_groups
from tasks import tracking
from tasks.caching import CACHE_POLICY, call_cached
from tasks.catalog import Catalog
from tasks.evaluate import load_registered, registered_scores
from tasks.tracking import mlflow_name, selected_name
from tasks.train import DataRef, TrackingConfig

# validation metrics of the selected model that choose a kind's version among seeds (MLflow name -> key in
# results.json's ``val``); per-sample test metrics that decide
SELECT_KEYS = {selected_name(key): key for key in (*PLACE_KEYS, *REFERENCE_KEYS)}
SELECT_METRICS = tuple(SELECT_KEYS)
DECISION_METRICS = tuple(key for key in (*PLACE_KEYS, *REFERENCE_KEYS) if not key.endswith("f1"))
SelectMetric = Literal[SELECT_METRICS]  # type: ignore[valid-type]
DecisionMetric = Literal[DECISION_METRICS]  # type: ignore[valid-type]
DEFAULT_PROMOTE_METRIC = selected_name("place_mrr")
DEFAULT_DECISION_METRIC = "place_mrr"
DEFAULT_MIN_EFFECT = 0.5  # points of the decision metric
DEFAULT_ALPHA = 0.05


@task(name="champion-challenger", task_run_name="champion vs challenger: {kind}")
def champion_challenger(
    kind: str,
    runs: list[dict[str, Any]],
    data: DataRef,
    decision_metric: str,
    select_metric: str,
    tracking_cfg: TrackingConfig,
    parent_run_id: str,
    match_radius_m: float = 50.0,
    min_effect: float = DEFAULT_MIN_EFFECT,
    alpha: float = DEFAULT_ALPHA,
) -> dict[str, Any]:
    """Decide whether this run's ``kind`` replaces the ``champion`` (see the module docstring).

    Returns:
        The decision: ``promoted`` (bool), ``reason``, both versions and scores, and with a champion the
        paired test's ``delta``, ``ci_low``, ``ci_high``, ``p_value`` and per-group ``groups``.
    """
    if decision_metric not in DECISION_METRICS:
        raise ValueError(f"decision_metric {decision_metric!r}: expected one of {list(DECISION_METRICS)}")
    if select_metric not in SELECT_METRICS:
        raise ValueError(f"promote_metric {select_metric!r}: expected one of {list(SELECT_METRICS)}")
    logger = get_run_logger()
    tracking.configure(tracking_cfg.tracking_uri, tracking_cfg.experiment)
    client = tracking.MlflowClient()
    name = tracking.registered_name(kind)
    mine = [r for r in runs if r["kind"] == kind and r["results"].get("registered_version")]
    if not mine:
        return {"promoted": False, "reason": f"no registered {kind} version in this run"}
    val_key = SELECT_KEYS[select_metric]
    challenger = max(mine, key=lambda r: (r["results"]["val"].get(val_key, float("-inf")), -r["seed"]))
    catalog = Catalog(data.data_dir)
    outcomes = np.stack(
        [
            pd.read_parquet(catalog.run_dir(kind, r["seed"]) / "test_per_sample.parquet")[decision_metric]
            for r in mine
        ]
    )
    head = {
        "metric": f"test {decision_metric}",
        "selected_on": select_metric,
        "challenger_version": str(challenger["results"]["registered_version"]),
        "challenger_run_id": challenger["run_id"],
        "challenger_seed": challenger["seed"],
        "seeds": sorted(r["seed"] for r in mine),
    }
    champion = None
    with contextlib.suppress(mlflow.exceptions.MlflowException):
        champion = client.get_model_version_by_alias(name, tracking.CHAMPION)
    if champion is None:
        decision = {**head, **champion_decision(outcomes, None)}
    elif str(champion.version) == head["challenger_version"]:
        decision = {
            **head,
            "champion_version": str(champion.version),
            "promoted": False,
            "reason": "the challenger already is the champion (cached)",
        }
    else:
        # cached per champion version and test split: a rerun, or a challenger that lost, loads no model
        scorer = score_champion.with_options(result_storage=Catalog(data.data_dir).cache)
        scored = call_cached(
            scorer,
            kind,
            str(champion.version),
            champion.run_id,
            data,
            decision_metric,
            match_radius_m,
            tracking_cfg,
        )
        head.update(champion_version=str(champion.version), champion_run_id=champion.run_id, **scored["how"])
        if scored["outcomes"] is None:
            decision = {**head, "promoted": True, "reason": f"the champion cannot be scored: {scored['why']}"}
        else:
            decision = {
                **head,
                **champion_decision(outcomes, scored["outcomes"], scored["groups"], min_effect, alpha),
            }
    if decision["promoted"]:
        client.set_registered_model_alias(name, tracking.CHAMPION, decision["challenger_version"])
    decision["decision"] = decision_text(name, decision)  # the one sentence every surface shows
    _record(client, parent_run_id, kind, decision)
    logger.info("%s: %s -> %s", name, decision["reason"], "promoted" if decision["promoted"] else "kept")
    return decision


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
    """The champion's per-sample ``metric`` on the current test split, the user group of every sample, and
    how the samples were read (``outcomes`` None with ``why`` when it cannot be scored).

    Cached on the version, its run, the samples' fingerprints, the metric, the radius and the code.
    """
    client = tracking.MlflowClient()
    run = client.get_run(run_id)
    catalog = Catalog(data.data_dir)
    table = pq.read_table(catalog.samples("test"))
    users_now = pd.read_parquet(catalog.vocabulary("users"))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            folder = Path(
                mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="vocabulary", dst_path=tmp)
            )
            users_then = pd.read_parquet(folder / "users.parquet")
            locations_then = pd.read_parquet(folder / "locations.parquet")
        except (mlflow.exceptions.MlflowException, OSError) as err:
            return {
                "outcomes": None,
                "groups": None,
                "how": {},
                "why": f"no vocabulary ({type(err).__name__})",
            }
    if run.data.tags.get("data_fingerprint") == data.fingerprint:
        how = {"champion_scored_on": "the same test split (same dataset)"}
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
            "champion_scored_on": f"the test split translated into its ids (locations matched within {radius_m:g} m)",
            **{f"translation.{k}": round(v, 2) for k, v in stats.items()},
        }
        groups_by_user = user_data_groups(users_now, users_then)
    bundle = load_registered(kind, version, tracking_cfg.tracking_uri, tracking_cfg.experiment)
    samples = SampleTensors(table)
    if bundle.routine is not None:
        if run.data.tags.get("data_fingerprint") != data.fingerprint:
            why = "a routine kind reads the whole past in its own place ids, which another dataset does not have"
            return {"outcomes": None, "groups": None, "how": how, "why": why}
        scores, _ = registered_scores(bundle, Path(data.data_dir), "test")
    else:
        scores = lambda batch: bundle.scorer(pack_batch(batch))  # noqa: E731
    per_sample = score_split(scores, samples).accumulator.per_sample()
    groups = np.array([groups_by_user.get(int(u), "new_user") for u in samples.user_id_np], dtype=object)
    return {"outcomes": per_sample[metric].to_numpy(), "groups": groups[per_sample["index"]], "how": how}


def _record(client, parent_run_id: str, kind: str, decision: dict[str, Any]) -> None:
    """Scores and test statistics as parent-run metrics, the decision as tags (parent run, challenger run
    and registry version: ``champion_decision``; a champion that stays also gets ``champion_kept``) and the
    whole decision as a JSON artifact."""
    prefix = f"champion_challenger.{kind}"
    metric = mlflow_name(decision.get("metric", "").removeprefix("test "))
    values = {
        f"{prefix}.challenger_test_{metric}": decision.get("challenger_score"),
        f"{prefix}.champion_test_{metric}": decision.get("champion_score"),
        f"{prefix}.delta": decision.get("delta"),
        f"{prefix}.p_value": decision.get("p_value"),
    }
    for key, value in values.items():
        if value is not None:
            client.log_metric(parent_run_id, key, float(value))
    text = decision["decision"]
    client.set_tag(parent_run_id, f"{prefix}.decision", "promoted" if decision["promoted"] else "kept")
    client.set_tag(parent_run_id, f"{prefix}.reason", decision["reason"][:500])
    tracking.log_dict_artifact(parent_run_id, decision, f"champion_challenger_{kind}.json")
    if decision.get("champion_version") == decision.get("challenger_version"):
        return  # a rerun of the same trainings: the run and version keep the decision that made the champion
    if decision.get("challenger_run_id"):
        client.set_tag(decision["challenger_run_id"], "champion_decision", text[:500])
    name = tracking.registered_name(kind)
    if decision.get("challenger_version"):
        client.set_model_version_tag(name, decision["challenger_version"], "champion_decision", text[:500])
    holder = decision.get("champion_version")
    if holder and not decision["promoted"]:
        # the champion that stays says why, next to the decision that made it champion
        client.set_model_version_tag(name, holder, "champion_kept", text[:500])
