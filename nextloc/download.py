"""Download and unpack the Microsoft GeoLife Trajectories 1.3 dataset.

The dataset is published by Microsoft Research as a single zip file (about
1.6 GB once downloaded) at :data:`GEOLIFE_URL`. This module fetches it with
the standard library only:

* :func:`download_file` streams a URL into ``<dest>.part``, resumes an
  interrupted transfer with an HTTP ``Range`` request, retries on network
  errors while keeping the bytes already received, checks ``Content-Length``
  and the SHA-256 digest, and finally renames the file into place with
  :func:`os.replace`.
* :func:`extract_geolife` unpacks the archive safely (no path traversal, no
  symlinks) through a temporary directory and returns the folder that holds
  ``Data/``.
* :func:`fetch_geolife` chains both steps and skips whatever is already done.

Checksums:
    Microsoft does not publish a SHA-256 for the archive and this project has
    not pinned one, so :data:`GEOLIFE_SHA256` is ``None``. Callers may pass
    ``expected_sha256`` explicitly. When no checksum is given, the digest of
    the downloaded file is logged and written next to it as
    ``<name>.sha256`` (``sha256sum`` format); later runs verify the file, or
    any re-download, against that sidecar.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import shutil
import stat
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from nextloc.atomic import write_text_atomic

__all__ = [
    "GEOLIFE_SHA256",
    "GEOLIFE_URL",
    "GEOLIFE_ZIP_NAME",
    "ChecksumError",
    "DownloadError",
    "UnsafeArchiveError",
    "download_file",
    "extract_geolife",
    "fetch_geolife",
    "sha256_file",
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

_USER_AGENT = "nextloc-download/1.0 (+python-urllib)"
_RETRY_BACKOFF_S = 1.0
"""Base delay before a retry; doubled for each further attempt."""
_RETRY_BACKOFF_MAX_S = 30.0
_HASH_CHUNK = 1 << 20
_EXTRACT_MARKER = ".geolife_extracted.json"

ProgressCallback = Callable[[int, int | None], None]


class DownloadError(RuntimeError):
    """Raised when a download cannot be completed (bad status, too many retries)."""


class _RetryableDownloadError(DownloadError):
    """Transient failure: the transfer may be retried (and resumed)."""


class ChecksumError(ValueError):
    """Raised when a downloaded file does not have the expected SHA-256 digest.

    Attributes:
        path: The file whose digest did not match.
        expected: The expected hex digest.
        actual: The computed hex digest.
    """

    def __init__(self, path: Path, expected: str, actual: str, *, source: str = "") -> None:
        self.path = path
        self.expected = expected
        self.actual = actual
        origin = f" (expected value from {source})" if source else ""
        super().__init__(f"SHA-256 mismatch for {path}: expected {expected}, got {actual}{origin}")


class UnsafeArchiveError(ValueError):
    """Raised when an archive member would be written outside the target folder.

    Attributes:
        member: The offending member name as stored in the archive.
    """

    def __init__(self, member: str, reason: str) -> None:
        self.member = member
        super().__init__(f"unsafe archive member {member!r}: {reason}")


# --------------------------------------------------------------------------- #
# Checksums
# --------------------------------------------------------------------------- #


def sha256_file(path: Path, chunk_size: int = _HASH_CHUNK) -> str:
    """Compute the SHA-256 hex digest of a file.

    Args:
        path: File to hash.
        chunk_size: Read size in bytes.

    Returns:
        The lowercase hexadecimal digest.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def _sidecar_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".sha256")


def _normalize_sha256(value: str) -> str:
    value = value.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"not a SHA-256 hex digest: {value!r}")
    return value


def _read_sidecar(sidecar: Path) -> str | None:
    """Return the digest stored in a ``sha256sum``-style sidecar, if valid."""
    try:
        text = sidecar.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("Cannot read checksum file %s: %s", sidecar, exc)
        return None
    tokens = text.split()
    if not tokens:
        logger.warning("Ignoring empty checksum file %s", sidecar)
        return None
    try:
        return _normalize_sha256(tokens[0])
    except ValueError:
        logger.warning("Ignoring malformed checksum file %s", sidecar)
        return None


def _write_sidecar(dest: Path, digest: str) -> None:
    write_text_atomic(_sidecar_path(dest), f"{digest}  {dest.name}\n")


# --------------------------------------------------------------------------- #
# Download
# --------------------------------------------------------------------------- #


def _parse_content_range(value: str | None) -> tuple[int | None, int | None]:
    """Parse ``bytes START-END/TOTAL`` (or ``bytes */TOTAL``) into (start, total)."""
    if not value:
        return None, None
    try:
        unit, _, spec = value.strip().partition(" ")
        if unit.lower() != "bytes":
            return None, None
        span, _, total_s = spec.partition("/")
        total = None if total_s.strip() in ("", "*") else int(total_s)
        start = None if span.strip() == "*" else int(span.split("-", 1)[0])
    except ValueError:
        return None, None
    return start, total


def _int_header(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _download_once(
    url: str,
    part: Path,
    *,
    chunk_size: int,
    timeout_s: float,
    progress: ProgressCallback | None,
) -> int | None:
    """Perform one HTTP request, appending to or rewriting ``part``.

    Returns:
        The total size of the resource when known, else ``None``.

    Raises:
        _RetryableDownloadError: The transfer stopped early or must restart.
        DownloadError: The server answered with an unusable status.
        urllib.error.URLError, OSError, http.client.HTTPException: Network errors.
    """
    offset = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": _USER_AGENT, "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        logger.info("Resuming download of %s at byte %d", url, offset)
    else:
        logger.info("Downloading %s", url)
    request = urllib.request.Request(url, headers=headers)

    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        with exc:
            if exc.code == 416 and offset:
                _, total = _parse_content_range(exc.headers.get("Content-Range"))
                if total is not None and total != offset:
                    logger.warning(
                        "Server rejected range for %s (size %d, partial file has %d bytes);"
                        " restarting from scratch",
                        url,
                        total,
                        offset,
                    )
                    part.unlink(missing_ok=True)
                    raise _RetryableDownloadError("partial file does not match remote size") from exc
                logger.info("Partial file %s is already complete (%d bytes)", part, offset)
                return total if total is not None else offset
            raise

    with response:
        status = response.status
        length = _int_header(response.headers.get("Content-Length"))
        if status == 206 and offset:
            start, total = _parse_content_range(response.headers.get("Content-Range"))
            if start is not None and start != offset:
                part.unlink(missing_ok=True)
                raise _RetryableDownloadError(
                    f"server resumed at byte {start} instead of {offset}; restarting"
                )
            if total is None and length is not None:
                total = offset + length
            mode = "ab"
        elif status == 200:
            if offset:
                logger.warning("Server ignored the Range request for %s; restarting from byte 0", url)
            offset = 0
            total = length
            mode = "wb"
        else:
            raise DownloadError(f"unexpected HTTP status {status} for {url}")

        received = 0
        with open(part, mode) as fh:
            while chunk := response.read(chunk_size):
                fh.write(chunk)
                received += len(chunk)
                if progress is not None:
                    progress(offset + received, total)
            fh.flush()
            os.fsync(fh.fileno())

    if length is not None and received != length:
        raise _RetryableDownloadError(f"connection closed after {received} of {length} bytes from {url}")
    size = offset + received
    if total is not None and size != total:
        raise _RetryableDownloadError(f"got {size} bytes from {url}, expected {total}")
    return total


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code in (408, 429)
    return isinstance(
        exc,
        (
            _RetryableDownloadError,
            urllib.error.URLError,
            ConnectionError,
            TimeoutError,
            http.client.HTTPException,  # includes IncompleteRead, RemoteDisconnected
        ),
    )


def download_file(
    url: str,
    dest: Path,
    *,
    expected_sha256: str | None = None,
    chunk_size: int = 1 << 20,
    timeout_s: float = 60.0,
    retries: int = 3,
    progress: Callable[[int, int | None], None] | None = None,
) -> Path:
    """Download ``url`` to ``dest`` with resume, retries and checksum verification.

    Data is streamed into ``<dest>.part``. If that file already exists the
    transfer resumes with a ``Range: bytes=N-`` request; a server answering
    ``200`` instead of ``206`` causes a clean restart, and ``416`` (range not
    satisfiable) means the partial file is already complete. Network errors
    are retried up to ``retries`` times, each retry resuming from the bytes
    already on disk. Once complete, the SHA-256 digest is verified and the
    file is atomically renamed to ``dest`` with :func:`os.replace`; the digest
    is stored in the ``<dest>.sha256`` sidecar.

    If ``dest`` already exists and matches ``expected_sha256`` (or, when that
    is ``None``, the digest in its sidecar), it is returned without any
    network access. An existing ``dest`` with no checksum to compare against
    is trusted (only complete, renamed downloads ever land there), hashed,
    and its digest recorded in the sidecar.

    Args:
        url: URL to fetch (``http``/``https``).
        dest: Final path of the downloaded file. Its parent is created.
        expected_sha256: Expected hex SHA-256 digest. When ``None``, the
            sidecar digest (if any) is used; otherwise the computed digest is
            logged and written to the sidecar.
        chunk_size: Bytes read per iteration.
        timeout_s: Socket timeout, in seconds, for connect and each read.
        retries: Number of additional attempts after a transient failure.
        progress: Optional callback ``progress(bytes_done, total_or_None)``
            called after every chunk.

    Returns:
        ``dest``.

    Raises:
        ChecksumError: The completed file does not match the expected digest
            (the ``.part`` file is deleted).
        DownloadError: The server returned an unusable response.
        urllib.error.URLError: A network error persisted after all retries
            (``HTTPError`` for non-retryable HTTP statuses such as 404).
        ValueError: Invalid arguments.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(dest.suffix + ".part")
    sidecar = _sidecar_path(dest)

    if expected_sha256 is not None:
        expected: str | None = _normalize_sha256(expected_sha256)
        source = "argument"
    else:
        expected = _read_sidecar(sidecar)
        source = str(sidecar) if expected is not None else ""

    if dest.is_file():
        if expected is None:
            digest = sha256_file(dest)
            logger.warning(
                "%s already exists with no checksum to verify; recording sha256=%s in %s",
                dest,
                digest,
                sidecar,
            )
            _write_sidecar(dest, digest)
            return dest
        actual = sha256_file(dest)
        if actual == expected:
            logger.info("%s already downloaded and verified (sha256=%s)", dest, actual)
            if not sidecar.exists():
                _write_sidecar(dest, actual)
            return dest
        logger.warning(
            "%s exists but its sha256 %s does not match %s; downloading again",
            dest,
            actual,
            expected,
        )

    attempt = 0
    while True:
        try:
            total = _download_once(url, part, chunk_size=chunk_size, timeout_s=timeout_s, progress=progress)
            break
        except Exception as exc:
            if not _is_retryable(exc) or attempt >= retries:
                if _is_retryable(exc):
                    logger.error("Giving up on %s after %d attempts: %s", url, attempt + 1, exc)
                raise
            attempt += 1
            delay = min(_RETRY_BACKOFF_S * 2 ** (attempt - 1), _RETRY_BACKOFF_MAX_S)
            kept = part.stat().st_size if part.exists() else 0
            logger.warning(
                "Download of %s failed (%s); retry %d/%d in %.1fs keeping %d bytes",
                url,
                exc,
                attempt,
                retries,
                delay,
                kept,
            )
            if delay > 0:
                time.sleep(delay)

    size = part.stat().st_size
    actual = sha256_file(part)
    if expected is not None and actual != expected:
        part.unlink(missing_ok=True)
        raise ChecksumError(dest, expected, actual, source=source)
    if expected is None:
        logger.info(
            "Downloaded %s (%d bytes, sha256=%s); no expected checksum given, recording it in %s",
            dest,
            size,
            actual,
            sidecar,
        )
    else:
        logger.info("Downloaded %s (%d bytes, total=%s), sha256 verified", dest, size, total)

    sidecar.unlink(missing_ok=True)  # never leave a stale digest next to a new file
    os.replace(part, dest)
    _write_sidecar(dest, actual)
    return dest


# --------------------------------------------------------------------------- #
# Extraction
# --------------------------------------------------------------------------- #


def _check_member(info: zipfile.ZipInfo, root: Path) -> None:
    name = info.filename
    normalized = name.replace("\\", "/")
    pure = PurePosixPath(normalized)
    if normalized.startswith("/") or (len(normalized) >= 2 and normalized[1] == ":"):
        raise UnsafeArchiveError(name, "absolute path")
    if ".." in pure.parts:
        raise UnsafeArchiveError(name, "parent-directory reference")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise UnsafeArchiveError(name, "symbolic link")
    target = (root / normalized).resolve()
    if target != root and root not in target.parents:
        raise UnsafeArchiveError(name, "resolves outside the extraction folder")


def _find_data_parent(root: Path, max_depth: int = 4) -> Path | None:
    """Breadth-first search for the shallowest directory containing ``Data/``."""
    level = [root]
    for _ in range(max_depth + 1):
        next_level: list[Path] = []
        for directory in level:
            if (directory / "Data").is_dir():
                return directory
            next_level.extend(sorted(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink()))
        if not next_level:
            break
        level = next_level
    return None


def extract_geolife(zip_path: Path, out_dir: Path) -> Path:
    """Safely extract the GeoLife archive and locate its ``Data/`` folder.

    Every member is validated before anything is written: absolute paths,
    ``..`` components, symlinks and any entry resolving outside ``out_dir``
    are refused. The archive is unpacked into a temporary directory inside
    ``out_dir`` and its top-level entries are then renamed into place,
    replacing previous copies, so a crash never leaves a half-extracted tree
    at the final location.

    Args:
        zip_path: Path of the GeoLife zip (official layout:
            ``Geolife Trajectories 1.3/Data/NNN/Trajectory/*.plt``).
        out_dir: Folder to extract into; created if missing.

    Returns:
        The directory that contains ``Data/``, e.g.
        ``out_dir / "Geolife Trajectories 1.3"``.

    Raises:
        UnsafeArchiveError: A member is unsafe (names the member).
        FileNotFoundError: ``zip_path`` is missing, or the archive has no
            ``Data/`` folder.
        zipfile.BadZipFile: The file is not a valid zip archive.
    """
    zip_path = Path(zip_path)
    out_dir = Path(out_dir)
    if not zip_path.is_file():
        raise FileNotFoundError(f"GeoLife archive not found: {zip_path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    root = out_dir.resolve()

    with zipfile.ZipFile(zip_path) as zf:
        members = zf.infolist()
        for info in members:
            _check_member(info, root)

        tmp_dir = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
        try:
            logger.info("Extracting %s (%d entries) into %s", zip_path, len(members), out_dir)
            zf.extractall(tmp_dir, members=members)

            data_parent = _find_data_parent(tmp_dir)
            if data_parent is None:
                raise FileNotFoundError(f"no 'Data/' folder found in archive {zip_path}")
            relative = data_parent.relative_to(tmp_dir)

            trash_dir = Path(tempfile.mkdtemp(prefix=".replaced-", dir=root))
            try:
                for entry in sorted(tmp_dir.iterdir()):
                    target = root / entry.name
                    if target.exists() or target.is_symlink():
                        logger.info("Replacing previously extracted %s", target)
                        os.replace(target, trash_dir / entry.name)
                    os.replace(entry, target)
            finally:
                shutil.rmtree(trash_dir, ignore_errors=True)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    result = root / relative
    logger.info("GeoLife data folder: %s", result / "Data")
    return result


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
    expected = _normalize_sha256(expected_sha256) if expected_sha256 is not None else None

    marker = _read_marker(marker_path)
    if marker is not None:
        root = dest_dir.resolve() / marker["root"]
        if (root / "Data").is_dir() and (expected is None or marker["sha256"] == expected):
            logger.info("GeoLife already extracted at %s", root)
            return root
        logger.info("Extraction marker %s is stale; refreshing", marker_path)

    zip_path = download_file(url, dest_dir / GEOLIFE_ZIP_NAME, expected_sha256=expected)
    digest = _read_sidecar(_sidecar_path(zip_path)) or sha256_file(zip_path)
    root = extract_geolife(zip_path, dest_dir)
    relative = root.relative_to(dest_dir.resolve())
    write_text_atomic(
        marker_path,
        json.dumps({"root": relative.as_posix(), "sha256": digest, "archive": zip_path.name}),
    )
    return root
