"""Preprocess -> train flow on the real sample, with a real Prefect API and a temporary MLflow store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]
REPO = Path(__file__).resolve().parents[2]
SHORT = {"max_epochs": 2, "min_epochs": 0}


@pytest.fixture(scope="module")
def trained(preprocessed_copy, tmp_path_factory):
    from flows.train import train

    root = tmp_path_factory.mktemp("train")
    data_dir = preprocessed_copy(root / "data")
    uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    (root / "mlruns").mkdir()
    kwargs = dict(
        data_dir=str(data_dir),
        training={
            "models": ["markov", "mhsa", "pointer_plus"],
            "seeds": [0, 1],
            "train_overrides": {"mhsa": SHORT, "pointer_plus": SHORT},
            "device": "cpu",
        },
        tracking={"tracking_uri": uri, "experiment": "test"},
    )
    result = train(**kwargs)
    return data_dir, uri, result, kwargs


def test_results_files(trained):
    data_dir, _, result, _ = trained
    for kind in ("markov", "mhsa", "pointer_plus"):
        for seed in (0, 1):
            res = json.loads((data_dir / "results" / kind / f"seed{seed}" / "results.json").read_text())
            for key in ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "f1", "n_test", "n_params"):
                assert key in res
            for key in ("place_acc@1", "place_mrr", "place_f1", "new_place_rate", "new_place_auc"):
                assert key in res
            assert 0 <= res["acc@1"] <= res["acc@5"] <= res["acc@10"] <= 100
            assert 0 <= res["place_acc@1"] <= res["place_acc@5"] <= res["place_acc@10"] <= 100
            assert 0 <= res["new_place_brier"] <= 1
            head = json.loads(
                (data_dir / "results" / kind / f"seed{seed}" / "new_place_head.json").read_text()
            )
            assert len(head["coef"]) == len(head["features"])
    assert set(result["leaderboard"]) == {"markov", "mhsa", "pointer_plus"}


def test_mlflow_runs_params_metrics_models(trained):
    from mlflow import MlflowClient

    from tracking import mlflow_runs

    _, uri, result, _ = trained
    mlflow_runs.configure(uri, "test")
    client = MlflowClient()
    exp = client.get_experiment_by_name("test")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.info.run_id == result["parent_run_id"]]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == result["parent_run_id"]]
    assert len(parent) == 1
    assert len(children) == 6
    pointer = next(r for r in children if r.data.tags["model"] == "pointer_plus")
    assert pointer.data.params["train.recipe"] == "pointer"
    # each training names the device it ran on (here the CPU, one intra-op thread, and torch's dispatch)
    assert all(r.data.tags["device"].startswith("cpu (1 thread, ") for r in children)
    # the data's protocol (metadata.json's config) on every run, beside its fingerprint
    assert {r.data.tags["protocol"] for r in parent + children} == {"reference"}
    assert "model.d_model" in pointer.data.params
    for key in ("test_acc_at_1", "test_mrr", "val_acc_at_1_at_selected", "selected_epoch", "n_params"):
        assert key in pointer.data.metrics
    for key in ("test_place_acc_at_1", "test_place_mrr", "test_new_place_brier", "val_place_mrr_at_selected"):
        assert key in pointer.data.metrics
    history = client.get_metric_history(pointer.info.run_id, "val_loss")
    assert [m.step for m in history] == [1, 2]
    # honest names: the validation metrics of the selected epoch, and the lowest validation loss of any epoch
    selected = int(pointer.data.metrics["selected_epoch"])
    place_mrr = {m.step: m.value for m in client.get_metric_history(pointer.info.run_id, "val_place_mrr")}
    assert pointer.data.metrics["val_place_mrr_at_selected"] == pytest.approx(place_mrr[selected], abs=1e-6)
    assert pointer.data.metrics["val_loss_at_selected"] == pytest.approx(history[selected - 1].value)
    assert pointer.data.metrics["best_val_loss"] == pytest.approx(min(m.value for m in history))
    assert not [k for k in pointer.data.metrics if k.startswith("best_val_") and k != "best_val_loss"]
    assert {r.info.run_name for r in children} == {
        f"{k} s{s}" for k in ("markov", "mhsa", "pointer_plus") for s in (0, 1)
    }
    contexts = {
        (d.dataset.name, next(t.value for t in d.tags if t.key == "mlflow.data.context"))
        for d in pointer.inputs.dataset_inputs
    }
    assert contexts == {("data-train", "training"), ("data-val", "validation"), ("data-test", "testing")}
    artifacts = {a.path for a in client.list_artifacts(pointer.info.run_id)}
    assert {
        "training_curves.png",
        "per_user_accuracy.png",
        "results.json",
        "new_place_head.json",
    } <= artifacts
    assert "test_per_sample.parquet" in artifacts
    assert pointer.inputs.dataset_inputs, "dataset lineage (log_input) is missing"
    parent_metrics = parent[0].data.metrics
    assert "pointer_plus.test_place_acc_at_1_mean" in parent_metrics
    assert "markov.test_acc_at_1_std" in parent_metrics
    # every kind is registered, baselines too; with no champion yet, the seed best on validation place MRR
    for kind in ("markov", "mhsa", "pointer_plus"):
        name = mlflow_runs.registered_name(kind)
        versions = client.search_model_versions(f"name='{name}'")
        assert len(versions) == 2
        champion = client.get_model_version_by_alias(name, "champion")
        scores = {
            v.version: (client.get_run(v.run_id).data.metrics["val_place_mrr_at_selected"], -int(v.version))
            for v in versions
        }
        assert champion.version == max(scores, key=scores.get)
        assert result["promotion"][kind]["reason"] == "no champion yet"
        version = client.get_model_version(name, champion.version)
        story = version.tags["champion_decision"]
        assert story.startswith(f"promoted: v{champion.version} (seed ")
        assert client.get_run(champion.run_id).data.tags["champion_decision"] == story
        seed = int(client.get_run(champion.run_id).data.tags["seed"])
        assert version.tags["seed"] == str(seed)
        assert version.tags["model"] == kind
        assert version.tags["data_fingerprint"] == result["data"].fingerprint
        assert float(version.tags["test_place_acc_at_1"]) == pytest.approx(
            client.get_run(champion.run_id).data.metrics["test_place_acc_at_1"], abs=0.005
        )
        assert version.description.startswith(f"{kind} seed {seed}, data ")


def _parent_runs(uri: str) -> list[str]:
    from mlflow import MlflowClient

    from tracking import mlflow_runs

    experiment_id = mlflow_runs.configure(uri, "test")
    return [r.info.run_id for r in MlflowClient().search_runs([experiment_id], "tags.kind = 'pipeline'")]


def test_rerun_reuses_cached_training(trained):
    """A rerun with nothing new trains nothing and adds no parent run: it names the one holding its results."""
    from flows.train import train

    data_dir, uri, result, kwargs = trained
    before = {p: p.stat().st_mtime_ns for p in (data_dir / "results").rglob("results.json")}
    parents = _parent_runs(uri)
    again = train(**kwargs)
    assert [r["run_id"] for r in again["runs"]] == [r["run_id"] for r in result["runs"]]
    assert {p: p.stat().st_mtime_ns for p in (data_dir / "results").rglob("results.json")} == before
    assert again["settled"]
    assert again["parent_run_id"] == result["parent_run_id"]
    assert again["promotion"] == json.loads(json.dumps(result["promotion"], default=str))
    assert again["leaderboard"] == result["leaderboard"]
    assert _parent_runs(uri) == parents


def test_champion_versions_read_in_place_agree_with_mlflow(trained):
    from mlflow import MlflowClient

    from tracking import mlflow_runs
    from tracking.versions import champion_versions

    _, uri, _, _ = trained
    mlflow_runs.configure(uri, "test")
    kinds = ["markov", "mhsa", "pointer_plus", "ranker"]  # ranker: never registered here
    client = MlflowClient()
    expected = {k: client.get_model_version_by_alias(f"nextloc-{k}", "champion").version for k in kinds[:3]}
    assert champion_versions(kinds, uri, "test") == {
        **{k: str(v) for k, v in expected.items()},
        "ranker": None,
    }


def test_predict_round_trip(trained, tmp_path):
    """`nextloc predict` on the champion returns the same top-1 as scoring the samples in-process."""
    data_dir, uri, _, _ = trained
    samples = data_dir / "samples" / "test.parquet"
    cmd = [
        sys.executable,
        "-m",
        "commands.main",
        "predict",
        "--model",
        "pointer_plus",
        "--history",
        str(samples),
        "-k",
        "3",
        "--tracking-uri",
        uri,
        "--experiment",
        "test",
    ]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
    predictions = json.loads(out.stdout)
    assert all(len(p["places"]) == 3 for p in predictions)
    assert all(abs(sum(x["probability"] for x in p["places"])) <= 1.0 + 1e-6 for p in predictions)
    assert all(x["location_id"] >= 2 for p in predictions for x in p["places"])  # never pad or "unseen"
    assert all(0 < p["p_new_place"] < 1 for p in predictions)

    from commands.evaluate import evaluate_registered

    metrics = evaluate_registered("pointer_plus", "champion", data_dir, "test", uri, "test")
    top1 = [p["places"][0]["location_id"] for p in predictions]
    import pyarrow.parquet as pq

    targets = pq.read_table(samples).column("target_loc").to_pylist()
    acc = 100 * sum(int(a == b) for a, b in zip(top1, targets, strict=True)) / len(targets)
    assert acc == pytest.approx(metrics["place_acc@1"], abs=1e-6)
    assert "new_place_auc" in metrics

    history = {
        "location": [5, 7, 5],
        "start_min": [480, 1020, 1100],
        "weekday": [0, 0, 1],
        "duration_min": [540, 60, 600],
        "diff_days": [1, 1, 0],
        "user": 1,
    }
    (tmp_path / "h.json").write_text(json.dumps(history))
    cmd[cmd.index(str(samples))] = str(tmp_path / "h.json")
    single = json.loads(subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout)
    assert len(single) == 1
    assert len(single[0]["places"]) == 3


def test_changed_model_parameter_retrains_only_that_model(trained):
    """A new mhsa training option retrains mhsa (both seeds); markov and pointer_plus come from the cache."""
    from flows.train import train

    _, _, result, kwargs = trained
    training = kwargs["training"]
    overrides = {**training["train_overrides"], "mhsa": {**SHORT, "lr": 5e-4}}
    changed = {**kwargs, "training": {**training, "train_overrides": overrides}}
    again = train(**changed)
    old = {(r["kind"], r["seed"]): r["run_id"] for r in result["runs"]}
    new = {(r["kind"], r["seed"]): r["run_id"] for r in again["runs"]}
    assert {key for key in old if old[key] != new[key]} == {("mhsa", 0), ("mhsa", 1)}


def test_compare_leads_with_place_metrics(trained):
    """`nextloc compare` prints the place table first, then P(new place), then the reference metrics."""
    _, uri, _, _ = trained
    cmd = [sys.executable, "-m", "commands.main", "compare", "--tracking-uri", uri, "--experiment", "test"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    place, new, reference = (out.index(t) for t in ("place metrics", "P(new place)", "reference protocol"))
    assert place < new < reference
    for kind in ("markov", "mhsa", "pointer_plus"):
        assert kind in out


def test_experiment_and_parent_run_tell_the_comparison(trained):
    """The experiment is a model-training one with the comparison view; the parent run is named by date and
    models, describes the leaderboard and champions, and leaderboard.json tells the same champion story."""
    import re

    import mlflow
    from mlflow import MlflowClient

    from tracking import mlflow_runs

    _, uri, result, _ = trained
    mlflow_runs.configure(uri, "test")
    client = MlflowClient()
    tags = client.get_experiment_by_name("test").tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags["mlflow.sharedViewState.nextloc-comparison"])
    assert view["name"] == "Model comparison"
    state = json.loads(view["state"])
    assert state["orderByKey"] == "metrics.`test_place_acc_at_1`"
    assert "metrics.`selected_epoch`" in state["selectedColumns"]
    parent = client.get_run(result["parent_run_id"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d markov, mhsa, pointer_plus", parent.info.run_name)
    assert parent.data.tags["prefect.flow_run_id"]
    description = parent.data.tags["mlflow.note.content"]
    assert "| pointer_plus | 2 |" in description
    board = mlflow.artifacts.load_dict(f"runs:/{parent.info.run_id}/leaderboard.json")
    for kind in ("markov", "mhsa", "pointer_plus"):
        decision = board["promotion"][kind]["decision"]
        assert decision == result["promotion"][kind]["decision"]
        assert f"`nextloc-{kind}`: {decision}" in description
        version = client.get_model_version_by_alias(f"nextloc-{kind}", "champion")
        assert version.tags["champion_decision"] == decision


def test_a_seed_trains_to_the_same_bits_with_any_number_of_workers(trained, tmp_path):
    """`nextloc train --workers 1` and `--workers 2` give one seed the same weights: one intra-op thread
    each unless NEXTLOC_TORCH_THREADS says otherwise (--workers 1 used to take every core, and sums split
    over 2 threads round differently)."""
    import os
    import shutil

    source, _, _, _ = trained
    outputs = {}
    for workers in (1, 2):
        data_dir = tmp_path / f"workers{workers}"
        data_dir.mkdir()
        for name in ("samples", "vocabulary"):
            shutil.copytree(source / name, data_dir / name)
        for name in ("metadata.json", "staypoints.parquet"):
            shutil.copy2(source / name, data_dir / name)
        env = {k: v for k, v in os.environ.items() if k not in ("NEXTLOC_TORCH_THREADS", "PREFECT_API_URL")}
        env["NEXTLOC_PROGRESS"] = "0"
        done = subprocess.run(
            [sys.executable, "-m", "commands.main", "train", "--data-dir", str(data_dir), "--model", "mhsa"]
            + ["--seeds", "0", "--workers", str(workers), "--device", "cpu"]
            + ["--train-set", "max_epochs=2", "--train-set", "min_epochs=0"]
            + ["--tracking-uri", f"sqlite:///{tmp_path / f'mlflow{workers}.db'}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        seed = data_dir / "results" / "mhsa" / "seed0"
        outputs[workers] = {
            n: (seed / n).read_bytes() for n in ("test_per_sample.parquet", "new_place_head.json")
        }
    assert outputs[1] == outputs[2]  # p_new and every per-sample metric, to the bit


def test_a_moved_champion_is_decided_again_on_a_parent_run_of_its_own(trained):
    """Once another run moves a champion, the same rerun decides again (last in this module: it records a
    decision on a version; the alias is put back)."""
    from mlflow import MlflowClient

    from flows.train import train
    from tracking.versions import champion_versions

    _, uri, result, kwargs = trained
    parents = _parent_runs(uri)
    champion = champion_versions(["markov"], uri, "test")["markov"]
    other = next(
        r
        for r in result["runs"]
        if r["kind"] == "markov" and str(r["results"]["registered_version"]) != champion
    )
    client = MlflowClient()
    client.set_registered_model_alias(
        "nextloc-markov", "champion", str(other["results"]["registered_version"])
    )
    try:
        decided = train(**kwargs)
        assert not decided["settled"]
        assert decided["parent_run_id"] not in parents
        assert set(_parent_runs(uri)) == {*parents, decided["parent_run_id"]}
        assert decided["promotion"]["markov"]["champion_version"] == str(
            other["results"]["registered_version"]
        )
        assert train(**kwargs)["parent_run_id"] == decided["parent_run_id"]  # and settled again
    finally:
        client.set_registered_model_alias("nextloc-markov", "champion", champion)


def test_the_champion_is_decided_on_validation_and_never_reads_test(trained, tmp_path):
    """The decision reads validation only (tasks.promotion): with every test outcome rewritten to favour the
    champion and the test samples gone, a challenger better on validation is promoted; a decision reading
    test would keep the champion, or fail. markov's two seeds are the same model: the alias goes to seed 1's
    version, the challenger is seed 0's, and seed 0's validation outcomes are rewritten to hit every sample.
    Last in this module: it records a decision on the versions (the alias and the files are put back)."""
    import shutil

    import pandas as pd
    from mlflow import MlflowClient

    from flows.train import dataset_ref
    from runtime.catalog import Catalog
    from tasks.promotion import PromotionRule, champion_challenger
    from tasks.train import TrackingConfig
    from tracking import mlflow_runs

    data_dir, uri, result, _ = trained
    catalog = Catalog(str(data_dir))
    runs = [r for r in result["runs"] if r["kind"] == "markov"]
    by_seed = {r["seed"]: r for r in runs}
    client = MlflowClient(uri, uri)
    champion = client.get_model_version_by_alias("nextloc-markov", "champion").version
    data = dataset_ref(str(data_dir))  # the fingerprints of the samples as trained: read before any change
    kept = tmp_path / "kept"
    kept.mkdir()
    seed0, test_samples = catalog.run_dir("markov", 0), catalog.samples("test")
    files = [seed0 / "val_per_sample.parquet", test_samples] + [
        catalog.run_dir("markov", s) / "test_per_sample.parquet" for s in by_seed
    ]
    for f in files:
        shutil.copy2(f, kept / f"{f.parent.name}-{f.name}")
    try:
        for seed in by_seed:  # on test the challenger misses everything
            path = catalog.run_dir("markov", seed) / "test_per_sample.parquet"
            frame = pd.read_parquet(path)
            frame[[c for c in frame if c.startswith(("acc@", "mrr", "ndcg", "place_"))]] = 0.0
            frame.to_parquet(path)
        test_samples.unlink()
        val = pd.read_parquet(seed0 / "val_per_sample.parquet")  # on validation seed 0 hits every sample
        val[[c for c in val if c.startswith(("acc@", "mrr", "ndcg", "place_"))]] = 100.0
        val.to_parquet(seed0 / "val_per_sample.parquet")
        client.set_registered_model_alias(
            "nextloc-markov", "champion", str(by_seed[1]["results"]["registered_version"])
        )
        experiment_id = mlflow_runs.configure(uri, "test")
        with mlflow_runs.parent_run(experiment_id, "validation decides", {}, {}) as parent_id:
            tracking = TrackingConfig(tracking_uri=uri, experiment="test")
            decision = champion_challenger("markov", runs, data, PromotionRule(), tracking, parent_id)
        assert decision["metric"] == "val place_mrr"
        assert decision["challenger_version"] == str(by_seed[0]["results"]["registered_version"])
        assert decision["champion_scored_on"].startswith("its run's own validation outcomes")
        assert decision["test"].startswith(f"paired bootstrap over {len(val)} validation samples")
        champion_val = pd.read_parquet(catalog.run_dir("markov", 1) / "val_per_sample.parquet")
        assert decision["champion_score"] == pytest.approx(champion_val["place_mrr"].mean())
        # the evidence is every seed averaged sample by sample: seed 0's 100 with seed 1's own
        assert decision["challenger_score"] == pytest.approx((100.0 + decision["champion_score"]) / 2)
        assert decision["promoted"], decision["reason"]
        metrics = client.get_run(parent_id).data.metrics
        assert metrics["champion_challenger.markov.challenger_val_place_mrr"] == pytest.approx(
            decision["challenger_score"]
        )
        assert not [k for k in metrics if "test" in k]
    finally:
        for f in files:
            shutil.copy2(kept / f"{f.parent.name}-{f.name}", f)
        client.set_registered_model_alias("nextloc-markov", "champion", champion)
