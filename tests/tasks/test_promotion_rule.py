"""The champion rule's settings are one typed value, checked when made (tasks.promotion.PromotionRule)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tasks.promotion import DEFAULT_DECISION_METRIC, DEFAULT_MIN_EFFECT, DEFAULT_PROMOTE_METRIC, PromotionRule


def test_the_rule_defaults_to_place_mrr_chosen_on_validation():
    rule = PromotionRule()
    assert rule.promote_metric == DEFAULT_PROMOTE_METRIC
    assert rule.decision_metric == DEFAULT_DECISION_METRIC == "place_mrr"
    assert rule.min_effect == DEFAULT_MIN_EFFECT
    assert rule.match_radius_m == 50.0


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"decision_metric": "place_f1"}, "decision_metric"),  # not a per-sample metric
        ({"promote_metric": "test_place_mrr"}, "promote_metric"),
        ({"min_effect": -0.1}, "min_effect"),
        ({"match_radius_m": 0}, "match_radius_m"),
        ({"min_efect": 1.0}, "min_efect"),  # a misspelt setting is refused, not ignored
    ],
)
def test_a_bad_setting_is_refused_naming_it(settings, field):
    with pytest.raises(ValidationError, match=field):
        PromotionRule(**settings)


def test_the_rule_is_frozen():
    with pytest.raises(ValidationError):
        PromotionRule().min_effect = 2.0  # type: ignore[misc]
