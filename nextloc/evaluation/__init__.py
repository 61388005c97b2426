"""Evaluation: scoring a model on a split, the metrics, the leaderboard and the champion rule.

- :mod:`~nextloc.evaluation.evaluate`: a model scored on a split, the new-place head, packed histories.
- :mod:`~nextloc.evaluation.metrics`: the ranking and new-place metrics (numpy);
  :mod:`~nextloc.evaluation.tensor_metrics`: their ranks on torch tensors, per batch.
- :mod:`~nextloc.evaluation.leaderboard`: one leaderboard, three renderings;
  :mod:`~nextloc.evaluation.comparison`: the kinds compared in one chart (the parent run's).
- :mod:`~nextloc.evaluation.champion`: the paired bootstrap behind the champion decision.
"""
