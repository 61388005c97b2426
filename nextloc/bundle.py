"""The registered models' format: packed histories in, probabilities out; weights and config as plain data.

Registries want one array in and one array out: packed histories (:mod:`nextloc.models.packed`, an int64
array ``(B, T, 6)``); :class:`~nextloc.models.scorer.PackedScorer` turns
it into ``(B, total_loc_num)`` probabilities (a routine kind answers visits instead: :mod:`nextloc.routine.ranking`).

A trained model is stored as a *bundle*, a folder that can be read without trusting its author (nothing
pickled, no code): ``bundle.json`` (the model kind and config, the dataset's full preprocessing config, the
match radius and the new-place head, all plain JSON), ``weights.safetensors`` (a neural model's state dict,
or a baseline's fitted arrays) and ``vocabulary/locations.parquet`` / ``users.parquet`` (what the encoded
ids mean). :func:`save_bundle` writes one, :func:`load_bundle` reads it back into a :class:`ModelBundle`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from nextloc.config import DEFAULT_MATCH_RADIUS_M, PreprocessConfig
from nextloc.models import registry
from nextloc.preprocessing.vocabulary import place_centres, place_popularity
from nextloc.routine.answerer import RoutineAnswerer
from nextloc.routine.novelty import NewPlaceHead
from nextloc.routine.ranking import CandidateScorer, scorer_from_state
from nextloc.routine.tally import TALLY_SCHEMA
from nextloc.routine.unseen import read_tally
from nextloc.storage import write_json, write_parquet, write_parquet_parts, write_with

if TYPE_CHECKING:
    from torch import nn

    from nextloc.models.scorer import PackedScorer

BUNDLE_FORMAT = 1
BUNDLE_FILE = "bundle.json"
WEIGHTS_FILE = "weights.safetensors"
RANKER_FILE = "ranker.txt"  # a routine ranker's trees, LightGBM's own text format
TALLY_FILE = "profile.parquet"  # a routine kind's users' tally (nextloc.routine.tally); the name registered bundles have
VOCABULARY_DIR = "vocabulary"
BUNDLE_ARTIFACT = "bundle"  # the bundle's name among a registered model's artifacts


def top_k(probabilities: np.ndarray, k: int = 5) -> list[list[tuple[int, float]]]:
    """The ``k`` most likely locations per row as ``(location_id, probability)``, ties by lower id."""
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return [[(int(c), float(probabilities[r, c])) for c in row] for r, row in enumerate(order)]


@dataclass(frozen=True)
class ModelBundle:
    """A trained model with everything needed to answer a user: see the module docstring.

    Attributes:
        kind: the model kind (``pointer_plus``, ``markov``, ...).
        scorer: packed histories -> probabilities, with the dataset's duration cap.
        preprocess: the full preprocessing config of the dataset the model was trained on.
        head: the new-place head (None for a model stored without one).
        locations: the location vocabulary (``loc_index``, ``raw_location_id``, ``latitude``, ``longitude``,
            ``n_staypoints``), or None.
        users: the user vocabulary (``user_index``, ``user_id``, ...), or None.
        match_radius_m: a visit within this many metres of a location's centre is that location.
        routine: a routine kind's model and tally (then ``scorer`` is None: it answers visits, not
            packed histories).
    """

    kind: str
    scorer: PackedScorer | None
    preprocess: PreprocessConfig
    head: NewPlaceHead | None
    locations: pd.DataFrame | None
    users: pd.DataFrame | None
    match_radius_m: float = DEFAULT_MATCH_RADIUS_M
    routine: RoutineAnswerer | None = None

    @property
    def max_history(self) -> int | None:
        """The longest history the model accepts (a pointer model's ``max_seq_len``; the shortest over an
        ensemble's members), None if unbounded."""
        if self.scorer is None:
            return None
        from nextloc.models.ensemble import SeedEnsemble  # torch: a network's bundle only

        model = self.scorer.model
        members = model.members if isinstance(model, SeedEnsemble) else [model]
        limits = [getattr(getattr(m, "config", None), "max_seq_len", None) for m in members]
        limits = [limit for limit in limits if limit is not None]
        return min(limits) if limits else None


def match_radius(preprocess: PreprocessConfig) -> float:
    """The radius a bundle matches a visit to a known location with: its dataset's
    ``locations.match_radius_m`` (under the deployment protocol, the radius its samples' later staypoints
    were matched with; :data:`DEFAULT_MATCH_RADIUS_M` by default)."""
    return preprocess.locations.match_radius_m


def save_bundle(
    folder: Path,
    kind: str,
    model: nn.Module | CandidateScorer,
    preprocess: PreprocessConfig,
    head: NewPlaceHead | None = None,
    locations: pd.DataFrame | None = None,
    users: pd.DataFrame | None = None,
    match_radius_m: float | None = None,
    tally: pd.DataFrame | Iterable[pd.DataFrame] | None = None,
) -> Path:
    """Write a model bundle (see the module docstring) into ``folder``; every file is written atomically.

    Args:
        folder: the bundle folder (created).
        kind: the model kind.
        model: a neural model (with a ``config`` dataclass), a :class:`~nextloc.models.baselines.BaselineModule`
            or a routine kind's scorer (:mod:`nextloc.routine.ranking`).
        preprocess: the dataset's preprocessing config.
        head: the model's new-place head.
        locations: the dataset's location vocabulary.
        users: the dataset's user vocabulary.
        match_radius_m: the radius used to map a visit to a known location (default:
            :func:`match_radius` of ``preprocess``).
        tally: a routine kind's users' tally (:meth:`nextloc.routine.features.Routine.tally`), or its parts
            (``tally_parts``: written one at a time).

    Returns:
        ``folder``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if kind in registry.kinds("routine"):
        spec = _save_routine(folder, kind, model, tally, locations)
    else:
        from nextloc.models.scorer import save_network  # torch: networks and baselines only

        spec = save_network(folder / WEIGHTS_FILE, kind, model)
    write_json(
        {
            "format": BUNDLE_FORMAT,
            "kind": kind,
            "model": spec,
            "preprocess": preprocess.model_dump(mode="json"),
            "match_radius_m": float(match_radius(preprocess) if match_radius_m is None else match_radius_m),
            "new_place_head": head.to_dict() if head is not None else None,
        },
        folder / BUNDLE_FILE,
    )
    for name, frame in (("locations", locations), ("users", users)):
        if frame is not None:
            write_parquet(frame, folder / VOCABULARY_DIR / f"{name}.parquet")
    return folder


def _save_routine(folder: Path, kind: str, model, tally, locations) -> dict[str, Any]:
    if tally is None or locations is None:
        raise ValueError(f"a {kind!r} bundle needs the users' tally and the location vocabulary")
    state = dict(model.state())
    trees = state.pop("model", None)
    if trees is not None:
        write_with(lambda tmp: Path(tmp).write_text(trees), folder / RANKER_FILE)
    write_parquet_parts(
        [tally] if isinstance(tally, pd.DataFrame) else tally, TALLY_SCHEMA, folder / TALLY_FILE
    )
    return {"family": "routine", "state": state, "log_prob_output": True}


def _load_routine(folder: Path, kind: str, spec: dict[str, Any], preprocess, locations) -> RoutineAnswerer:
    if kind not in registry.kinds("routine"):
        raise ValueError(f"{folder / BUNDLE_FILE}: field 'kind' {kind!r} is not a routine kind")
    if locations is None:
        raise ValueError(f"{folder}: a {kind!r} bundle needs {VOCABULARY_DIR}/locations.parquet")
    state = dict(spec["state"])
    if (folder / RANKER_FILE).is_file():
        state["model"] = (folder / RANKER_FILE).read_text()
    num_places = int(locations["loc_index"].max()) + 1
    tally, unseen = read_tally(folder / TALLY_FILE)
    return RoutineAnswerer(
        model=scorer_from_state(kind, state),
        tally=tally,
        num_places=num_places,
        centres=place_centres(locations, num_places),
        popularity=place_popularity(locations, num_places),
        timezone=preprocess.timezone,
        unseen=unseen,
    )


def load_bundle(folder: Path) -> ModelBundle:
    """Read a bundle written by :func:`save_bundle` (plain JSON, safetensors and parquet; nothing executed).

    Raises:
        FileNotFoundError: if ``folder`` holds no bundle.
        ValueError: naming the file and field that is wrong (unknown format, kind, config key, weights).
    """
    folder = Path(folder)
    spec_path = folder / BUNDLE_FILE
    if not spec_path.is_file():
        raise FileNotFoundError(f"no model bundle in {folder} ({BUNDLE_FILE} is missing)")
    spec = json.loads(spec_path.read_text())
    if spec.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{spec_path}: field 'format' is {spec.get('format')!r}, expected {BUNDLE_FORMAT}")
    kind = spec["kind"]
    try:
        registry.kind(kind)  # a removed kind is refused in one line saying why
    except ValueError as err:
        raise ValueError(f"{spec_path}: {err}") from None
    preprocess = PreprocessConfig.model_validate(spec["preprocess"])
    model_spec = spec["model"]
    weights = folder / WEIGHTS_FILE
    vocab = {
        name: pd.read_parquet(folder / VOCABULARY_DIR / f"{name}.parquet")
        if (folder / VOCABULARY_DIR / f"{name}.parquet").is_file()
        else None
        for name in ("locations", "users")
    }
    head = spec.get("new_place_head")
    common = {
        "kind": kind,
        "preprocess": preprocess,
        "head": NewPlaceHead.from_dict(head) if head is not None else None,
        "locations": vocab["locations"],
        "users": vocab["users"],
        "match_radius_m": float(spec.get("match_radius_m", DEFAULT_MATCH_RADIUS_M)),
    }
    if model_spec["family"] == "routine":
        routine = _load_routine(folder, kind, model_spec, preprocess, vocab["locations"])
        return ModelBundle(scorer=None, routine=routine, **common)
    from nextloc.models.scorer import load_network  # torch: networks and baselines only

    scorer = load_network(weights, kind, model_spec, preprocess.samples.duration_cap_min, spec_path)
    return ModelBundle(scorer=scorer, **common)
