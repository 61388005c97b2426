"""Predictions people can use, end to end: a model store trained on the real GeoLife sample (real Prefect
API, real MLflow store), ``nextloc predict`` from raw ``.plt`` fixes and from visits, and the registered
model served by a real ``mlflow models serve`` process on 127.0.0.1 answering the same as the CLI."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import yaml

from nextloc.evaluation.metrics import SET_KEYS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]
REPO = Path(__file__).resolve().parents[2]
SHORT = {"max_epochs": 2, "min_epochs": 0}
FAR = (-33.86, 151.21)  # Sydney: no GeoLife place is near


@pytest.fixture(scope="module")
def store(preprocessed_copy, tmp_path_factory):
    from flows.train import train

    root = tmp_path_factory.mktemp("predict")
    data_dir = preprocessed_copy(root / "data")
    (root / "mlruns").mkdir()
    uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    train(
        data_dir=str(data_dir),
        training={
            "models": ["markov", "pointer_plus", "ranker", "ranker_refit"],
            "seeds": [0],
            "train_overrides": {"pointer_plus": SHORT},
            "device": "cpu",
        },
        tracking={"tracking_uri": uri, "experiment": "test"},
    )
    return data_dir, uri


@pytest.fixture(scope="module")
def two_histories(store, tmp_path_factory) -> Path:
    """A known user's last visits (at their places' centres) and an unknown user who went somewhere never
    seen, as the MLflow serving request (``dataframe_records``) that the CLI reads as it is."""
    data_dir, _ = store
    sp = pd.read_parquet(data_dir / "staypoints.parquet")
    centres = pd.read_parquet(data_dir / "vocabulary" / "locations.parquet").set_index("loc_index")
    user = sp[(sp["user_id"] == 73) & (sp["location_id"] >= 2)].sort_values("started_at").tail(5)
    records = [
        {
            "user_id": 73,
            "started_at": row.started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "finished_at": row.finished_at.strftime("%Y-%m-%dT%H:%M:%S+00:00"),
            "latitude": float(centres.loc[row.location_id, "latitude"]),
            "longitude": float(centres.loc[row.location_id, "longitude"]),
        }
        for row in user.itertuples()
    ]
    first = records[0]
    records += [
        {**first, "user_id": 5555},
        {
            "user_id": 5555,
            "started_at": "2008-09-01 10:00:00",  # no zone: UTC
            "finished_at": "2008-09-01T20:30:00+08:00",
            "latitude": FAR[0],
            "longitude": FAR[1],
        },
    ]
    path = tmp_path_factory.mktemp("request") / "two_histories.json"
    path.write_text(json.dumps({"dataframe_records": records, "params": {"k": 3}}))
    return path


def nextloc(*args: str, uri: str, check: bool = True) -> subprocess.CompletedProcess:
    """The command line; a wide terminal, so that a message is one line as the code wrote it."""
    cmd = [sys.executable, "-m", "commands.main", *args, "--tracking-uri", uri, "--experiment", "test"]
    env = {**os.environ, "COLUMNS": "500"}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=check, timeout=300, env=env)


def test_registered_models_are_code_and_plain_weights(store, tmp_path):
    """Every kind, the baseline too: a models-from-code pyfunc, safetensors weights and JSON config; no
    pickle anywhere; the signature names and types the visit columns."""
    import mlflow

    from tracking import mlflow_runs

    _, uri = store
    mlflow_runs.configure(uri, "test")
    for kind in ("markov", "pointer_plus", "ranker"):
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"models:/nextloc-{kind}@champion", dst_path=str(tmp_path / kind)
            )
        )
        spec = yaml.safe_load((local / "MLmodel").read_text())
        assert set(spec["flavors"]) == {"python_function"}
        assert spec["flavors"]["python_function"]["loader_module"] == "mlflow.pyfunc.loaders.code_model"
        names = {p.name for p in local.rglob("*") if p.is_file()}
        weights = {"ranker.txt", "profile.parquet"} if kind == "ranker" else {"weights.safetensors"}
        assert {"pyfunc_model.py", "bundle.json", "locations.parquet", *weights} <= names
        assert not [n for n in names if n.endswith((".pkl", ".pickle", ".pt", ".pth", ".cloudpickle"))]
        inputs = json.loads(spec["signature"]["inputs"])
        assert [(c["name"], c["type"]) for c in inputs if c["required"]] == [
            ("user_id", "long"),
            ("started_at", "string"),
            ("finished_at", "string"),
            ("latitude", "double"),
            ("longitude", "double"),
        ]


def test_a_training_records_where_its_time_went(store):
    """results.json says how long each stage of a training took: a routine kind's questions (``build``),
    the fit, the evaluation and the recording (files, MLflow, the bundle)."""
    data_dir, _ = store
    for kind in ("markov", "ranker"):
        results = json.loads((data_dir / "results" / kind / "seed0" / "results.json").read_text())
        stages = results["stage_seconds"]
        assert set(stages) == {"build", "fit", "evaluate", "record"}, kind
        assert all(seconds >= 0 for seconds in stages.values()), kind
        assert (stages["build"] > 0) == (kind == "ranker")  # only a routine kind builds questions
        assert sum(stages.values()) <= results["train_seconds"] + stages["record"] + 0.05


@pytest.mark.parametrize("kind", ["markov", "ranker", "ranker_refit"])
def test_registered_model_scores_as_when_trained(store, kind):
    """The champion loaded back from its bundle (the champion rule and `nextloc evaluate` load it this way)
    scores the test split exactly as the trained model did, its new-place head included."""
    from commands.evaluate import evaluate_registered

    data_dir, uri = store
    results = json.loads((data_dir / "results" / kind / "seed0" / "results.json").read_text())
    metrics = evaluate_registered(kind, "champion", data_dir, "test", uri, "test")
    for key in ("place_acc@1", "place_mrr", "acc@1", "mrr"):
        assert metrics[key] == pytest.approx(results[key], abs=1e-9), key
    for key in ("new_place_auc", "new_place_brier"):  # float32 probabilities read back as log-probabilities
        assert metrics[key] == pytest.approx(results[key], rel=1e-6), key
    for key in SET_KEYS:  # the answer sets of the distribution `nextloc predict --coverage` answers with
        assert metrics[key] == pytest.approx(results[key], abs=1e-9), key


def test_the_run_logs_the_answer_sets_on_test(store):
    """Every trained run records the test answer sets at 0.5, 0.8 and 0.9 (results.json and MLflow's
    ``test_set_coverage_90``, ``test_set_size_90``, ...); the sets grow with the level."""
    import mlflow

    from tracking import mlflow_runs

    data_dir, uri = store
    mlflow_runs.configure(uri, "test")
    client = mlflow.MlflowClient()
    for kind in ("markov", "pointer_plus", "ranker"):
        results = json.loads((data_dir / "results" / kind / "seed0" / "results.json").read_text())
        logged = client.get_run(results["mlflow_run_id"]).data.metrics
        for key in SET_KEYS:
            assert logged[f"test_{key}"] == pytest.approx(results[key]), (kind, key)
        sizes = [results[f"set_size_{level}"] for level in (50, 80, 90)]
        coverages = [results[f"set_coverage_{level}"] for level in (50, 80, 90)]
        assert 1 <= sizes[0] <= sizes[1] <= sizes[2], kind
        assert 0 < coverages[0] <= coverages[1] <= coverages[2] <= 100, kind


def test_the_refit_ranker_is_chosen_with_the_ranker_and_tested_as_refit(store):
    """ranker_refit: its validation place numbers are the ranker's it was chosen with (same seed, same
    trees; its new-place head is its own, fit on cross-fitted answers); its test numbers are those of the
    trees refit on train + val, and it says it trained on validation."""
    data_dir, _ = store
    plain, refit = (
        json.loads((data_dir / "results" / kind / "seed0" / "results.json").read_text())
        for kind in ("ranker", "ranker_refit")
    )
    place = [key for key in plain["val"] if key.startswith("place_")]
    assert len(place) >= 5
    assert {k: refit["val"][k] for k in place} == {k: plain["val"][k] for k in place}
    assert refit["refit_on_train_val"] is True
    assert plain["refit_on_train_val"] is False
    assert refit["n_test"] == plain["n_test"]


def test_raw_plt_fixes_round_trip(store, sample_dir):
    """A sample user's raw .plt folder -> staypoints -> that user's places, named, with P(new place)."""
    _, uri = store
    trajectory = sample_dir / "Data" / "073" / "Trajectory"
    out = nextloc("predict", "--model", "pointer_plus", "--history", str(trajectory), "-k", "3", uri=uri)
    (answer,) = json.loads(out.stdout)
    assert answer["user_id"] == 73
    assert answer["known_user"] is True
    assert answer["visits_used"] >= 1
    assert 0 < answer["p_new_place"] < 1
    assert [p["rank"] for p in answer["places"]] == [1, 2, 3]
    for place in answer["places"]:
        assert place["location_id"] >= 2
        assert 39 < place["latitude"] < 41  # Beijing
        assert 115 < place["longitude"] < 118
        assert place["n_visits"] >= 1
    table = nextloc(
        "predict", "--model", "markov", "--history", str(trajectory), "--format", "table", uri=uri
    )
    assert "user_id 73" in table.stdout
    assert "P(new place)" in table.stdout
    assert "latitude" in table.stdout


@pytest.mark.parametrize("kind", ["ranker", "pointer_plus"])
def test_predict_answers_with_the_fewest_places_holding_the_coverage(store, two_histories, kind):
    """`--coverage 0.9`: the top-k answer unchanged, and a set: the most likely of "a new place" and every
    place (all of them asked for with a large -k), until they hold 0.9. The ranker's places share
    1 - p_new_place; a neural kind's sum to 1 among themselves and are scaled by it."""
    _, uri = store
    args = ("predict", "--model", kind, "--history", str(two_histories))
    plain = json.loads(nextloc(*args, "-k", "3", uri=uri).stdout)
    with_sets = json.loads(nextloc(*args, "-k", "3", "--coverage", "0.9", uri=uri).stdout)
    every = json.loads(nextloc(*args, "-k", "100000", uri=uri).stdout)
    assert [{k: v for k, v in a.items() if k != "answer_set"} for a in with_sets] == plain
    for answer, full in zip(with_sets, every, strict=True):
        chosen = answer["answer_set"]
        assert chosen["coverage"] == 0.9
        p_new = full["p_new_place"]
        scale = 1.0 if kind == "ranker" else 1 - p_new
        candidates = sorted([p_new, *(p["probability"] * scale for p in full["places"])], reverse=True)
        held = [m["probability"] for m in chosen["members"]]
        assert held == pytest.approx(candidates[: len(held)], abs=2e-6)  # the most likely first
        assert sum(held) >= 0.9 - 1e-5
        assert sum(held[:-1]) < 0.9 + 1e-5  # the fewest
        assert chosen["total_probability"] == pytest.approx(sum(held), abs=1e-5)
        news = [m for m in chosen["members"] if m.get("new_place")]
        if news:  # "a new place" belongs: as likely as the set's least likely member, or more
            assert news == [{"new_place": True, "probability": p_new}]
            assert p_new >= held[-1] - 2e-6
        else:
            assert p_new <= held[-1] + 2e-6
        places = [m for m in chosen["members"] if not m.get("new_place")]
        assert all(m["location_id"] >= 2 for m in places)
        assert all(39 < m["latitude"] < 41 for m in places)  # named: Beijing
    table = nextloc(*args, "--coverage", "0.9", "--format", "table", uri=uri).stdout
    assert "answer set for coverage 0.9" in table
    assert "total probability" in table


def test_bad_input_is_named(store, tmp_path):
    _, uri = store
    bad = tmp_path / "visits.csv"
    bad.write_text(
        "user_id,started_at,finished_at,latitude,longitude\n"
        "73,2008-09-01T01:00:00Z,2008-09-01T05:00:00Z,39.97,116.33\n"
        "73,2008-09-01T06:00:00Z,2008-09-01T09:00:00Z,400.17,116.33\n"
    )
    out = nextloc("predict", "--model", "markov", "--history", str(bad), uri=uri, check=False)
    assert out.returncode == 2
    assert "visits.csv row 2: field 'latitude' = 400.17" in " ".join(out.stderr.split())


def test_the_ranker_says_it_needs_visits_not_a_samples_table(store):
    """A samples table holds 7-day windows only: the ranker, which reads the whole past, says so."""
    data_dir, uri = store
    samples = data_dir / "samples" / "test.parquet"
    out = nextloc("predict", "--model", "ranker", "--history", str(samples), uri=uri, check=False)
    assert out.returncode == 2
    assert "answers from visits or positionfixes" in " ".join(out.stderr.split())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@contextlib.contextmanager
def served(model_uri: str, tracking_uri: str, log: Path):
    """A real ``mlflow models serve --env-manager local`` on a free port; stopped (process group) after."""
    port = _free_port()
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking_uri,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # its uvicorn
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    mlflow = str(Path(sys.executable).parent / "mlflow")
    cmd = [
        mlflow,
        "models",
        "serve",
        "-m",
        model_uri,
        "--env-manager",
        "local",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"mlflow models serve exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, (
                f"mlflow models serve not up in 120 s: {log.read_text()[-3000:]}"
            )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as response,
            ):
                if response.status == 200:
                    break
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.mark.parametrize("kind", ["pointer_plus", "ranker"])
def test_served_model_answers_as_the_cli(store, two_histories, tmp_path, kind):
    """`mlflow models serve` on the champion answers the two histories exactly as `nextloc predict` does
    (the ranker from its stored tally plus the request); the unknown user and the place never seen are
    said so; bad input is a 400 naming the row and field."""
    _, uri = store
    cli = json.loads(
        nextloc("predict", "--model", kind, "--history", str(two_histories), "-k", "3", uri=uri).stdout
    )
    cli_sets = json.loads(
        nextloc(
            "predict",
            "--model",
            kind,
            "--history",
            str(two_histories),
            "-k",
            "3",
            "--coverage",
            "0.8",
            uri=uri,
        ).stdout
    )
    request = json.loads(two_histories.read_text())
    with served(f"models:/nextloc-{kind}@champion", uri, tmp_path / "serve.log") as url:
        status, body = _post(f"{url}/invocations", two_histories.read_bytes())
        bad = json.loads(two_histories.read_text())
        bad["dataframe_records"][1]["started_at"] = "yesterday"
        bad_status, bad_body = _post(f"{url}/invocations", json.dumps(bad).encode())
        sets_status, sets_body = _post(
            f"{url}/invocations", json.dumps({**request, "params": {"k": 3, "coverage": 0.8}}).encode()
        )
        over_status, over_body = _post(
            f"{url}/invocations", json.dumps({**request, "params": {"k": 3, "coverage": 1.5}}).encode()
        )
    assert status == 200, body
    assert body["predictions"] == cli
    assert sets_status == 200, sets_body
    assert sets_body["predictions"] == cli_sets  # the coverage param: the CLI's answer sets
    assert all(answer["answer_set"]["coverage"] == 0.8 for answer in cli_sets)
    assert over_status == 400
    assert "coverage must be a number strictly between 0 and 1, got 1.5" in over_body["message"]
    known, unknown = cli
    assert (known["user_id"], known["known_user"], known["new_place_visits"]) == (73, True, 0)
    assert (unknown["user_id"], unknown["known_user"], unknown["new_place_visits"]) == (5555, False, 1)
    for answer in cli:
        assert 0 < answer["p_new_place"] < 1
        assert len(answer["places"]) == 3
        assert all(p["location_id"] >= 2 and "latitude" in p for p in answer["places"])
    assert bad_status == 400
    assert "request row 2: field 'started_at' is not a time: 'yesterday'" in bad_body["message"]


def test_a_known_user_is_answered_from_their_stored_tally(store, tmp_path):
    """The ranker's bundle holds each training user's routine as counts: the same last visit answered as
    user 73 names places of 73's past that the request never mentions; as a user the model never saw, it
    can only name the request's own place first. The registered version says it holds personal data."""
    import mlflow

    from tracking import mlflow_runs

    data_dir, uri = store
    sp = pd.read_parquet(data_dir / "staypoints.parquet")
    centres = pd.read_parquet(data_dir / "vocabulary" / "locations.parquet").set_index("loc_index")
    last = sp[(sp["user_id"] == 73) & (sp["location_id"] >= 2)].sort_values("started_at").iloc[-1]
    visit = {
        "started_at": last.started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "finished_at": last.finished_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "latitude": float(centres.loc[last.location_id, "latitude"]),
        "longitude": float(centres.loc[last.location_id, "longitude"]),
    }
    request = tmp_path / "one_visit.json"
    request.write_text(json.dumps([{"user_id": 73, **visit}, {"user_id": 7777, **visit}]))
    known, unknown = json.loads(
        nextloc("predict", "--model", "ranker", "--history", str(request), "-k", "3", uri=uri).stdout
    )
    mine = set(sp.loc[(sp["user_id"] == 73) & (sp["location_id"] >= 2), "location_id"].tolist())
    named = [p["location_id"] for p in known["places"]]
    assert set(named) <= mine
    assert set(named) - {int(last.location_id)}
    assert unknown["places"][0]["location_id"] == int(last.location_id)
    mlflow_runs.configure(uri, "test")
    version = mlflow.MlflowClient().get_model_version_by_alias("nextloc-ranker", "champion")
    assert "Personal data" in version.description
    assert "no list of visits" in version.description


def test_a_version_without_a_bundle_is_refused_not_unpickled(store, tmp_path):
    """A registered version with no bundle (a pickled model from an early nextloc) is never loaded: the
    error says how to replace it."""
    import mlflow

    from tracking import mlflow_runs
    from tracking.registered import load_registered

    _, uri = store
    mlflow_runs.configure(uri, "test")
    model = tmp_path / "not_a_bundle.py"
    model.write_text(
        "import mlflow\n"
        "class Echo(mlflow.pyfunc.PythonModel):\n"
        "    def predict(self, context, model_input, params=None):\n"
        "        return model_input\n"
        "mlflow.models.set_model(Echo())\n"
    )
    with mlflow.start_run():
        mlflow.pyfunc.log_model(name="model", python_model=str(model), registered_model_name="nextloc-lstm")
    with pytest.raises(ValueError, match=r"holds no model bundle.*nextloc train --model lstm"):
        load_registered("lstm", "1", uri, "test")


def test_the_accuracy_benchmark_splits_every_kind_by_kind_of_target(store):
    """`benchmarks/accuracy.py` on a trained folder: every kind, and its place Acc@1 split by kind of target
    adds up to the whole."""
    data_dir, _ = store
    out = subprocess.run(  # -X faulthandler: a fatal error in a native library prints where Python was
        [sys.executable, "-X", "faulthandler", "benchmarks/accuracy.py", "--data-dir", str(data_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-4000:]}"
    report = json.loads(out.stdout)
    assert {"markov", "pointer_plus", "ranker"} <= set(report["kinds"])
    shares = report["targets_percent"]
    assert sum(shares.values()) == pytest.approx(100, abs=0.05)
    for kind, numbers in report["kinds"].items():
        by_target = numbers["place_acc@1_by_target"]
        whole = sum(shares[g] / 100 * by_target[g]["mean"] for g in shares if by_target[g]["n"])
        assert whole == pytest.approx(numbers["place_acc@1"]["mean"], abs=0.05), kind
        assert by_target["new"]["mean"] == 0  # a place model never names a new place


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG (its signature checked)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_predict_draws_the_answers_on_a_map(store, two_histories, tmp_path):
    """`nextloc predict --map`: the JSON answers as without it, and a PNG with one panel per history."""
    _, uri = store
    out_png = tmp_path / "answers.png"
    args = ("predict", "--model", "markov", "--history", str(two_histories), "-k", "3")
    with_map = json.loads(nextloc(*args, "--map", str(out_png), uri=uri).stdout)
    assert with_map == json.loads(nextloc(*args, uri=uri).stdout)
    assert _png_size(out_png) == (1280, 640)  # two histories: two 640 x 640 panels side by side


def test_predict_draws_the_answers_on_a_web_map(store, two_histories, tmp_path):
    """`nextloc predict --map answers.html`: the JSON answers as without it, and one page with a layer per
    history (user 73, and user 5555 far away), Leaflet inside it."""
    from nextloc.maps.web import external_references

    _, uri = store
    page = tmp_path / "answers.html"
    args = ("predict", "--model", "markov", "--history", str(two_histories), "-k", "3")
    with_map = json.loads(nextloc(*args, "--map", str(page), uri=uri).stdout)
    assert with_map == json.loads(nextloc(*args, uri=uri).stdout)
    html = page.read_text()
    assert external_references(html) == []
    for answer in with_map:
        assert f"user {answer['user_id']} at {answer['at']}" in html
        for place in answer["places"]:
            assert f"probability {place['probability']:.3f}" in html


def test_the_map_of_a_real_user_holds_their_visits_and_places(store, sample_dir, tmp_path):
    """User 73's raw fixes answered by the champion: the map draws every visit the model used, in order,
    and the places it named at their coordinates."""
    from nextloc.maps.png import draw_predictions, project
    from nextloc.predict.answer import predict
    from nextloc.predict.histories import to_histories
    from nextloc.predict.history_reader import read_history
    from tracking.registered import load_registered

    _, uri = store
    bundle = load_registered("pointer_plus", "champion", uri, "test")
    raw = read_history(sample_dir / "Data" / "073" / "Trajectory", bundle.preprocess)
    histories = to_histories(raw, bundle)
    (answer,) = predict(bundle, histories, k=5)
    drawn = draw_predictions(histories, [answer], bundle.locations, tmp_path / "73.png")
    (panel,) = drawn.panels
    assert _png_size(drawn.path) == (640, 640)
    assert len(panel.history) == answer["visits_used"] >= 1
    lat = [p["latitude"] for p in answer["places"]]
    lon = [p["longitude"] for p in answer["places"]]
    assert panel.places == pytest.approx(project(lat, lon, panel.origin, panel.unit_m))
    assert f"P(new place) {answer['p_new_place']:.2f}" in panel.title


def test_each_champion_has_maps_of_three_test_users(store, tmp_path):
    """The promotion logs the champion's answers for the 3 users with the most test samples (ties: the lower
    id) to the champion's run as maps/<user_id>.png and the web map beside it, maps/<user_id>.html (Leaflet
    inside, the actual next place drawn when known)."""
    from nextloc.maps.web import external_references
    from tracking import mlflow_runs
    from tracking.versions import champion_holder

    data_dir, uri = store
    counts = pd.read_parquet(data_dir / "samples" / "test.parquet", columns=["user_id"])[
        "user_id"
    ].value_counts()
    expected = sorted(counts.index, key=lambda u: (-counts[u], u))[:3]
    mlflow_runs.configure(uri, "test")
    for kind in ("markov", "pointer_plus", "ranker"):
        holder = champion_holder(kind)
        folder = mlflow_runs.download_run_artifacts(holder.run_id, "maps", tmp_path / kind)
        names = sorted(p.name for p in folder.iterdir())
        assert names == sorted(f"{u}.{suffix}" for u in expected for suffix in ("png", "html")), kind
        for png in folder.glob("*.png"):
            assert _png_size(png) == (640, 640)
        pages = {page.stem: page.read_text() for page in folder.glob("*.html")}
        for user, html in pages.items():
            assert external_references(html) == []
            assert f"user {user} at" in html
        # where the user really went, unless that was a new place (no centre)
        assert any("the actual next place" in html for html in pages.values()), kind


def test_maps_without_tiles_warn_once(store, tmp_path, monkeypatch, caplog):
    """Offline (here: a tile server that refuses connections), a champion's maps are drawn on plain axes
    after one warning, not one per map: the first map that gets no basemap stops the others asking."""
    import logging

    from tracking import mlflow_runs
    from tracking.registered import champion_maps
    from tracking.versions import champion_holder

    data_dir, uri = store
    monkeypatch.setenv("NEXTLOC_MAP_TILES", f"http://127.0.0.1:{_free_port()}/{{z}}/{{x}}/{{y}}.png")
    monkeypatch.setenv("NEXTLOC_TILE_CACHE", str(tmp_path / "tiles"))
    mlflow_runs.configure(uri, "test")
    holder = champion_holder("markov")
    with caplog.at_level(logging.WARNING, logger="nextloc.maps.tiles"):
        logged = champion_maps("markov", holder.version, holder.run_id, data_dir, uri, "test")
    assert len([name for name in logged if name.endswith(".png")]) == 3
    assert len([r for r in caplog.records if "no basemap" in r.getMessage()]) == 1


def test_nextloc_serve_answers_without_the_venv_on_path(store, two_histories, tmp_path):
    """`nextloc serve` with PATH stripped of the venv (where `mlflow models serve` alone exits 127: it starts
    uvicorn by name): it waits for the server, prints the URL and a curl line, answers as `nextloc predict`,
    and Ctrl-C stops the server too."""
    _, uri = store
    cli = json.loads(
        nextloc("predict", "--model", "markov", "--history", str(two_histories), "-k", "3", uri=uri).stdout
    )
    port = _free_port()
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p != venv_bin
    )
    env = {**os.environ, "PATH": path}
    cmd = [str(Path(sys.executable).parent / "nextloc"), "serve", "--model", "markov", "--port", str(port)]
    cmd += ["--tracking-uri", uri, "--experiment", "test"]
    log = tmp_path / "serve.out"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while "curl -s -X POST" not in log.read_text():
            assert proc.poll() is None, f"nextloc serve exited {proc.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"nextloc serve not up in 240 s: {log.read_text()[-3000:]}"
            time.sleep(0.5)
        assert f"at http://127.0.0.1:{port}" in log.read_text()
        status, body = _post(f"http://127.0.0.1:{port}/invocations", two_histories.read_bytes())
        assert status == 200, body
        assert body["predictions"] == cli
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=60) == 0
        with pytest.raises(urllib.error.URLError, match="refused"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
    finally:
        if proc.poll() is None:
            proc.terminate()  # nextloc serve stops its server on SIGTERM too
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.mark.parametrize("kind", ["ranker", "pointer_plus"])
def test_the_in_place_registry_read_answers_as_mlflow_download(store, two_histories, kind, tmp_path):
    """`nextloc predict` reads a SQLite registry's champion in place, without MLflow
    (:func:`tracking.versions.local_bundle`): the same version MLflow resolves and downloads, and exactly the
    same answers (places, probabilities, P(new place)) for a known user's week and an unknown user."""
    import mlflow

    from nextloc.bundle import load_bundle
    from nextloc.predict.answer import predict_visits
    from tracking import mlflow_runs, versions
    from tracking.registered import load_registered, model_uri

    _, uri = store
    in_place = versions.local_bundle(kind, "champion", uri)
    assert in_place is not None
    assert (in_place / "bundle.json").is_file()
    mlflow_runs.configure(uri, "test")
    holder = mlflow.MlflowClient().get_model_version_by_alias(f"nextloc-{kind}", "champion")
    assert versions.local_bundle(kind, str(holder.version), uri) == in_place
    assert versions.local_bundle(kind, "no-such-alias", uri) is None
    downloaded = load_bundle(versions.download_bundle(model_uri(kind, "champion"), tmp_path))
    fast = load_registered(kind, "champion", uri, "test")
    visits = pd.DataFrame(json.loads(two_histories.read_text())["dataframe_records"])
    for history in (visits, visits[visits["user_id"] == 73], visits[visits["user_id"] == 5555]):
        assert predict_visits(fast, history, k=5) == predict_visits(downloaded, history, k=5)


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("predict", ["--history", "HISTORY"]),
        ("evaluate", ["--data-dir", "DATA"]),
        ("serve", ["--port", "PORT", "--timeout", "30"]),
    ],
)
def test_a_model_that_is_not_there_is_one_line(store, two_histories, command, options):
    """Every command that loads a registered model, asked for a kind this store never trained: one line
    naming the model and alias, the store, the models it does hold and the command that trains the one
    asked for; exit 2, no traceback, no work."""
    data_dir, uri = store
    values = {"HISTORY": str(two_histories), "DATA": str(data_dir), "PORT": str(_free_port())}
    args = [values.get(option, option) for option in options]
    result = nextloc(command, "--model", "mhsa", *args, uri=uri, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    (line,) = [line for line in result.stderr.splitlines() if "nextloc-mhsa" in line]
    assert "nextloc-mhsa@champion" in line
    assert uri in line
    for held in (
        "nextloc-markov (champion: v1)",
        "nextloc-pointer_plus",
        "nextloc-ranker",
        "nextloc-ranker_refit",
    ):
        assert held in line
    assert "`nextloc train --model mhsa`" in line


def test_a_version_or_a_store_that_is_not_there_is_one_line(store, two_histories, tmp_path):
    """Another version of a model the store holds, and a store that does not exist (left uncreated)."""
    _, uri = store
    history = ["--history", str(two_histories)]
    version = nextloc("predict", "--model", "ranker", "--alias", "99", *history, uri=uri, check=False)
    assert version.returncode == 2
    assert "Traceback" not in version.stderr
    assert "no nextloc-ranker version 99 in the tracking store" in version.stderr
    assert "nextloc-ranker (champion: v1)" in version.stderr
    missing = tmp_path / "nowhere" / "mlflow.db"
    store_uri = f"sqlite:///{missing}"
    result = nextloc("evaluate", "--model", "ranker", "--data-dir", str(tmp_path), uri=store_uri, check=False)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"no tracking store at {missing}" in result.stderr
    assert "`nextloc train --model ranker`" in result.stderr
    assert not missing.exists()
