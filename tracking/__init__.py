"""MLflow: where runs, metrics, models and the champion are kept, and reading them back.

- :mod:`tracking.settings`: where the tracking store is, and the flows' ``tracking`` section (no MLflow import).
- :mod:`tracking.access`: the credentials a client sends to the Prefect API and the tracking server.
- :mod:`tracking.mlflow_runs`: the tracking URI, experiment, runs, their metrics and artifacts.
- :mod:`tracking.versions`: the model registry: versions, their bundles, the ``champion`` alias.
- :mod:`tracking.pyfunc_model`: the file MLflow logs as each registered model's code.
- :mod:`tracking.registered`: a registered model read back: bundle, scores, champion maps, leaderboard.
- :mod:`tracking.plots`: the charts each run shows in the MLflow UI.

The only home of ``import mlflow`` (``tests/test_house_limits.py``); it imports :mod:`runtime` and the
:mod:`nextloc` library, never Prefect.
"""
