"""Find the raw GeoLife data on this machine, unpack a local archive, or download the official zip."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

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
    if _has_data(default_dir):
        return RawData(default_dir, f"existing data at {default_dir}")
    archives = [Path(os.environ[ENV_ARCHIVE])] if os.environ.get(ENV_ARCHIVE) else []
    archives += archive_candidates or []
    for archive in archives:
        if archive.is_file():
            extract_archive(archive, default_dir)
            return RawData(default_dir, f"unpacked local archive {archive} into {default_dir}")
    if not download:
        raise FileNotFoundError(
            f"no GeoLife data: set ${ENV_DIR}, put Data/ under {default_dir}, or set ${ENV_ARCHIVE}"
        )
    from nextloc.download import fetch_geolife

    try:
        path = fetch_geolife(default_dir.parent / "download")
    except OSError as err:
        raise FileNotFoundError(
            f"no local GeoLife data and the download failed ({err}); set ${ENV_DIR} to a folder holding Data/"
        ) from err
    return RawData(path, f"downloaded the official GeoLife 1.3 zip into {path}")


def extract_archive(archive: Path, out_dir: Path) -> Path:
    """Unpack a ``.tar.xz``/``.tar.gz``/``.tar`` or ``.zip`` of GeoLife safely (no path escapes), atomically.

    Uses the multi-threaded ``xz`` program when present (about 20 s for the full data on 2 cores).
    """
    if archive.suffix == ".zip":
        from nextloc.download import extract_geolife

        return extract_geolife(archive, out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    logger.info("unpacking %s into %s", archive, out_dir)
    if str(archive).endswith(".xz") and shutil.which("xz"):
        with subprocess.Popen(["xz", "-dc", "-T2", str(archive)], stdout=subprocess.PIPE) as proc:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                tar.extractall(tmp, filter="data")
            if proc.wait() != 0:
                raise OSError(f"xz failed on {archive} (exit {proc.returncode})")
    else:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
    if not _has_data(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        raise FileNotFoundError(f"{archive} holds no GeoLife Data/ folder")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def _has_data(path: Path) -> bool:
    return (path / "Data").is_dir() or (path.name == "Data" and path.is_dir())
