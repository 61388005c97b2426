"""The registered model, as MLflow code (models-from-code): visits in, named next places out.

MLflow logs this file itself as the model's code (``mlflow.pyfunc.log_model(python_model=<this file>)``)
and the model bundle (:mod:`nextloc.bundle`: JSON config, safetensors weights, parquet vocabulary) as its
artifact, so nothing is pickled. ``mlflow models serve -m models:/nextloc-<kind>@champion --env-manager
local`` answers ``POST /invocations`` with this model: the input is a DataFrame of visits (``user_id``,
``started_at``, ``finished_at``, ``latitude``, ``longitude``, optional ``history_id``; times ISO 8601, UTC
without a zone), the params ``k`` (places per answer), ``at`` (prediction time, default the end of each
history's last visit) and ``coverage`` (also the answer set holding this probability, 0 < coverage < 1), the
output one answer per history (:func:`nextloc.predict.answer.predict`).

It imports only MLflow and the ``nextloc`` library, so the serving process needs neither Prefect nor this
repository's ``tasks`` package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.pyfunc import PythonModel

from nextloc.bundle import BUNDLE_ARTIFACT


class NextPlaceModel(PythonModel):
    """Visits -> the top-k next known places with coordinates and P(new place)."""

    def load_context(self, context) -> None:
        from nextloc.bundle import load_bundle

        self.bundle = load_bundle(Path(context.artifacts[BUNDLE_ARTIFACT]))

    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None):
        from nextloc.predict.answer import predict_visits

        params = params or {}
        try:
            return predict_visits(
                self.bundle,
                pd.DataFrame(model_input),
                k=int(params.get("k", 5)),
                at=params.get("at") or None,
                coverage=params.get("coverage"),
            )
        except ValueError as err:  # bad input: a 400 whose message names the row and the field
            raise MlflowException.invalid_parameter_value(str(err)) from err


mlflow.models.set_model(NextPlaceModel())
