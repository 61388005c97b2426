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
from functools import cached_property

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

    @cached_property
    def _walk(self) -> _Walk:
        """The nodes with one more per leaf that leads to itself, so that the rows of a tree walk as many
        steps as the tree is deep with no bookkeeping of which reached a leaf; trees deepest first."""
        n_nodes, n_leaves = len(self.feature), len(self.leaf_value)
        leaves = n_nodes + np.arange(n_leaves)
        depth = np.zeros(len(self.root), dtype=np.int64)
        tree = np.flatnonzero(self.root >= 0)
        frontier, level = self.root[tree], 0
        while len(frontier):
            level += 1
            depth[tree] = level
            children, tree = np.concatenate([self.left[frontier], self.right[frontier]]), np.r_[tree, tree]
            frontier, tree = children[children >= 0], tree[children >= 0]
        order = np.argsort(-depth, kind="stable")
        start = np.where(self.root >= 0, self.root, n_nodes - 1 - self.root)[order]
        # the next node of node i: child[2 * i] going right, child[2 * i + 1] going left
        right, left = (np.r_[np.where(c >= 0, c, n_nodes - 1 - c), leaves] for c in (self.right, self.left))
        return _Walk(
            order=order,
            start=start,
            deeper=tuple(int((depth > d).sum()) for d in range(level)),
            feature=np.r_[self.feature, np.zeros(n_leaves, dtype=np.int64)],
            threshold=np.r_[self.threshold, np.full(n_leaves, np.inf)],
            child=np.column_stack([right, left]).ravel(),
            default_left=np.r_[self.default_left, np.ones(n_leaves, dtype=bool)],
            missing=np.r_[self.missing, np.zeros(n_leaves, dtype=np.int64)],
            n_nodes=n_nodes,
        )

    def predict(self, features: np.ndarray) -> np.ndarray:
        """``(R,)`` raw scores of ``(R, F)`` feature rows: the sum of every tree's leaf, in tree order."""
        x = np.asarray(features, dtype=np.float64)
        x = np.where(np.abs(x) <= ZERO_THRESHOLD, 0.0, x)  # LightGBM drops near-zero values of a dense row
        walk = self._walk
        plain = not walk.missing.any()  # no node tells missing values apart: NaN is 0 everywhere
        if plain:
            x = np.where(np.isnan(x), 0.0, x)
        n_rows = len(x)
        values = x.T.ravel()  # feature-major: feature f of row r at f * n_rows + r
        column = walk.feature * n_rows
        rows = np.arange(n_rows)
        node = np.repeat(walk.start[:, None], n_rows, axis=1)  # (T, R), trees deepest first
        for deeper in walk.deeper:  # step d: the trees deeper than d (np.take: faster than indexing)
            at = node[:deeper]
            value = values.take(column.take(at) + rows)
            if plain:
                go_left = value <= walk.threshold.take(at)
            else:
                missing = walk.missing.take(at)
                nan = np.isnan(value)
                value = np.where(nan & (missing != MISSING_NAN), 0.0, value)
                is_missing = ((missing == MISSING_ZERO) & (value == 0.0)) | ((missing == MISSING_NAN) & nan)
                go_left = np.where(is_missing, walk.default_left.take(at), value <= walk.threshold.take(at))
            node[:deeper] = walk.child.take(2 * at + go_left)
        leaf = np.empty_like(node)
        leaf[walk.order] = node - walk.n_nodes  # back in tree order
        # LightGBM adds the trees one after another: a running sum from 0, tree by tree
        return np.cumsum(np.vstack([np.zeros((1, len(x))), self.leaf_value[leaf]]), axis=0)[-1]


@dataclass(frozen=True)
class _Walk:
    """:attr:`TreeEnsemble._walk`: node arrays with a self-loop per leaf (leaf ``i`` at ``n_nodes + i``),
    the trees' order (deepest first), their first nodes in that order and, per step, how many trees are
    deeper than it."""

    order: np.ndarray
    start: np.ndarray
    deeper: tuple[int, ...]
    feature: np.ndarray
    threshold: np.ndarray
    child: np.ndarray
    default_left: np.ndarray
    missing: np.ndarray
    n_nodes: int
