"""The pipeline's Prefect tasks, thin: each reads its inputs through :mod:`runtime.catalog`, calls the
:mod:`nextloc` library, and records through :mod:`tracking`.

- :mod:`tasks.preprocess`: raw GPS to staypoints, locations, samples (per user where it can).
- :mod:`tasks.train`: one training of one kind and seed, registered as a bundle.
- :mod:`tasks.promotion`: the champion decision per kind.
- :mod:`tasks.pipeline`: where the input is, and the run's summary.
- :mod:`tasks.dumps`: new trajectory dumps merged into the raw folder.
"""
