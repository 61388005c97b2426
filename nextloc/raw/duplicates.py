"""Trajectories held under several users: find them, report them, and (an option) keep one copy.

GeoLife holds some recordings under two users: 000 and 003 share 129 byte-identical ``.plt`` files, 153
and 163 225, 126 and 167 145 (and 41 other pairs a few each). Their staypoints come out twice, so a test
target can be a second copy of another user's staypoint, in test or in training. Nothing in the
reference protocol notices; this module does, in three places:

* **Files** (:func:`shared_files`): two users share a file when they hold files of identical content
  (the XXH3-128 digest ingestion already takes for its cache keys; names do not matter). Only inputs
  with one folder per user (GeoLife, GPX) have per-user files.
* **Staypoints** (:func:`staypoint_pairs`, :func:`copied_staypoints`): two users share a staypoint when
  both hold one with the same ``started_at``, ``finished_at`` and place. The place is the DBSCAN
  location, ``raw_location_id``: the encoded ``location_id`` folds every place unseen in training into 1,
  so two different new places would look equal. They are found on the final staypoints, the ones the
  samples are made of (this catches copies that are not byte-identical files too).
* **The first copy** of a file or staypoint is the one of the lowest user id; every other one is a copy.
  It is an arbitrary but fixed rule (deterministic, independent of the order users are read in).

Dropping (``duplicates.drop_shared_files``, off by default so the reference protocol stays exact) works
on files, not staypoints: a file held twice is one recording, and dropping its copy before anything is
computed keeps it out of every later step. Dropped later, as staypoints, the copy would still have made
DBSCAN locations (at ``min_samples=2`` a staypoint and its copy form a location by themselves) and still
count in the copying user's tracked extent (the quality filter). Files that differ (a few of 153/163's)
are not dropped; their shared staypoints stay in the report and are flagged in evaluation.

Evaluation (:func:`copied_targets`) flags the test samples whose target is a second copy (a lower user id
holds it: the sample is counted twice) or that another user holds in training or validation (the model has
seen it), so the metrics can be given without them: what stays is the test set one copy of the data gives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from nextloc.storage import read_parquet

#: what makes two staypoints the same (the place is the DBSCAN location, see the module docstring)
STAYPOINT_KEY = ("started_at", "finished_at", "raw_location_id")
#: the columns of the final staypoints this module reads
STAYPOINT_COLUMNS = ("id", "user_id", "split", *STAYPOINT_KEY)

Pair = tuple[int, int]


@dataclass(frozen=True)
class SharedFiles:
    """Files of identical content under several users: per user pair ``(a, b)``, ``a < b``, how many
    distinct contents both hold, and per user the files dropped as copies (relative paths, sorted)."""

    pairs: Mapping[Pair, int] = field(default_factory=dict)
    dropped: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"pairs": [[a, b, n], ...], "dropped": {"<user>": [paths]}}``."""
        return {
            "pairs": [[a, b, n] for (a, b), n in sorted(self.pairs.items())],
            "dropped": {str(user): list(paths) for user, paths in sorted(self.dropped.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SharedFiles:
        """Inverse of :meth:`to_dict`."""
        return cls(
            {(int(a), int(b)): int(n) for a, b, n in data["pairs"]},
            {int(user): tuple(paths) for user, paths in data["dropped"].items()},
        )


def shared_files(hashes: Mapping[int, Mapping[str, str]], drop: bool = False) -> SharedFiles:
    """The file contents several users hold, and (``drop``) the copies to leave out.

    Args:
        hashes: per user, ``{relative path: content digest}`` of every file.
        drop: list, per user, the files whose content a user with a lower id holds too (the first copy,
            the lowest user id's, is kept; a content held twice by one user is not a copy of another's).

    Returns:
        The pairs and their counts of distinct shared contents, and the files to drop (empty unless
        ``drop``).

    Examples:
        >>> shared_files({0: {"a": "x", "b": "y"}, 3: {"c": "x"}}, drop=True)
        SharedFiles(pairs={(0, 3): 1}, dropped={3: ('c',)})
    """
    holders: dict[str, set[int]] = {}
    for user, files in hashes.items():
        for digest in files.values():
            holders.setdefault(digest, set()).add(user)
    pairs: Counter[Pair] = Counter()
    for users in holders.values():
        pairs.update(combinations(sorted(users), 2))
    dropped: dict[int, tuple[str, ...]] = {}
    if drop:
        for user, files in sorted(hashes.items()):
            copies = tuple(sorted(p for p, digest in files.items() if min(holders[digest]) < user))
            if copies:
                dropped[user] = copies
    return SharedFiles(dict(sorted(pairs.items())), dropped)


def first_holders(staypoints: pd.DataFrame) -> np.ndarray:
    """``(N,)`` the lowest user id holding each staypoint's start, end and place (its first copy's user)."""
    return staypoints.groupby(list(STAYPOINT_KEY), sort=False)["user_id"].transform("min").to_numpy()


def copied_staypoints(staypoints: pd.DataFrame) -> np.ndarray:
    """``(N,)`` whether each staypoint is a copy: a user with a lower id holds one with the same start,
    end and place.

    Examples:
        >>> t = pd.Timestamp("2008-01-01", tz="UTC")
        >>> sp = pd.DataFrame({"user_id": [3, 0, 3], "started_at": [t, t, t], "finished_at": [t, t, t],
        ...                    "raw_location_id": [7, 7, 8]})
        >>> copied_staypoints(sp).tolist()
        [True, False, False]
    """
    return staypoints["user_id"].to_numpy() > first_holders(staypoints)


def _held(staypoints: pd.DataFrame) -> pd.DataFrame:
    """The staypoints that several users hold, one row per user and staypoint: ``id``, ``user_id``,
    ``split``, ``group`` (one number per start, end and place) and ``flag``: whether it is a copy in
    evaluation (:func:`copied_targets`: a lower user id holds it, or another user holds it in training or
    validation). Linear in the holders: a staypoint that k users hold is k rows, not k * k pairs."""
    key = list(STAYPOINT_KEY)
    held = staypoints.loc[staypoints.duplicated(key, keep=False), [*key, "id", "user_id", "split"]]
    held = held.drop_duplicates([*key, "user_id"])
    group = held.groupby(key, sort=False).ngroup().to_numpy()
    seen = held["split"].isin(["train", "val"]).to_numpy().astype(np.int64)
    held = held.assign(group=group, seen=seen)
    by_group = held.groupby("group", sort=False)
    first = by_group["user_id"].transform("min").to_numpy()
    seen_elsewhere = by_group["seen"].transform("sum").to_numpy() - seen
    holders = by_group["user_id"].transform("size").to_numpy()
    flag = ((held["user_id"].to_numpy() > first) | (seen_elsewhere > 0)) & (holders > 1)
    return held.drop(columns="seen").assign(flag=flag)


def staypoint_pairs(staypoints: pd.DataFrame) -> dict[Pair, int]:
    """Per user pair ``(a, b)``, ``a < b``: how many staypoints (start, end, place) both hold.

    Counted per set of holders (many staypoints share one set), so the pairs are enumerated once per set.
    """
    held = _held(staypoints)
    holder_sets = Counter(tuple(sorted(users)) for users in held.groupby("group")["user_id"].agg(tuple))
    counts: Counter[Pair] = Counter()
    for users, n in holder_sets.items():
        for a, b in combinations(users, 2):
            counts[(int(a), int(b))] += n
    return dict(sorted(counts.items()))


def copied_targets(staypoints: pd.DataFrame, target_ids: np.ndarray) -> np.ndarray:
    """``(N,)`` whether each target staypoint (by ``id``, the samples' ``staypoint_id``) is a copy for
    evaluation: a user with a lower id holds the same staypoint (a second copy: the sample is counted
    twice), or another user holds it in training or validation (the model has seen it).

    A test target is kept only as the first copy of staypoints that are test targets wherever they are:
    the test set one copy of the data would give, without targets the model saw under another user.
    """
    held = _held(staypoints)
    return np.isin(np.asarray(target_ids), held.loc[held["flag"], "id"].to_numpy())


def _test_pairs(held: pd.DataFrame, test_ids: np.ndarray) -> dict[Pair, int]:
    """Per user pair: the test targets of either user that the other's copy makes a copy."""
    flagged = held[held["flag"] & held["id"].isin(test_ids)]
    twins = flagged.merge(held[["group", "user_id", "split"]], on="group", suffixes=("", "_twin"))
    twins = twins[twins["user_id"] != twins["user_id_twin"]]
    makes_copy = (twins["user_id_twin"] < twins["user_id"]) | twins["split_twin"].isin(["train", "val"])
    twins = twins[makes_copy]
    users = np.sort(twins[["user_id", "user_id_twin"]].to_numpy(), axis=1)
    pairs = pd.DataFrame({"a": users[:, 0], "b": users[:, 1], "id": twins["id"].to_numpy()})
    counts = pairs.drop_duplicates().groupby(["a", "b"]).size()
    return {(int(a), int(b)): int(n) for (a, b), n in counts.items()}


def copied_samples(staypoints_path: Path, samples: pa.Table) -> np.ndarray | None:
    """:func:`copied_targets` of a samples table, from the final staypoints file of its dataset; None when
    that file is missing or the samples name no staypoint (the copies are then not known)."""
    return copied_in_splits(staypoints_path, {"samples": samples})["samples"]


def copied_in_splits(staypoints_path: Path, splits: Mapping[str, pa.Table]) -> dict[str, np.ndarray | None]:
    """:func:`copied_samples` of several samples tables of one dataset, its staypoints file read once."""
    named = {name: table for name, table in splits.items() if "staypoint_id" in table.column_names}
    if not Path(staypoints_path).is_file() or not named:
        return dict.fromkeys(splits)
    staypoints = read_parquet(Path(staypoints_path), columns=list(STAYPOINT_COLUMNS))
    copied = {
        name: copied_targets(staypoints, t.column("staypoint_id").to_numpy()) for name, t in named.items()
    }
    return {name: copied.get(name) for name in splits}


def duplicate_report(
    files: SharedFiles | None, staypoints: pd.DataFrame, test_ids: np.ndarray, drop_shared_files: bool
) -> dict[str, Any]:
    """The ``duplicates`` section of ``ingest_report.json``.

    Args:
        files: what discovery found (None: the input has no per-user files, e.g. CSV).
        staypoints: the final staypoints (:data:`STAYPOINT_COLUMNS`).
        test_ids: the target staypoint id of every test sample.
        drop_shared_files: the option's value (recorded with what it dropped).

    Returns:
        ``pairs`` (one entry per user pair sharing anything: ``users``, ``shared_files``, ``shared_staypoints``,
        ``copied_test_samples``: the test targets of either user that the other's twin makes a copy, see
        :func:`copied_targets`), the totals ``copied_staypoints`` (second copies), ``copied_test_samples``
        (what evaluation leaves out) and ``test_samples``, and ``drop_shared_files`` with ``files_dropped``
        (per user) and ``n_files_dropped``.
    """
    test_ids = np.asarray(test_ids)
    test_pairs = _test_pairs(_held(staypoints), test_ids)
    file_pairs = dict(files.pairs) if files is not None else {}
    sp_pairs = staypoint_pairs(staypoints)
    dropped = dict(files.dropped) if files is not None else {}
    return {
        "pairs": [
            {
                "users": [a, b],
                "shared_files": file_pairs.get((a, b), 0) if files is not None else None,
                "shared_staypoints": sp_pairs.get((a, b), 0),
                "copied_test_samples": test_pairs.get((a, b), 0),
            }
            for a, b in sorted(set(file_pairs) | set(sp_pairs) | set(test_pairs))
        ],
        "copied_staypoints": int(copied_staypoints(staypoints).sum()),
        "copied_test_samples": int(copied_targets(staypoints, test_ids).sum()),
        "test_samples": len(test_ids),
        "drop_shared_files": drop_shared_files,
        "files_dropped": {str(user): len(paths) for user, paths in sorted(dropped.items())},
        "n_files_dropped": sum(len(paths) for paths in dropped.values()),
    }


def describe_pairs(duplicates: Mapping[str, Any], limit: int | None = None) -> str:
    """The pairs in one line, most copied test samples first: ``153/163 (225 files, 510 staypoints, 111 test
    targets); ...``; past ``limit`` pairs, their number and totals.

    Examples:
        >>> describe_pairs({"pairs": [{"users": [0, 3], "shared_files": 2, "shared_staypoints": 5,
        ...                            "copied_test_samples": 1}]})
        '000/003 (2 files, 5 staypoints, 1 test targets)'
    """
    pairs = sorted(
        duplicates["pairs"],
        key=lambda p: (
            -p["copied_test_samples"],
            -p["shared_staypoints"],
            -(p["shared_files"] or 0),
            p["users"],
        ),
    )
    shown, rest = pairs[:limit], pairs[len(pairs) if limit is None else limit :]
    parts = [f"{p['users'][0]:03d}/{p['users'][1]:03d} ({_counts(p)})" for p in shown]
    if rest:
        totals = {
            "shared_files": None if rest[0]["shared_files"] is None else sum(p["shared_files"] for p in rest),
            "shared_staypoints": sum(p["shared_staypoints"] for p in rest),
            "copied_test_samples": sum(p["copied_test_samples"] for p in rest),
        }
        parts.append(f"{len(rest)} more pairs ({_counts(totals)})")
    return "; ".join(parts)


def _counts(pair: Mapping[str, Any]) -> str:
    files = "" if pair["shared_files"] is None else f"{pair['shared_files']} files, "
    return f"{files}{pair['shared_staypoints']} staypoints, {pair['copied_test_samples']} test targets"
