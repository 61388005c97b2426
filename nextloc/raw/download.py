"""Download and unpack the Microsoft GeoLife Trajectories 1.3 dataset.

The dataset is published by Microsoft Research as a single zip file (about
1.6 GB once downloaded) at :data:`GEOLIFE_URL`. This module fetches it with
the standard library only:

* :func:`nextloc.raw.http_download.download_file` fetches the zip (resume, retries,
  SHA-256 verification, atomic rename).
* :func:`extract_geolife` unpacks the archive safely (no path traversal, no
  symlinks; :mod:`nextloc.raw.archives`) through a temporary directory and returns
  the folder that holds ``Data/``.
* :func:`fetch_geolife` chains both steps and skips whatever is already done.

Checksums:
    Microsoft does not publish a SHA-256 for the archive and this project has
    not pinned one, so :data:`GEOLIFE_SHA256` is ``None``. Callers may pass
    ``expected_sha256`` explicitly. When no checksum is given, the digest of
    the downloaded file is recorded in a ``<name>.sha256`` sidecar and later
    runs verify against it (see :mod:`nextloc.raw.http_download`).

The errors :func:`fetch_geolife` raises (:class:`ChecksumError`,
:class:`DownloadError`, :class:`UnsafeArchiveError`) are re-exported here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from nextloc.atomic import write_text_atomic
from nextloc.raw.archives import UnsafeArchiveError, extract, find_folder_holding
from nextloc.raw.http_download import (
    ChecksumError,
    DownloadError,
    download_file,
    normalize_sha256,
    recorded_sha256,
    sha256_file,
)

__all__ = [
    "GEOLIFE_SHA256",
    "GEOLIFE_URL",
    "GEOLIFE_ZIP_NAME",
    "ChecksumError",
    "DownloadError",
    "UnsafeArchiveError",
    "extract_geolife",
    "fetch_geolife",
]

logger = logging.getLogger(__name__)

GEOLIFE_URL = (
    "https://download.microsoft.com/download/F/4/8/"
    "F4894AA5-FDBC-481E-9285-D5F8C4C4F039/Geolife%20Trajectories%201.3.zip"
)
"""Official public download URL of GeoLife Trajectories 1.3."""

GEOLIFE_ZIP_NAME = "Geolife Trajectories 1.3.zip"
"""File name under which the archive is stored locally."""

GEOLIFE_SHA256: str | None = None
"""Expected SHA-256 of the official archive; unknown offline, hence ``None``.

When ``None``, the digest computed at first download is recorded in a
``.sha256`` sidecar file and used to verify subsequent runs.
"""

_EXTRACT_MARKER = ".geolife_extracted.json"

# --------------------------------------------------------------------------- #
# Extraction
# --------------------------------------------------------------------------- #


def extract_geolife(zip_path: Path, out_dir: Path) -> Path:
    """Safely extract the GeoLife archive and locate its ``Data/`` folder.

    Unpacking is :func:`nextloc.raw.archives.extract`'s: every member is validated before anything is
    written (absolute paths, ``..`` components, symlinks and any entry resolving outside ``out_dir``, an
    existing link there included, are refused). The archive is unpacked into a temporary directory
    inside ``out_dir`` and its top-level entries are then renamed into place, replacing previous copies,
    so a crash never leaves a half-extracted tree at the final location.

    Args:
        zip_path: Path of the GeoLife zip (official layout:
            ``Geolife Trajectories 1.3/Data/NNN/Trajectory/*.plt``).
        out_dir: Folder to extract into; created if missing.

    Returns:
        The directory that contains ``Data/``, e.g. ``out_dir / "Geolife Trajectories 1.3"``.

    Raises:
        UnsafeArchiveError: A member is unsafe (names the member).
        FileNotFoundError: ``zip_path`` is missing, or the archive has no ``Data/`` folder.
        zipfile.BadZipFile: The file is not a valid zip archive.
    """
    zip_path = Path(zip_path)
    out_dir = Path(out_dir)
    if not zip_path.is_file():
        raise FileNotFoundError(f"GeoLife archive not found: {zip_path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    root = out_dir.resolve()
    tmp_dir = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
    try:
        logger.info("Extracting %s into %s", zip_path, out_dir)
        extract(zip_path, tmp_dir, fmt="zip", check_root=root)
        data_parent = find_folder_holding(tmp_dir, "Data")
        if data_parent is None:
            raise FileNotFoundError(f"no 'Data/' folder found in archive {zip_path}")
        relative = data_parent.relative_to(tmp_dir)
        _move_entries(tmp_dir, root)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    result = root / relative
    logger.info("GeoLife data folder: %s", result / "Data")
    return result


def _move_entries(src: Path, root: Path) -> None:
    """Rename every top-level entry of ``src`` into ``root``; an older copy goes to a trash folder first."""
    trash_dir = Path(tempfile.mkdtemp(prefix=".replaced-", dir=root))
    try:
        for entry in sorted(src.iterdir()):
            target = root / entry.name
            if target.exists() or target.is_symlink():
                logger.info("Replacing previously extracted %s", target)
                os.replace(target, trash_dir / entry.name)
            os.replace(entry, target)
    finally:
        shutil.rmtree(trash_dir, ignore_errors=True)


# --------------------------------------------------------------------------- #
# Pipeline step
# --------------------------------------------------------------------------- #


def _read_marker(marker: Path) -> dict[str, str] | None:
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if not isinstance(data.get("root"), str) or not isinstance(data.get("sha256"), str):
        return None
    return data


def fetch_geolife(
    dest_dir: Path,
    *,
    url: str = GEOLIFE_URL,
    expected_sha256: str | None = GEOLIFE_SHA256,
) -> Path:
    """Download (if needed) and extract (if needed) GeoLife Trajectories 1.3.

    The archive is stored as ``dest_dir / GEOLIFE_ZIP_NAME`` and extracted
    into ``dest_dir``. A small marker file records the archive digest and the
    extracted folder; when it is present, the folder still has ``Data/`` and
    the digest agrees with ``expected_sha256`` (if given), nothing is
    downloaded, hashed or extracted again.

    Args:
        dest_dir: Folder receiving the archive and the extracted tree.
        url: Source URL (override for mirrors or tests).
        expected_sha256: Expected SHA-256 of the archive, or ``None`` to
            trust-on-first-use via the ``.sha256`` sidecar.

    Returns:
        The directory containing ``Data/``.

    Raises:
        ChecksumError: The archive does not match the expected digest.
        UnsafeArchiveError: The archive contains unsafe members.
        FileNotFoundError: The archive has no ``Data/`` folder.
        DownloadError: The download failed.
        urllib.error.URLError: A network error persisted after retries.
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    marker_path = dest_dir / _EXTRACT_MARKER
    expected = normalize_sha256(expected_sha256) if expected_sha256 is not None else None

    marker = _read_marker(marker_path)
    if marker is not None:
        root = dest_dir.resolve() / marker["root"]
        if (root / "Data").is_dir() and (expected is None or marker["sha256"] == expected):
            logger.info("GeoLife already extracted at %s", root)
            return root
        logger.info("Extraction marker %s is stale; refreshing", marker_path)

    zip_path = download_file(url, dest_dir / GEOLIFE_ZIP_NAME, expected_sha256=expected)
    digest = recorded_sha256(zip_path) or sha256_file(zip_path)
    root = extract_geolife(zip_path, dest_dir)
    relative = root.relative_to(dest_dir.resolve())
    write_text_atomic(
        marker_path,
        json.dumps({"root": relative.as_posix(), "sha256": digest, "archive": zip_path.name}),
    )
    return root
