"""From what a user has (visits or raw GPS fixes) to the next places, named, with coordinates.

A model knows encoded ids; a user's app has GPS fixes or visits. A recent history becomes the model's input
exactly as preprocessing builds it, and the model's output becomes answers people can use:

1. **Read** a history (:func:`nextloc.predict.history_reader.read_history`): visits (``user_id``, ``started_at``,
   ``finished_at``, ``latitude``, ``longitude``; CSV, parquet or JSON), raw positionfixes (a ``.plt`` file,
   a folder of them, or CSV/parquet of ``tracked_at``, ``latitude``, ``longitude``), or a samples parquet of
   the dataset. Every row is checked (:mod:`nextloc.io.visits`): a bad row is an error naming the file, the
   row and the field.
2. **Positionfixes -> visits** with the dataset's own staypoint parameters
   (:func:`nextloc.predict.history_reader.visits_from_positionfixes`).
3. **Visits -> a history in the model's ids** (:func:`nextloc.predict.histories.encode_visits`): activities at the
   nearest known place, merged, windowed and time-featured as in preprocessing.
4. **Score** many histories at once in batches (:func:`predict`, this module): the top-k known places
   (ids ``>= 2`` only, probabilities renormalised over places), each with its location id, centre and number
   of visits in the training data, and ``p_new_place`` from the model's new-place head; with a coverage,
   the answer set too (:mod:`nextloc.predict.answer_set`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from nextloc.bundle import ModelBundle, top_k
from nextloc.io.visits import parse_time, validate_visits
from nextloc.predict.answer_set import answer_set, check_coverage, set_members
from nextloc.predict.histories import Histories, encode_visits
from nextloc.preprocessing.sequences import FIRST_PLACE
from nextloc.routine.novelty import novelty_features_numpy, with_new_place

__all__ = ["example_visits", "predict", "predict_visits", "visits_at_centres"]


def predict(
    bundle: ModelBundle,
    histories: Histories,
    k: int = 5,
    batch_size: int = 2048,
    progress: bool = False,
    coverage: float | None = None,
) -> list[dict[str, Any]]:
    """Answers for every history: the top-``k`` known places and P(new place), in the input's order.

    Args:
        bundle: the model.
        histories: from :func:`nextloc.predict.histories.encode_visits` (or :func:`~nextloc.predict.histories.sample_histories`).
        k: places per answer.
        batch_size: histories scored at once.
        progress: show a progress bar (on stderr).
        coverage: also answer with a set: the fewest places (and "a new place" when it belongs) holding the
            next one with this probability, strictly between 0 and 1 (:mod:`nextloc.predict.answer_set`).

    Returns:
        One dict per history: its meta fields, ``p_new_place`` (when the model has a new-place head) and
        ``places``: ``rank``, ``location_id`` (>= 2), ``probability`` (over places; a routine kind's are its
        one distribution's, which give the known places ``1 - p_new_place`` in all) and, with a vocabulary,
        ``latitude``, ``longitude`` and ``n_visits`` (staypoints at this place in the training data); with
        ``coverage``, ``answer_set`` (:func:`nextloc.predict.answer_set.answer_set`).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    coverage = None if coverage is None else check_coverage(coverage)
    routine = _routine_answers(bundle, histories)
    score = _network_scores(bundle) if routine is None else _routine_scores(bundle, *routine)
    n = len(histories.packed)
    ranked: list[np.ndarray] = []
    probabilities: list[np.ndarray] = []
    p_new: list[np.ndarray] = []
    sets: list[tuple[np.ndarray, np.ndarray]] = []
    columns = [TextColumn("scoring histories"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
    bar_console = Console(stderr=True)  # stdout is for the answers
    with Progress(*columns, console=bar_console, disable=not progress, transient=True) as bar:
        task = bar.add_task("score", total=n)
        for start in range(0, n, batch_size):
            chunk = histories.packed[start : start + batch_size]
            width = max(int((chunk[:, :, 0] != 0).sum(axis=1).max()), 1)
            probs, p = score(np.ascontiguousarray(chunk[:, :width]), slice(start, start + batch_size))
            if p is not None:
                p_new.append(p)
            places = probs[:, FIRST_PLACE:].astype(np.float64)
            shared = routine is not None and p is not None  # a routine kind's answer is one distribution
            if not shared:
                places /= np.clip(places.sum(axis=1, keepdims=True), 1e-12, None)
            top = top_k(places, k)
            ranked.append(np.array([[loc + FIRST_PLACE for loc, _ in row] for row in top], dtype=np.int64))
            probabilities.append(np.array([[p for _, p in row] for row in top]))
            if coverage is not None:
                sets += set_members(places, p, shared, coverage)
            bar.advance(task, len(chunk))
    ranked_all, probabilities_all = np.concatenate(ranked), np.concatenate(probabilities)
    return _answers(bundle, histories.meta, ranked_all, probabilities_all, p_new, (coverage, sets))


Scores = Callable[[np.ndarray, slice], tuple[np.ndarray, np.ndarray | None]]


def _network_scores(bundle: ModelBundle) -> Scores:
    """Packed histories ``(b, T, 6)`` (rows ``rows`` of the request) -> ``(b, V)`` float32 probabilities
    and P(new place) (None without a new-place head), from a network or baseline's scorer."""
    import torch  # torch: networks and baselines only

    from nextloc.models.packed import packed_batch
    from nextloc.routine.novelty import novelty_features

    def score(chunk: np.ndarray, rows: slice) -> tuple[np.ndarray, np.ndarray | None]:
        packed = torch.from_numpy(chunk)
        with torch.no_grad():
            probs = bundle.scorer(packed)  # (b, V)
            if bundle.head is None:
                return probs.numpy(), None
            batch = packed_batch(packed, bundle.preprocess.samples.duration_cap_min)
            features = novelty_features(probs.clamp(min=1e-30).log(), batch).numpy().astype(np.float64)
        return probs.numpy(), bundle.head.predict(features)

    return score


def _routine_scores(bundle: ModelBundle, logp: np.ndarray, explore: np.ndarray) -> Scores:
    """:func:`_network_scores` for a routine kind, whose answers to every history are ``logp`` ``(H, V)``
    and its explore features ``explore`` ``(H, E)`` (numpy only)."""

    def score(chunk: np.ndarray, rows: slice) -> tuple[np.ndarray, np.ndarray | None]:
        # float32 exp computed in float64: torch's float32 exp, which answered before, in all but ~1% of values
        probs = np.exp(logp[rows].astype(np.float64)).astype(np.float32)
        if bundle.head is None:
            return probs, None
        features = novelty_features_numpy(np.log(np.maximum(probs, np.float32(1e-30))), chunk[:, :, 0])
        p_new = bundle.head.predict(np.column_stack([features.astype(np.float64), explore[rows]]))
        # one distribution: P(new place) and the places sharing 1 - P(new) (nextloc.routine.novelty.with_new_place)
        return np.exp(with_new_place(logp[rows], p_new).astype(np.float64)).astype(np.float32), p_new

    return score


def _routine_answers(bundle: ModelBundle, histories: Histories) -> tuple[np.ndarray, np.ndarray] | None:
    """A routine kind's log-probabilities and explore features for every history (None: not a routine
    kind, whose scorer reads the packed histories)."""
    if bundle.routine is None:
        return None
    if histories.visits is None:
        raise ValueError(
            f"the {bundle.kind} model answers from visits or positionfixes (it reads the user's whole past), "
            "not from a samples table or packed histories"
        )
    return bundle.routine.answer(histories.visits, histories.packed[:, 0, 5], histories.at)


def predict_visits(
    bundle: ModelBundle,
    visits: pd.DataFrame,
    k: int = 5,
    at: str | pd.Timestamp | None = None,
    coverage: float | None = None,
) -> list[dict[str, Any]]:
    """Visits (a DataFrame, e.g. from an HTTP request) -> answers: :func:`validate_visits`,
    :func:`encode_visits`, :func:`predict` (``coverage``: with the answer set)."""
    checked = validate_visits(visits, "request")
    stamp = None if at is None or at == "" else parse_time(at, "request", "at")
    return predict(bundle, encode_visits(checked, bundle, stamp), k, coverage=coverage)


def _answers(
    bundle: ModelBundle,
    meta: pd.DataFrame,
    ranked: np.ndarray,
    probs: np.ndarray,
    p_new: Sequence[np.ndarray],
    sets: tuple[float | None, Sequence[tuple[np.ndarray, np.ndarray]]] = (None, ()),
) -> list[dict[str, Any]]:
    """The answers' dicts; ``sets``: the coverage and each answer's set members (:func:`set_members`)."""
    coverage, members = sets
    wanted = np.unique(np.concatenate([ranked.ravel(), *(classes for classes, _ in members)]))
    details = _place_details(bundle.locations, wanted)
    p_new_all = np.concatenate(p_new) if p_new else None
    records = meta.to_dict(orient="records")
    answers = []
    for i, record in enumerate(records):
        answer = {key: _plain(value) for key, value in record.items()}
        if p_new_all is not None:
            answer["p_new_place"] = round(float(p_new_all[i]), 6)
        answer["places"] = [
            {
                "rank": r + 1,
                "location_id": int(loc),
                **details.get(int(loc), {}),
                "probability": round(float(p), 6),
            }
            for r, (loc, p) in enumerate(zip(ranked[i], probs[i], strict=True))
        ]
        if coverage is not None:
            answer["answer_set"] = answer_set(coverage, *members[i], details)
        answers.append(answer)
    return answers


def _place_details(locations: pd.DataFrame | None, wanted: np.ndarray) -> dict[int, dict[str, Any]]:
    """Centre and training visits of each wanted location the vocabulary knows (by ``loc_index``)."""
    if locations is None or not len(locations):
        return {}
    index = locations["loc_index"].to_numpy(np.int64)
    order = np.argsort(index, kind="stable")
    pos = np.minimum(np.searchsorted(index[order], wanted), len(index) - 1)
    rows = order[pos]
    lat = locations["latitude"].to_numpy(np.float64)
    lon = locations["longitude"].to_numpy(np.float64)
    # visits the model learnt from (bundles written before that column: all staypoints)
    counts = locations["n_train_visits" if "n_train_visits" in locations else "n_staypoints"].to_numpy()
    details = {}
    for loc, row, found in zip(wanted.tolist(), rows.tolist(), index[rows] == wanted, strict=True):
        if found and lat[row] == lat[row]:  # a location the vocabulary knows
            details[loc] = {
                "latitude": round(float(lat[row]), 6),
                "longitude": round(float(lon[row]), 6),
                "n_visits": int(counts[row]),
            }
    return details


EXAMPLE_COLUMNS = ("user_id", "location_id", "started_at", "finished_at")  # what example_visits reads


def example_visits(staypoints: pd.DataFrame, locations: pd.DataFrame, n: int = 6) -> pd.DataFrame:
    """A few real visits in the input format (a registered model's input example): the last ``n``
    staypoints of the first user at known locations (:func:`visits_at_centres`).

    Args:
        staypoints: a dataset's final staypoints (``user_id``, ``location_id``, ``started_at``, ...).
        locations: its location vocabulary.
    """
    known = staypoints[staypoints["location_id"] >= FIRST_PLACE]
    user = known[known["user_id"] == known["user_id"].iloc[0]].sort_values("started_at").tail(n)
    return visits_at_centres(user, locations)


def visits_at_centres(staypoints: pd.DataFrame, locations: pd.DataFrame) -> pd.DataFrame:
    """A dataset's staypoints at known locations as visits in the input format: each at its location's
    centre (the dataset keeps no staypoint's own coordinates), times as ISO text (UTC).

    Args:
        staypoints: final staypoints with ``location_id >= 2`` (a new place has no centre).
        locations: the dataset's location vocabulary (``loc_index``, ``latitude``, ``longitude``).
    """
    centres = locations.set_index("loc_index").loc[staypoints["location_id"].to_numpy()]
    return pd.DataFrame(
        {
            "user_id": staypoints["user_id"].to_numpy(np.int64),
            "started_at": staypoints["started_at"].dt.strftime("%Y-%m-%dT%H:%M:%SZ").to_numpy(),
            "finished_at": staypoints["finished_at"].dt.strftime("%Y-%m-%dT%H:%M:%SZ").to_numpy(),
            "latitude": centres["latitude"].to_numpy(np.float64),
            "longitude": centres["longitude"].to_numpy(np.float64),
        }
    )


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value
