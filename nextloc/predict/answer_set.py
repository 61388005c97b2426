"""An answer as a set: the fewest places (and "a new place" when it belongs) that hold the next one with a
given probability (``nextloc predict --coverage 0.9``, the served model's ``coverage`` param).

The set is read from the answer's one distribution over "a new place" and the known places: a routine kind's
as it is (its places share ``1 - p_new_place``), any other kind's place probabilities times ``1 -
p_new_place`` beside ``p_new_place`` (without a new-place head, the places alone). Which classes are taken
is :func:`nextloc.evaluation.metrics.fewest_holding`, the rule the test split's ``set_coverage_*`` and
``set_size_*`` metrics measure: the most likely first (ties: "a new place", then the lower place id) until
their probabilities sum to the level; never empty.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from nextloc.evaluation.metrics import fewest_holding
from nextloc.preprocessing.sequences import UNSEEN

__all__ = ["answer_set", "check_coverage", "describe_set", "set_members"]

NEW_PLACE = "new place"  # how a text names the "a new place" member


def check_coverage(coverage: float) -> float:
    """``coverage`` as a float if it is a probability strictly between 0 and 1.

    Raises:
        ValueError: naming the value (0 would be an empty answer, 1 every place).
    """
    try:
        value = float(coverage)
    except (TypeError, ValueError):
        raise ValueError(f"coverage must be a number strictly between 0 and 1, got {coverage!r}") from None
    if not (math.isfinite(value) and 0.0 < value < 1.0):
        raise ValueError(f"coverage must be a number strictly between 0 and 1, got {coverage!r}")
    return value


def set_members(
    places: np.ndarray, p_new: np.ndarray | None, shared: bool, coverage: float
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The answer sets of a batch of answers: per answer, its members' classes (``1``: a new place, ``>= 2``:
    a place) and their probabilities, the most likely first.

    Args:
        places: ``(b, P)`` the answers' place probabilities, place ``c`` in column ``c - 2``.
        p_new: ``(b,)`` P(new place), or None (no new-place head: "a new place" is never a member).
        shared: the places already share ``1 - p_new`` (a routine kind's one distribution); else they sum to
            1 among themselves and are scaled by ``1 - p_new``.
        coverage: the probability each set holds, strictly between 0 and 1 (:func:`check_coverage`, where
            the request comes in).
    """
    places = np.asarray(places, dtype=np.float64)
    if p_new is None:
        new = np.zeros(len(places))
    else:
        new = np.asarray(p_new, dtype=np.float64)
        places = places if shared else places * (1.0 - new)[:, None]
    dist = np.column_stack([new, places])  # class c in column c - 1
    order, size = fewest_holding(dist, coverage)
    return [
        (row[:n] + UNSEEN, probs[row[:n]]) for row, n, probs in zip(order, size.tolist(), dist, strict=True)
    ]


def answer_set(
    coverage: float,
    classes: np.ndarray,
    probabilities: np.ndarray,
    details: Mapping[int, Mapping[str, Any]],
) -> dict[str, Any]:
    """One answer's set as JSON: ``coverage``, ``total_probability`` and ``members`` (a place:
    ``location_id``, its ``details`` (centre, visits) and ``probability``; a new place: ``new_place: true``
    and ``probability``), the most likely first."""
    members = [
        {"new_place": True, "probability": round(p, 6)}
        if c == UNSEEN
        else {"location_id": c, **details.get(c, {}), "probability": round(p, 6)}
        for c, p in zip(np.asarray(classes).tolist(), np.asarray(probabilities, float).tolist(), strict=True)
    ]
    total = round(float(np.sum(probabilities)), 6)
    return {"coverage": coverage, "total_probability": total, "members": members}


def describe_set(answer: Mapping[str, Any], most: int = 6) -> str | None:
    """One line naming an answer's set (the command's table, the maps), or None without one:
    ``90% set, total 0.912: places 13, 18 and a new place``; past ``most`` places, the first ones and a
    count (``20 places (13, 18, 20, 21, 25, 31, ...)``)."""
    chosen = answer.get("answer_set")
    if not chosen:
        return None
    ids = [str(m["location_id"]) for m in chosen["members"] if not m.get("new_place")]
    names = []
    if len(ids) > most:
        names.append(f"{len(ids)} places ({', '.join(ids[:most])}, ...)")
    elif ids:
        names.append(f"place{'s' if len(ids) > 1 else ''} {', '.join(ids)}")
    if any(m.get("new_place") for m in chosen["members"]):
        names.append(f"a {NEW_PLACE}")
    level = f"{100 * chosen['coverage']:g}%"
    return f"{level} set, total {chosen['total_probability']:.3f}: {' and '.join(names)}"
