"""nextloc, the library: raw GPS to a next-place predictor, one folder per stage (docs/architecture.md).

Stages, in the pipeline's order (each folder's ``__init__`` is its map):

- :mod:`nextloc.raw`: finding, downloading, unpacking the raw data; new dumps; duplicate trajectories.
- :mod:`nextloc.io`: inputs and formats (GeoLife, CSV, parquet, GPX, visits, trackintel, GeoParquet).
- :mod:`nextloc.preprocessing`: staypoints, quality, locations, 7-day samples, the vocabulary.
- :mod:`nextloc.models`: the kind registry, the networks and the baselines.
- :mod:`nextloc.routine`: the user's routine, the kinds that rank it, P(new place).
- :mod:`nextloc.training`: recipes, the training loop, one kind fitted for one seed.
- :mod:`nextloc.evaluation`: metrics, scoring a split, the leaderboard, the champion rule.
- :mod:`nextloc.predict`: a person's visits or fixes to answers.
- :mod:`nextloc.maps`: answers and datasets on maps: offline web pages (Leaflet) and PNGs.

Shared basics stay at the top: :mod:`~nextloc.config` (the typed preprocessing config),
:mod:`~nextloc.bundle` (the registered models' bundle format), :mod:`~nextloc.storage` and
:mod:`~nextloc.atomic` (deterministic, atomic writes), :mod:`~nextloc.fingerprint` (content hashes),
:mod:`~nextloc.file_lock` (file locks), :mod:`~nextloc.lists` (padded list columns), :mod:`~nextloc.profiles`
(dataset profiles) and :mod:`~nextloc.synth` (seeded synthetic data). The library never imports Prefect or
MLflow.
"""
