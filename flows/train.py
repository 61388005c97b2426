"""The ``train`` flow: every configured model x seed on a preprocessed dataset, tracked in MLflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.task_runners import ProcessPoolTaskRunner

from nextloc.fingerprint import hash_file
from nextloc.sequences import SPLITS
from tasks import tracking
from tasks.caching import Artifact, cached_result
from tasks.catalog import Catalog
from tasks.locking import data_dir_lock
from tasks.runners import share_api_with_workers
from tasks.train import NEURAL, DataRef, TrackingConfig, mlflow_name, train_model_task

DEFAULT_MODELS = ["markov", "mhsa", "pointer_plus"]


@flow(
    name="train",
    flow_run_name="train {models} seeds {seeds}",
    validate_parameters=True,
    task_runner=ProcessPoolTaskRunner(max_workers=1),
)
def train(
    data_dir: str = "data/geolife",
    models: list[str] | None = None,
    seeds: list[int] | None = None,
    model_overrides: dict[str, dict[str, Any]] | None = None,
    train_overrides: dict[str, dict[str, Any]] | None = None,
    tracking_uri: str | None = None,
    experiment: str = tracking.DEFAULT_EXPERIMENT,
    device: str = "auto",
    promote_metric: str = "best_val_acc@1",
    promote: bool = True,
) -> dict[str, Any]:
    """Train, evaluate (best checkpoint) and register each model; promote the best run of each kind.

    One MLflow parent run per flow run, one child run per model and seed. Each (model, seed) task is
    cached on the samples' content fingerprint, its configuration and the code. Trainings run in worker
    processes (``with_options(task_runner=ProcessPoolTaskRunner(max_workers=n))`` runs ``n`` at once;
    separate processes keep each seed's random streams its own). On a CPU each uses one intra-op thread:
    these small models train about twice as fast that way. With ``promote=False`` the caller decides about
    the ``champion`` alias (``preprocess-train`` does, champion against challenger on the test split).
    """
    logger = get_run_logger()
    models = models or DEFAULT_MODELS
    seeds = seeds if seeds is not None else [0]
    with data_dir_lock(data_dir):  # one writer per data directory
        data = dataset_ref(data_dir)
        tracking_cfg = TrackingConfig(tracking_uri, experiment)
        experiment_id = tracking.configure(tracking_uri, experiment)
        client = tracking.MlflowClient()
        parent = client.create_run(
            experiment_id,
            run_name=f"pipeline {flow_run.get_name() or ''}".strip(),
            tags={
                "prefect.flow_run_id": str(flow_run.get_id() or ""),
                "data_fingerprint": data.fingerprint,
                "kind": "pipeline",
            },
        )
        parent_id = parent.info.run_id
        client.log_param(parent_id, "models", ",".join(models))
        client.log_param(parent_id, "seeds", ",".join(map(str, seeds)))
        cache = Catalog(data.data_dir).cache
        task = train_model_task.with_options(result_storage=cache)
        calls = [
            {
                "kind": kind,
                "seed": seed,
                "data": data,
                "model_overrides": (model_overrides or {}).get(kind, {}),
                "train_overrides": (train_overrides or {}).get(kind, {}),
                "tracking_cfg": tracking_cfg,
                "parent_run_id": parent_id,
                "device": device,
            }
            for kind in models
            for seed in seeds
        ]
        try:
            # cached trainings are read back here: no worker process starts for them
            cached = [cached_result(task, call, cache) for call in calls]
            if not all(hit for hit, _ in cached):
                share_api_with_workers()
            futures = {
                i: task.submit(**call)
                for i, (call, (hit, _)) in enumerate(zip(calls, cached, strict=True))
                if not hit
            }
            results = [futures[i].result() if i in futures else value for i, (_, value) in enumerate(cached)]
            logger.info("trainings: %d cached, %d run", len(calls) - len(futures), len(futures))
            decisions = {
                kind: tracking.promote_champion(kind, mlflow_name(promote_metric), data.fingerprint)
                for kind in models
                if kind in NEURAL and promote
            }
            board = leaderboard(results)
            tracking.log_dict_artifact(
                parent_id, {"leaderboard": board, "promotion": decisions, "runs": results}, "leaderboard.json"
            )
            for kind, row in board.items():
                client.log_metric(parent_id, f"{kind}_test_acc_at_1_mean", row["acc@1"]["mean"])
            client.set_terminated(parent_id, "FINISHED")
        except BaseException:
            client.set_terminated(parent_id, "FAILED")
            raise
        logger.info("leaderboard: %s", {k: round(v["acc@1"]["mean"], 2) for k, v in board.items()})
        return {
            "parent_run_id": parent_id,
            "leaderboard": board,
            "promotion": decisions,
            "runs": results,
            "data": data,
            "experiment_id": experiment_id,
        }


def dataset_ref(data_dir: str) -> DataRef:
    """Describe the preprocessed dataset under ``data_dir`` (fails clearly if preprocessing has not run)."""
    catalog = Catalog(str(Path(data_dir).resolve()))
    missing = [p for p in [catalog.metadata, *(catalog.samples(s) for s in SPLITS)] if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"preprocessed data missing under {data_dir}: {[str(m) for m in missing]}; run `nextloc preprocess` first"
        )
    samples = {s: Artifact.record(catalog.samples(s), hash_file(catalog.samples(s))) for s in SPLITS}
    return DataRef(str(catalog.root), samples, Artifact.record(catalog.metadata, hash_file(catalog.metadata)))


def leaderboard(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Mean and standard deviation over seeds of each test metric, per model."""
    from tasks.evaluate import summarise

    board: dict[str, dict[str, dict[str, float]]] = {}
    for kind in dict.fromkeys(r["kind"] for r in results):
        rows = [r["results"] for r in results if r["kind"] == kind]
        board[kind] = {}
        for key in ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "f1"):
            board[kind][key] = summarise([row[key] for row in rows])
    return board
