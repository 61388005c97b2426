"""The metrics' names (:mod:`nextloc.metrics` computes them): importable without torch, e.g. by the model
registry's readers that answer requests."""

from __future__ import annotations

TOPK = (1, 5, 10)
NDCG_K = 10
# The one metric list: every surface (results.json, MLflow, leaderboards, summaries) reads these, headline first.
REFERENCE_KEYS = ("acc@1", "acc@5", "acc@10", "mrr", "ndcg@10", "f1")
PLACE_KEYS = tuple(f"place_{key}" for key in REFERENCE_KEYS)
NEW_PLACE_KEYS = ("new_place_rate", "new_place_auc", "new_place_brier")
RESULT_KEYS = (*PLACE_KEYS, *NEW_PLACE_KEYS, *REFERENCE_KEYS)
HEADLINE = "place_acc@1"
METRIC_KEYS = (*RESULT_KEYS, "n")
# The place rank metrics again over the test samples whose target is not a copy of another user's staypoint
# (nextloc.duplicates), with their count ``n_test_dedup``: results.json, the run's MLflow metrics, the summary.
DEDUP_KEYS = tuple(f"{key}_dedup" for key in PLACE_KEYS if key != "place_f1")
DEDUP_HEADLINE = f"{HEADLINE}_dedup"
