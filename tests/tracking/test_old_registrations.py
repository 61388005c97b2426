"""A model registered by earlier code keeps loading and answers as it did.

``tests/golden/registered-markov-v1`` is a ``markov`` model fitted on the GeoLife sample and logged as ``nextloc
train`` registers it (``model.tar.gz``: the models-from-code pyfunc, :mod:`tracking.pyfunc_model` as it was then,
copied into the artifact, and the bundle beside it), with the answers that code gave to four histories (one of
a user the model never saw). ``make_fixture.py`` there wrote it, run with the code of commit 3e7868c,
where the bundle format was ``nextloc.serving``: the logged code still imports that name.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest

from nextloc.bundle import load_bundle
from nextloc.predict.answer import predict_visits

GOLDEN = Path(__file__).parents[1] / "golden" / "registered-markov-v1"


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    return json.loads((GOLDEN / "answers.json").read_text())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The registered model's folder, as MLflow downloads it."""
    root = tmp_path_factory.mktemp("registered")
    with tarfile.open(GOLDEN / "model.tar.gz") as tar:
        tar.extractall(root, filter="data")
    return root / "model"


def _plain(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The answers as the fixture holds them (JSON, times as text)."""
    return json.loads(json.dumps(answers, default=str))


def test_the_old_bundle_loads_and_answers_the_same(recorded, model_dir) -> None:
    bundle = load_bundle(model_dir / "artifacts" / "bundle")
    assert bundle.kind == "markov"
    answers = predict_visits(bundle, pd.DataFrame(recorded["visits"]), k=5, coverage=0.8)
    assert _plain(answers) == recorded["bundle"]


def test_the_old_pyfunc_model_loads_and_answers_the_same(recorded, model_dir) -> None:
    assert "from nextloc.serving import" in (model_dir / "pyfunc_model.py").read_text()
    model = mlflow.pyfunc.load_model(str(model_dir))
    answers = model.predict(pd.DataFrame(recorded["visits"]), params={"k": 3})
    assert _plain(answers) == recorded["pyfunc"]
