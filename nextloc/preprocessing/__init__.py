"""Preprocessing, the reference protocol's steps: positionfixes -> staypoints -> locations -> 7-day samples.

- :mod:`~nextloc.preprocessing.staypoints` (+ its numba loops, :mod:`~nextloc.preprocessing.staypoint_kernels`):
  trackintel's sliding method, exact.
- :mod:`~nextloc.preprocessing.quality`: the users' tracking-quality filter.
- :mod:`~nextloc.preprocessing.locations`: DBSCAN locations and staypoint merging.
- :mod:`~nextloc.preprocessing.deployment`: the deployment protocol's locations (the train periods' DBSCAN,
  later staypoints matched to it, noise kept).
- :mod:`~nextloc.preprocessing.sequences`: merged staypoints -> history samples, split by time.
- :mod:`~nextloc.preprocessing.vocabulary`: what the encoded ids mean; one dataset read in another's ids.
- :mod:`~nextloc.preprocessing.dataset`: the dataset-level steps chained (quality -> locations -> samples).
- :mod:`~nextloc.preprocessing.trackintel_export`: a preprocessed dataset exported as trackintel's models.

Preprocessing never imports training, evaluation, the routine or predict (tests/test_house_limits.py).
"""
