"""Training: the loop, resuming, and one model kind fitted for one seed.

- :mod:`~nextloc.training.train`: the engine-free loop (the reference recipes for MHSA/LSTM and the pointer).
- :mod:`~nextloc.training.optim`: optimiser, schedules, early stopping; :mod:`~nextloc.training.resume`: resume
  files.
- :mod:`~nextloc.training.overrides`: per-kind model and training overrides, checked before any work.
- :mod:`~nextloc.training.fit_kind`: one kind fitted for one seed, whatever its family
  (:class:`~nextloc.training.fit_kind.FittedKind`).
- :mod:`~nextloc.training.kernels`: which kernels computed a run's floats, and the device it trained on.

The recipes (:class:`~nextloc.models.train_config.TrainConfig`) and the batches the models read
(:mod:`nextloc.models.batch`) live one floor down, with the models.
"""
