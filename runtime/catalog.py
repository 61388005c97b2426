"""The data catalog: where each dataset lives under a data directory.

Only the layers above the library (``runtime/``, ``tracking/``, ``tasks/``, ``flows/``, ``commands/``) know
paths; the ``nextloc`` library works on tables. Layers are numbered as in ``configs/catalog.yaml``
(documentation of this layout); the user-facing outputs sit at the top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from nextloc.preprocessing.sequences import SPLITS

_CACHE = ("_cache", "results")  # where the task results of a data directory are, under it


@dataclass(frozen=True)
class Catalog:
    """Paths of every dataset under ``data_dir``.

    ``data_dir`` is where outputs go, not what they hold: cache keys leave it out (a task's outputs are
    under the data directory whose cache holds its result; :mod:`runtime.caching`).
    """

    data_dir: str = field(metadata={"cache_key": False})

    @classmethod
    def of_cache(cls, storage: str | Path) -> Catalog | None:
        """The catalog (its directory resolved) whose :attr:`cache` ``storage`` is, or None if it is none's."""
        path = Path(storage).resolve()
        return cls(str(path.parents[1])) if path.parts[-2:] == _CACHE else None

    @property
    def root(self) -> Path:
        """The data directory."""
        return Path(self.data_dir)

    def positionfixes(self, user_id: int) -> Path:
        """Positionfixes of one user (hive-style partition ``user_id=NNN``)."""
        return self.root / "01_positionfixes" / f"user_id={user_id:03d}" / "part-0.parquet"

    def user_staypoints(self, user_id: int) -> Path:
        """Raw (unmerged, unfiltered) staypoints of one user."""
        return self.root / "02_staypoints" / f"user_id={user_id:03d}" / "part-0.parquet"

    def user_files(self, layer: Literal["positionfixes", "staypoints"]) -> list[Path]:
        """Every user's file of a per-user layer (``01_positionfixes`` or ``02_staypoints``), in user order."""
        first = self.positionfixes(0) if layer == "positionfixes" else self.user_staypoints(0)
        return sorted(first.parents[1].glob("user_id=*/part-0.parquet"))

    @property
    def located(self) -> Path:
        """Activity staypoints of the quality-filtered users with their DBSCAN location."""
        return self.root / "03_locations" / "staypoints_located.parquet"

    @property
    def staypoints(self) -> Path:
        """Final merged staypoints of the kept users."""
        return self.root / "staypoints.parquet"

    def samples(self, split: str) -> Path:
        """Samples of one split."""
        return self.root / "samples" / f"{split}.parquet"

    def vocabulary(self, kind: str) -> Path:
        """What the encoded ids mean: ``locations`` (index, DBSCAN id, centre) or ``users`` (index, user id)."""
        return self.root / "vocabulary" / f"{kind}.parquet"

    @property
    def metadata(self) -> Path:
        """Counts, vocabulary sizes, config and fingerprints."""
        return self.root / "metadata.json"

    @property
    def ingest_report(self) -> Path:
        """What ingestion skipped and why."""
        return self.root / "ingest_report.json"

    @property
    def cache(self) -> Path:
        """Persisted task results (the cache)."""
        return self.root.joinpath(*_CACHE)

    @property
    def raw_hash_memo(self) -> Path:
        """Content hashes of raw files, keyed by path, size and mtime."""
        return self.root / "_cache" / "raw-hashes.json"

    def run_dir(self, kind: str, seed: int) -> Path:
        """Outputs of one trained model: ``results.json``, ``per_user.csv``, ``test_per_sample.parquet``,
        ``val_per_sample.parquet``, ``new_place_head.json``, charts, and (while training runs) ``checkpoints/``."""
        return self.root / "results" / kind / f"seed{seed}"


def require_preprocessed(data_dir: str | Path) -> Catalog:
    """The catalog of ``data_dir`` if what a training reads is there (metadata, the three sample splits).

    Raises:
        FileNotFoundError: naming the missing files and the command that makes them.
    """
    catalog = Catalog(str(Path(data_dir).resolve()))
    needed = [catalog.metadata, *(catalog.samples(split) for split in SPLITS)]
    missing = [str(path) for path in needed if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"preprocessed data missing under {data_dir}: {missing}; run `nextloc preprocess` first"
        )
    return catalog
