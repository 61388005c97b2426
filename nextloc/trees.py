"""LightGBM's text model format read into arrays, and its raw scores computed with numpy.

A registered ``ranker`` answers with a few hundred candidate rows; importing LightGBM for them costs more
than the answer (LightGBM imports scikit-learn when it is installed). :class:`TreeEnsemble` reads the
model text that :meth:`lightgbm.Booster.model_to_string` writes and gives the same raw scores as
``Booster.predict`` (LightGBM's ``GBDT::PredictRaw``): each tree's leaf for every row, numerical splits
``value <= threshold`` with LightGBM's missing-value rules, the trees' outputs added in tree order in
float64. A model this does not cover (categorical or linear trees, several trees per iteration, averaged
output) is refused by :meth:`TreeEnsemble.parse`, and the caller uses LightGBM itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ZERO_THRESHOLD = float(np.float32(1e-35))  # LightGBM's kZeroThreshold: |x| at most this counts as 0
DEFAULT_LEFT = 2  # decision_type bit: a missing value goes left
MISSING_ZERO, MISSING_NAN = 1, 2  # decision_type bits 2-3: what counts as missing


@dataclass(frozen=True)
class TreeEnsemble:
    """Every tree's nodes in one set of arrays (node ``i`` of tree ``t`` at ``offset[t] + i``).

    ``left``/``right``: the next node's global index, or ``-1 - leaf`` for a leaf (a global leaf index);
    ``root``: ``(T,)`` each tree's first node, or ``-1 - leaf`` for a tree that is a single leaf.
    """

    root: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    default_left: np.ndarray
    missing: np.ndarray
    leaf_value: np.ndarray

    @classmethod
    def parse(cls, text: str) -> TreeEnsemble | None:
        """The trees of a LightGBM model text, or None for a model outside what this module covers."""
        header, *blocks = text.split("\nTree=")
        fields = dict(line.split("=", 1) for line in header.splitlines() if "=" in line)
        if fields.get("num_tree_per_iteration", "1") != "1" or "average_output" in header.splitlines():
            return None
        trees = [dict(line.split("=", 1) for line in b.split("\n\n", 1)[0].splitlines()[1:]) for b in blocks]
        if any(t.get("num_cat", "0") != "0" or t.get("is_linear", "0") != "0" for t in trees):
            return None
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("f", "thr", "dt", "l", "r", "leaf")}
        roots, nodes, leaves = [], 0, 0
        for tree in trees:
            leaf = np.array(tree["leaf_value"].split(), dtype=np.float64)
            if int(tree["num_leaves"]) == 1:
                roots.append(-1 - leaves)
            else:
                roots.append(nodes)
                parts["f"].append(np.array(tree["split_feature"].split(), dtype=np.int64))
                parts["thr"].append(np.array(tree["threshold"].split(), dtype=np.float64))
                parts["dt"].append(np.array(tree["decision_type"].split(), dtype=np.int64))
                for side, key in (("l", "left_child"), ("r", "right_child")):
                    child = np.array(tree[key].split(), dtype=np.int64)
                    parts[side].append(np.where(child >= 0, child + nodes, child - leaves))
                nodes += len(parts["f"][-1])
            parts["leaf"].append(leaf)
            leaves += len(leaf)
        joined = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in parts.items()}
        return cls(
            root=np.array(roots, dtype=np.int64),
            feature=joined["f"],
            threshold=joined["thr"].astype(np.float64),
            left=joined["l"],
            right=joined["r"],
            default_left=(joined["dt"] & DEFAULT_LEFT) > 0,
            missing=(joined["dt"] >> 2) & 3,
            leaf_value=joined["leaf"].astype(np.float64),
        )

    def predict(self, features: np.ndarray) -> np.ndarray:
        """``(R,)`` raw scores of ``(R, F)`` feature rows: the sum of every tree's leaf, in tree order."""
        x = np.asarray(features, dtype=np.float64)
        x = np.where(np.abs(x) <= ZERO_THRESHOLD, 0.0, x)  # LightGBM drops near-zero values of a dense row
        rows = np.arange(len(x))
        node = np.repeat(self.root[:, None], len(x), axis=1)  # (T, R)
        row = np.broadcast_to(rows, node.shape)
        active = np.flatnonzero(node.ravel() >= 0)
        flat = node.ravel()
        while len(active):
            at = flat[active]
            value = x[row.ravel()[active], self.feature[at]]
            missing = self.missing[at]
            nan = np.isnan(value)
            value = np.where(nan & (missing != MISSING_NAN), 0.0, value)
            is_missing = ((missing == MISSING_ZERO) & (value == 0.0)) | ((missing == MISSING_NAN) & nan)
            go_left = np.where(is_missing, self.default_left[at], value <= self.threshold[at])
            flat[active] = np.where(go_left, self.left[at], self.right[at])
            active = active[flat[active] >= 0]
        values = self.leaf_value[-1 - node]
        total = np.zeros(len(x))
        for tree_values in values:  # LightGBM adds the trees one after another
            total += tree_values
        return total
