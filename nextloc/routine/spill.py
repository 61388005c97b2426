"""A ranker's candidate features on disk, chunk by chunk: what LightGBM fits on, and the ranker answers,
without one process holding every row.

:class:`FeatureFiles` writes each chunk of rows (the features of a few thousand questions,
:meth:`nextloc.routine.features.Routine.feature_chunks`) to its own ``.npy`` file as it is computed;
:func:`sequences` gives LightGBM the chunks as a list of ``lightgbm.Sequence``, which it reads twice in row
order (a sample of rows for the bins, then every row), one chunk in memory at a time. LightGBM samples the
same rows and bins the same values as from one array, so the trees are the same
(``tests/nextloc/routine/test_spill.py``). :meth:`FeatureFiles.map` scores them a chunk at a time (a tree's
score reads its row alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class FeatureFiles:
    """``(rows, width)`` float64 features as chunk files, in row order."""

    paths: tuple[Path, ...]
    rows: tuple[int, ...]
    width: int

    @classmethod
    def write(cls, folder: Path, chunks: Iterable[np.ndarray], width: int) -> FeatureFiles:
        """Each non-empty chunk of ``chunks`` (``(r, width)`` arrays, in row order) to ``folder``."""
        paths, rows = [], []
        for chunk in chunks:
            if len(chunk):
                path = Path(folder) / f"features-{len(paths):06d}.npy"
                np.save(path, np.ascontiguousarray(chunk, dtype=np.float64), allow_pickle=False)
                paths.append(path)
                rows.append(len(chunk))
        return cls(tuple(paths), tuple(rows), width)

    @property
    def shape(self) -> tuple[int, int]:
        return sum(self.rows), self.width

    def read(self, chunk: int) -> np.ndarray:
        """The rows of chunk ``chunk``."""
        return np.load(self.paths[chunk], allow_pickle=False)

    def column(self, index: int) -> np.ndarray:
        """``(rows,)`` feature ``index`` of every row."""
        return self.map(lambda rows: rows[:, index])

    def map(self, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """``fn`` of each chunk's rows (one value per row: a model's scores), joined in row order."""
        return np.concatenate([np.zeros(0), *(fn(self.read(chunk)) for chunk in range(len(self.paths)))])


def sequences(files: FeatureFiles) -> list[Any]:
    """``files`` as a list of ``lightgbm.Sequence``, one per chunk; the chunk read last is kept (LightGBM
    reads in row order), no other."""
    import lightgbm  # only when a ranker is fit

    last: dict[int, np.ndarray] = {}

    class Chunk(lightgbm.Sequence):
        def __init__(self, chunk: int) -> None:
            self.chunk = chunk
            self.batch_size = files.rows[chunk]  # pushed to LightGBM whole

        def __len__(self) -> int:
            return files.rows[self.chunk]

        def __getitem__(self, index: int | slice) -> np.ndarray:
            if self.chunk not in last:
                last.clear()
                last[self.chunk] = files.read(self.chunk)
            return last[self.chunk][index]

    return [Chunk(chunk) for chunk in range(len(files.paths))]


def ranking_dataset(
    rows: np.ndarray | FeatureFiles,
    label: np.ndarray,
    group: np.ndarray,
    reference: Any = None,
    feature_name: list[str] | str = "auto",
) -> Any:
    """A ``lightgbm.Dataset`` of ``rows`` (an array, or :class:`FeatureFiles` read as :func:`sequences`)
    that hands LightGBM every parameter when it bins them. From an array LightGBM reads every parameter;
    from sequences, only its dataset parameters (``Dataset.get_params``), so ``seed`` would not reach the
    bins' sample nor ``min_data_in_leaf`` the features' pre-filter, and the bins (and trees) would differ.
    Held to the array's by ``tests/nextloc/routine/test_spill.py``."""
    import lightgbm  # only when a ranker is fit

    class Dataset(lightgbm.Dataset):
        def get_params(self) -> dict[str, Any]:
            return dict(self.params or {})

    data = sequences(rows) if isinstance(rows, FeatureFiles) else rows
    return Dataset(data, label, group=group, reference=reference, feature_name=feature_name)
