"""Training: the recipes, the loop, resuming, and one model kind fitted for one seed.

- :mod:`~nextloc.training.train_config`: :class:`~nextloc.training.train_config.TrainConfig`, a recipe.
- :mod:`~nextloc.training.train`: the engine-free loop (the reference recipes for MHSA/LSTM and the pointer).
- :mod:`~nextloc.training.optim`: optimiser, schedules, early stopping; :mod:`~nextloc.training.resume`: resume
  files.
- :mod:`~nextloc.training.data`: samples on the device, batches by index.
- :mod:`~nextloc.training.overrides`: per-kind model and training overrides, checked before any work.
- :mod:`~nextloc.training.fit_kind`: one kind fitted for one seed, whatever its family
  (:class:`~nextloc.training.fit_kind.FittedKind`).
"""
