"""Find the raw GeoLife data on this machine, unpack a local archive, or download the official zip."""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from nextloc.file_lock import exclusive_lock
from nextloc.raw.archives import extract, find_folder_holding, is_zip
from nextloc.raw.download import extract_geolife, fetch_geolife

logger = logging.getLogger(__name__)

DEFAULT_RAW_DIR = Path("data/raw/geolife")
"""Where the main job keeps the raw data (and ``retrain`` merges new dumps)."""
SHARED_ARCHIVE = Path("../shared/data/geolife-1.3-raw.tar.xz")
"""The archive beside a checkout, as on the project's machines."""
ENV_DIR = "NEXTLOC_GEOLIFE_DIR"
ENV_ARCHIVE = "NEXTLOC_GEOLIFE_ARCHIVE"


@dataclass(frozen=True)
class RawData:
    """Where the raw data is and how it got there (said to the user)."""

    path: Path
    source: str


def locate_raw_data(
    default_dir: Path, archive_candidates: list[Path] | None = None, *, download: bool = True
) -> RawData:
    """Find a GeoLife ``Data/`` tree, in this order.

    1. ``$NEXTLOC_GEOLIFE_DIR``;
    2. ``default_dir`` (``data/raw/geolife``) if it already holds ``Data/``;
    3. a local archive (``$NEXTLOC_GEOLIFE_ARCHIVE`` or one of ``archive_candidates``), unpacked into
       ``default_dir``;
    4. the official zip, downloaded into ``default_dir`` (needs the internet).

    Raises:
        FileNotFoundError: if nothing is found and downloading is off or fails.
    """
    env_dir = os.environ.get(ENV_DIR)
    if env_dir:
        path = Path(env_dir)
        if not _has_data(path):
            raise FileNotFoundError(f"${ENV_DIR}={env_dir} has no GeoLife Data/ folder")
        return RawData(path, f"${ENV_DIR} ({path})")
    existing = _data_root(default_dir)
    if existing is not None:
        return RawData(existing, f"existing data at {existing}")
    archives = [Path(os.environ[ENV_ARCHIVE])] if os.environ.get(ENV_ARCHIVE) else []
    archives += archive_candidates or []
    for archive in archives:
        if archive.is_file():
            path = extract_archive(archive, default_dir)
            return RawData(path, f"unpacked local archive {archive} into {path}")
    if not download:
        raise FileNotFoundError(
            f"no GeoLife data: set ${ENV_DIR}, put Data/ under {default_dir}, or set ${ENV_ARCHIVE}"
        )
    try:
        path = fetch_geolife(default_dir.parent / "download")
    except OSError as err:
        raise FileNotFoundError(
            f"no local GeoLife data and the download failed ({err}); set ${ENV_DIR} to a folder holding Data/"
        ) from err
    return RawData(path, f"downloaded the official GeoLife 1.3 zip into {path}")


def extract_archive(archive: Path, out_dir: Path) -> Path:
    """Unpack a ``.tar.xz``/``.tar.gz``/``.tar`` or ``.zip`` of GeoLife safely (no path escapes), atomically.

    Unpacking is :func:`nextloc.raw.archives.extract`'s (the multi-threaded ``xz`` program when present: about
    8 s for the full data on 2 cores). Processes that unpack into the same ``out_dir`` take turns
    (:func:`nextloc.file_lock.exclusive_lock` on ``.<out_dir name>.unpack.lock`` beside it): one that waited
    finds the data its predecessor unpacked and returns it, so ``make run`` can unpack while it installs
    and the command then uses that.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = out_dir.with_name(f".{out_dir.name}.unpack.lock")
    with exclusive_lock(
        lock, on_wait=lambda: logger.info("waiting for another process unpacking into %s", out_dir)
    ):
        existing = _data_root(out_dir)
        if existing is not None:
            logger.info("%s was unpacked meanwhile by another process", existing)
            return existing
        return _extract(archive, out_dir)


def _extract(archive: Path, out_dir: Path) -> Path:
    """A zip goes through :func:`extract_geolife`; a tar into ``<out_dir>.partial``, swapped in for
    ``out_dir`` once it is known to hold ``Data/``.
    """
    if is_zip(archive):
        return extract_geolife(archive, out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    extract(archive, tmp)  # removes tmp again if it fails: nothing half-unpacked is left behind
    if not _has_data(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        raise FileNotFoundError(f"{archive} holds no GeoLife Data/ folder")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def _has_data(path: Path) -> bool:
    return (path / "Data").is_dir() or (path.name == "Data" and path.is_dir())


def _data_root(out_dir: Path) -> Path | None:
    """Where unpacked data under ``out_dir`` is: ``out_dir`` itself (a tar's ``Data/``), or the folder one
    level down that holds ``Data/`` (GeoLife's zip unpacks into ``Geolife Trajectories 1.3/Data``)."""
    if _has_data(out_dir):
        return out_dir
    return find_folder_holding(out_dir, "Data", max_depth=1) if out_dir.is_dir() else None


def main() -> int:
    """``python -m nextloc.raw.rawdata``: find or unpack the raw data as the main job would, never downloading.

    ``make run`` calls it while it installs, with the interpreter that creates the environment (this module
    needs only the standard library); the job then finds the unpacked data. It always exits 0: anything it
    cannot do, the job itself does (or reports) next.
    """
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        found = locate_raw_data(DEFAULT_RAW_DIR, [SHARED_ARCHIVE], download=False)
    except (OSError, tarfile.TarError) as err:
        logger.info("raw data not prepared ahead (%s); the job will find or fetch it", err)
        return 0
    logger.info("GeoLife raw data: %s", found.source)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
