"""The user's routine and the models that rank it: what each known place has been to the user before *now*.

- :mod:`~nextloc.routine.visits`: the visit log, the questions asked of it, each question's window.
- :mod:`~nextloc.routine.features`: :class:`~nextloc.routine.features.Routine`, features per candidate place.
- :mod:`~nextloc.routine.data`: a dataset's routine and each split's questions; ``ranker_refit``'s cross-fitting.
- :mod:`~nextloc.routine.tally`: a stored routine tally, split by index once.
- :mod:`~nextloc.routine.counts`: counts of keyed events before a time (binary search).
- :mod:`~nextloc.routine.ranking`: the two kinds that rank the routine's places (``routine``, ``ranker``).
- :mod:`~nextloc.routine.calibration`: their scores as probabilities over the known places, fitted on validation.
- :mod:`~nextloc.routine.novelty`: P(new place) as an explicit probability.
- :mod:`~nextloc.routine.trees`: LightGBM's text model read into arrays, scored with numpy.
"""
