"""Download a file over HTTP, resuming, retrying and verifying its SHA-256 (standard library only).

:func:`download_file` streams a URL into ``<dest>.part``, resumes an interrupted transfer with an HTTP
``Range`` request, retries on network errors while keeping the bytes already received, checks
``Content-Length`` and the SHA-256 digest, and finally renames the file into place with
:func:`os.replace`. The one step per concern: :func:`_request` (with ``Range`` to resume),
:func:`_resume_point` (what the server's answer means for the partial file), :func:`_stream` (the body
to disk), :func:`_with_retries` (the retry policy), :func:`_install` (verify, then rename).

Checksums:
    When no checksum is given, the digest of the downloaded file is logged and written next to it as
    ``<name>.sha256`` (``sha256sum`` format); later runs verify the file, or any re-download, against
    that sidecar (trust on first use).
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from nextloc.atomic import write_text_atomic

__all__ = [
    "ChecksumError",
    "DownloadError",
    "ProgressCallback",
    "download_file",
    "normalize_sha256",
    "recorded_sha256",
    "sha256_file",
]

logger = logging.getLogger(__name__)

_USER_AGENT = "nextloc-download/1.0 (+python-urllib)"
_RETRY_BACKOFF_S = 1.0
"""Base delay before a retry; doubled for each further attempt."""
_RETRY_BACKOFF_MAX_S = 30.0
_HASH_CHUNK = 1 << 20

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


def normalize_sha256(value: str) -> str:
    """The lowercase hex digest ``value`` stands for; ``ValueError`` if it is not a SHA-256 digest."""
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
        return normalize_sha256(tokens[0])
    except ValueError:
        logger.warning("Ignoring malformed checksum file %s", sidecar)
        return None


def recorded_sha256(dest: Path) -> str | None:
    """The digest recorded in ``dest``'s ``.sha256`` sidecar, if there is a valid one."""
    return _read_sidecar(_sidecar_path(dest))


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


def _request(url: str, offset: int, timeout_s: float) -> http.client.HTTPResponse:
    """Ask for the whole resource, or for its bytes from ``offset`` on (``Range``) to resume."""
    headers = {"User-Agent": _USER_AGENT, "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        logger.info("Resuming download of %s at byte %d", url, offset)
    else:
        logger.info("Downloading %s", url)
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s)


def _range_not_satisfiable(url: str, part: Path, offset: int, exc: urllib.error.HTTPError) -> int:
    """Answer a ``416`` to a resume: the partial file is complete (returns its size), or restart."""
    _, total = _parse_content_range(exc.headers.get("Content-Range"))
    if total is not None and total != offset:
        logger.warning(
            "Server rejected range for %s (size %d, partial file has %d bytes); restarting from scratch",
            url,
            total,
            offset,
        )
        part.unlink(missing_ok=True)
        raise _RetryableDownloadError("partial file does not match remote size") from exc
    logger.info("Partial file %s is already complete (%d bytes)", part, offset)
    return total if total is not None else offset


def _resume_point(
    url: str, part: Path, offset: int, response: http.client.HTTPResponse
) -> tuple[int, int | None, int | None]:
    """Where the response's body goes: ``(offset in part, total size, Content-Length)``.

    A ``206`` continues at ``offset`` (a server resuming elsewhere restarts the download); a ``200``
    is the whole resource, written from byte 0 (a server that ignored the ``Range``).
    """
    length = _int_header(response.headers.get("Content-Length"))
    if response.status == 206 and offset:
        start, total = _parse_content_range(response.headers.get("Content-Range"))
        if start is not None and start != offset:
            part.unlink(missing_ok=True)
            raise _RetryableDownloadError(f"server resumed at byte {start} instead of {offset}; restarting")
        if total is None and length is not None:
            total = offset + length
        return offset, total, length
    if response.status == 200:
        if offset:
            logger.warning("Server ignored the Range request for %s; restarting from byte 0", url)
        return 0, length, length
    raise DownloadError(f"unexpected HTTP status {response.status} for {url}")


def _stream(
    response: http.client.HTTPResponse,
    part: Path,
    offset: int,
    total: int | None,
    *,
    chunk_size: int,
    progress: ProgressCallback | None,
) -> int:
    """Append the body to ``part`` at ``offset`` (or write it from 0), fsynced; returns the bytes received."""
    received = 0
    with open(part, "ab" if offset else "wb") as fh:
        while chunk := response.read(chunk_size):
            fh.write(chunk)
            received += len(chunk)
            if progress is not None:
                progress(offset + received, total)
        fh.flush()
        os.fsync(fh.fileno())
    return received


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
    try:
        response = _request(url, offset, timeout_s)
    except urllib.error.HTTPError as exc:
        with exc:
            if exc.code == 416 and offset:
                return _range_not_satisfiable(url, part, offset, exc)
            raise
    with response:
        offset, total, length = _resume_point(url, part, offset, response)
        received = _stream(response, part, offset, total, chunk_size=chunk_size, progress=progress)
    if length is not None and received != length:
        raise _RetryableDownloadError(
            f"connection closed after {received} of {length} bytes from {url} (kept in {part} to resume)"
        )
    size = offset + received
    if total is not None and size != total:
        raise _RetryableDownloadError(f"got {size} bytes from {url}, expected {total} (kept in {part})")
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


def _with_retries(attempt: Callable[[], int | None], *, url: str, part: Path, retries: int) -> int | None:
    """Run ``attempt`` until it succeeds, retrying transient failures ``retries`` times.

    Each retry waits :data:`_RETRY_BACKOFF_S`, doubled per retry up to :data:`_RETRY_BACKOFF_MAX_S`, and
    keeps the bytes already in ``part`` (the next attempt resumes from them).
    """
    tries = 0
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not _is_retryable(exc) or tries >= retries:
                if _is_retryable(exc):
                    logger.error("Giving up on %s after %d attempts: %s", url, tries + 1, exc)
                raise
            tries += 1
            delay = min(_RETRY_BACKOFF_S * 2 ** (tries - 1), _RETRY_BACKOFF_MAX_S)
            kept = part.stat().st_size if part.exists() else 0
            logger.warning(
                "Download of %s failed (%s); retry %d/%d in %.1fs keeping %d bytes",
                url,
                exc,
                tries,
                retries,
                delay,
                kept,
            )
            if delay > 0:
                time.sleep(delay)


def _expected_digest(expected_sha256: str | None, sidecar: Path) -> tuple[str | None, str]:
    """The digest to verify against and where it comes from: the argument, else the sidecar, else none."""
    if expected_sha256 is not None:
        return normalize_sha256(expected_sha256), "argument"
    expected = _read_sidecar(sidecar)
    return expected, (str(sidecar) if expected is not None else "")


def _existing_is_good(dest: Path, expected: str | None) -> bool:
    """Whether an existing ``dest`` can be kept: it matches ``expected``, or there is nothing to check.

    A file with no digest to compare against is trusted (only complete, verified downloads are ever
    renamed into place), hashed, and its digest recorded in the sidecar.
    """
    sidecar = _sidecar_path(dest)
    actual = sha256_file(dest)
    if expected is None:
        logger.warning(
            "%s already exists with no checksum to verify; recording sha256=%s in %s", dest, actual, sidecar
        )
        _write_sidecar(dest, actual)
        return True
    if actual == expected:
        logger.info("%s already downloaded and verified (sha256=%s)", dest, actual)
        if not sidecar.exists():
            _write_sidecar(dest, actual)
        return True
    logger.warning("%s exists but its sha256 %s does not match %s; downloading again", dest, actual, expected)
    return False


def _install(part: Path, dest: Path, expected: str | None, source: str, total: int | None) -> None:
    """Verify the complete ``part`` file and rename it to ``dest``; record its digest in the sidecar.

    ``part`` is not a :func:`nextloc.atomic.atomic_path` temporary file on purpose: it has a fixed name
    and outlives failures and restarts, so that an interrupted download resumes from its bytes instead of
    starting over. It becomes ``dest`` (``os.replace``, atomic) only once complete and verified; a file
    with the wrong digest is deleted, as resuming it could never succeed.
    """
    sidecar = _sidecar_path(dest)
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


def download_file(
    url: str,
    dest: Path,
    *,
    expected_sha256: str | None = None,
    chunk_size: int = 1 << 20,
    timeout_s: float = 60.0,
    retries: int = 3,
    progress: ProgressCallback | None = None,
) -> Path:
    """Download ``url`` to ``dest`` with resume, retries and checksum verification.

    Data is streamed into ``<dest>.part``. If that file already exists the transfer resumes with a
    ``Range: bytes=N-`` request; a server answering ``200`` instead of ``206`` causes a clean restart, and
    ``416`` (range not satisfiable) means the partial file is already complete. Network errors are retried
    up to ``retries`` times, each retry resuming from the bytes already on disk. Once complete, the
    SHA-256 digest is verified and the file is atomically renamed to ``dest`` with :func:`os.replace`; the
    digest is stored in the ``<dest>.sha256`` sidecar.

    If ``dest`` already exists and matches ``expected_sha256`` (or, when that is ``None``, the digest in
    its sidecar), it is returned without any network access. An existing ``dest`` with no checksum to
    compare against is trusted, hashed, and its digest recorded in the sidecar.

    Args:
        url: URL to fetch (``http``/``https``).
        dest: Final path of the downloaded file. Its parent is created.
        expected_sha256: Expected hex SHA-256 digest. When ``None``, the sidecar digest (if any) is used;
            otherwise the computed digest is logged and written to the sidecar.
        chunk_size: Bytes read per iteration.
        timeout_s: Socket timeout, in seconds, for connect and each read.
        retries: Number of additional attempts after a transient failure.
        progress: Optional callback ``progress(bytes_done, total_or_None)`` called after every chunk.

    Returns:
        ``dest``.

    Raises:
        ChecksumError: The completed file does not match the expected digest (the ``.part`` file is
            deleted).
        DownloadError: The server returned an unusable response.
        urllib.error.URLError: A network error persisted after all retries (``HTTPError`` for
            non-retryable HTTP statuses such as 404).
        ValueError: Invalid arguments.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(dest.suffix + ".part")
    expected, source = _expected_digest(expected_sha256, _sidecar_path(dest))
    if dest.is_file() and _existing_is_good(dest, expected):
        return dest

    def attempt() -> int | None:
        return _download_once(url, part, chunk_size=chunk_size, timeout_s=timeout_s, progress=progress)

    total = _with_retries(attempt, url=url, part=part, retries=retries)
    _install(part, dest, expected, source, total)
    return dest
