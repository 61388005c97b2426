"""The champion rule's statistics: a paired bootstrap and the decision it supports.

The champion rule (:func:`champion_decision`) is the one rule behind the ``champion`` alias: a challenger
model kind, trained over one or more seeds, replaces the champion only if it is better on the same samples
(validation's: test is read by no decision) by at least a minimum effect *and* a paired bootstrap over
those samples says the difference is not noise. NumPy only (no torch): the train flow decides on every
run, a cached one included.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def paired_bootstrap(
    challenger: np.ndarray, champion: np.ndarray, n_boot: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Paired bootstrap over samples of the mean difference ``challenger - champion``.

    Args:
        challenger: ``(N,)`` per-sample outcome (e.g. place reciprocal rank x 100, averaged over seeds).
        champion: ``(N,)`` the same samples' outcome for the champion.
        n_boot: resamples.
        seed: the resampling seed (the test is deterministic).

    Returns:
        ``delta`` (the observed mean difference), ``ci_low`` / ``ci_high`` (95% percentile interval) and
        ``p_value``: the one-sided probability of a difference ``<= 0`` (the share of resampled differences
        that are ``<= 0``, with the +1 correction).
    """
    a = np.asarray(challenger, dtype=np.float64)
    b = np.asarray(champion, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"need two equal, non-empty per-sample arrays, got {a.shape} and {b.shape}")
    diff = a - b
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for start in range(0, n_boot, 256):  # bounded memory: 256 resamples at a time
        stop = min(start + 256, n_boot)
        idx = rng.integers(0, len(diff), size=(stop - start, len(diff)))
        means[start:stop] = diff[idx].mean(axis=1)
    return {
        "delta": float(diff.mean()),
        "ci_low": float(np.quantile(means, 0.025)),
        "ci_high": float(np.quantile(means, 0.975)),
        "p_value": float((1 + np.sum(means <= 0)) / (n_boot + 1)),
    }


def champion_decision(
    challenger: np.ndarray,
    champion: np.ndarray | None,
    groups: np.ndarray | None = None,
    min_effect: float = 0.5,
    alpha: float = 0.05,
    n_boot: int = 2000,
    samples: str = "validation",
) -> dict[str, Any]:
    """The champion rule: replace the champion only for a real, large enough improvement.

    Args:
        challenger: ``(S, N)`` or ``(N,)`` per-sample outcomes of the challenger kind on the decision's
            samples, one row per seed trained (the mean over seeds is compared, so one lucky seed cannot win).
        champion: ``(N,)`` the champion's outcomes on the same samples, or None when there is no champion.
        groups: ``(N,)`` optional label per sample (e.g. whether the sample's user has new data); the mean
            difference is reported per group.
        min_effect: the smallest mean improvement (in the outcome's unit, points) worth a promotion.
        alpha: the largest bootstrap p-value accepted.
        n_boot: bootstrap resamples.
        samples: which samples these are, for the recorded ``test`` (the statistical test's description).

    Returns:
        ``promoted``, ``reason``, ``challenger_score`` and, with a champion, ``champion_score``, ``delta``,
        ``ci_low``, ``ci_high``, ``p_value``, ``min_effect``, ``alpha``, ``test`` and ``groups``
        (``{group: {"n": ..., "delta": ...}}``).
    """
    rows = np.atleast_2d(np.asarray(challenger, dtype=np.float64))
    mean = rows.mean(axis=0)
    decision: dict[str, Any] = {"challenger_score": float(mean.mean()), "seeds": int(rows.shape[0])}
    if champion is None:
        decision.update(promoted=True, reason="no champion yet")
        return decision
    champion = np.asarray(champion, dtype=np.float64)
    stats = paired_bootstrap(mean, champion, n_boot=n_boot)
    decision.update(
        champion_score=float(champion.mean()),
        **stats,
        min_effect=float(min_effect),
        alpha=float(alpha),
        test=f"paired bootstrap over {len(mean)} {samples} samples ({n_boot} resamples), one-sided",
    )
    if groups is not None:
        groups = np.asarray(groups)
        decision["groups"] = {
            str(g): {"n": int((groups == g).sum()), "delta": float((mean - champion)[groups == g].mean())}
            for g in dict.fromkeys(groups.tolist())
        }
    big_enough = stats["delta"] >= min_effect
    significant = stats["p_value"] < alpha
    decision["promoted"] = bool(big_enough and significant)
    decision["reason"] = (
        f"challenger {'better' if decision['promoted'] else 'not better'}: "
        f"{decision['challenger_score']:.2f} vs {decision['champion_score']:.2f} "
        f"(delta {stats['delta']:+.2f}, 95% CI [{stats['ci_low']:+.2f}, {stats['ci_high']:+.2f}], "
        f"p {stats['p_value']:.3f}; needs delta >= {min_effect:g} and p < {alpha:g})"
    )
    return decision
