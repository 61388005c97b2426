"""Cache keys for nextloc tasks: task source + library code + config + upstream content fingerprints.

Prefect's ``INPUTS`` policy hashes raw inputs (pickles, paths as strings). Ours hashes what the result
really depends on: configs as canonical JSON, upstream outputs by their content fingerprint, and the
source of the whole ``nextloc`` library, so a bug fix in a pure function invalidates every cached result
computed with the old code.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE, TASK_SOURCE, CachePolicy
from prefect.filesystems import LocalFileSystem
from prefect.results import ResultStore
from pydantic import BaseModel

import nextloc
from nextloc.fingerprint import hash_text
from nextloc.storage import atomic_path
from tasks import compat


@dataclass(frozen=True)
class Artifact:
    """A file a task wrote: where it is, what is in it (content fingerprint) and its stat when written."""

    path: str
    fingerprint: str
    size: int = -1
    mtime_ns: int = -1

    @classmethod
    def record(cls, path: str | Path, fingerprint: str) -> Artifact:
        """Describe a file that was just written."""
        st = Path(path).stat()
        return cls(str(path), fingerprint, st.st_size, st.st_mtime_ns)

    def is_current(self) -> bool:
        """True if the file is still the one that was written (a cached result is reused only then).

        A file that was deleted, or overwritten by a run with another configuration, fails this check.
        """
        try:
            st = Path(self.path).stat()
        except FileNotFoundError:
            return False
        return st.st_size == self.size and st.st_mtime_ns == self.mtime_ns


@functools.cache
def library_fingerprint() -> str:
    """Hash of every source file of the ``nextloc`` package."""
    root = Path(nextloc.__file__).parent
    parts = [f"{p.relative_to(root)}:{hash_text(p.read_text())}" for p in sorted(root.rglob("*.py"))]
    return hash_text("\n".join(parts))


def _stable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Artifact):
        return {"artifact": value.path, "fingerprint": value.fingerprint}
    if is_dataclass(value) and not isinstance(value, type):
        return _stable(asdict(value))
    if isinstance(value, dict):
        return {str(k): _stable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_stable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


@dataclass
class ContentInputs(CachePolicy):
    """Key = canonical JSON of the inputs (configs, fingerprints) + the library's code fingerprint."""

    exclude: list[str] = field(default_factory=list)

    def compute_key(
        self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any
    ) -> str | None:
        payload = {k: _stable(v) for k, v in (inputs or {}).items() if k not in self.exclude}
        payload["__nextloc__"] = library_fingerprint()
        return hash_text(json.dumps(payload, sort_keys=True, default=str))


CACHE_POLICY = TASK_SOURCE + ContentInputs()


logger = logging.getLogger(__name__)


def _store(storage: str | Path) -> ResultStore:
    return ResultStore(result_storage=LocalFileSystem(basepath=str(storage)))


def cached_result(task: Any, parameters: dict[str, Any], storage: str | Path) -> tuple[bool, Any]:
    """Look a call up in Prefect's cache without running it: ``(True, result)`` on a hit, else ``(False, None)``.

    The key is the one Prefect's task engine computes (the task's own cache policy over the same
    parameters), read from the same result storage, so a hit here is the hit the engine would find. Flows
    use it to skip submitting calls that are already done: a rerun of 182 cached per-user tasks then costs
    no task runs (and no burst of state events that slows the next API call), and cached trainings start
    no worker processes. A record that cannot be read (cut short by a crash) is removed and reported as a
    miss, so the call runs again instead of failing on it.
    """
    key = compat.engine_cache_key(task, parameters)
    if key is None:
        return False, None
    store = _store(storage)
    if not store.exists(key):
        return False, None
    try:
        return True, store.read(key).result
    except Exception as err:  # noqa: BLE001 - any unreadable record is a miss
        logger.warning("unreadable cache record %s (%s); recomputing", key, err)
        with contextlib.suppress(OSError):
            (Path(storage) / key).unlink()
        return False, None


def store_result(task: Any, parameters: dict[str, Any], storage: str | Path, value: Any) -> None:
    """Cache ``value`` as the result of calling ``task`` with ``parameters``, without a task run.

    The record is the one the engine would have written (same key, storage and serializer), so
    :func:`cached_result` and the engine's own lookup both find it. Written to a temporary file and renamed.
    """
    key = compat.engine_cache_key(task, parameters)
    if key is None:
        return
    store = _store(storage)
    record = store.create_result_record(value, key=key)
    path = Path(record.metadata.storage_key or Path(storage) / key)
    with atomic_path(path) as tmp:
        tmp.write_bytes(record.serialize())


def outputs_current(result: Any) -> bool:
    """True if every file a result points to is still the one written (see :meth:`Artifact.is_current`).

    Looks for :class:`Artifact` values in dataclass fields, lists, tuples and dict values; a cached result
    whose files were deleted or overwritten is recomputed rather than reused.
    """
    if isinstance(result, Artifact):
        return result.is_current()
    if is_dataclass(result) and not isinstance(result, type):
        return all(outputs_current(getattr(result, f.name)) for f in fields(result))
    if isinstance(result, dict):
        return all(outputs_current(v) for v in result.values())
    if isinstance(result, list | tuple):
        return all(outputs_current(v) for v in result)
    return True


@dataclass(frozen=True)
class Then:
    """A per-call task chained after a batch's task: each call's result goes on to it at once.

    Attributes:
        task: the second task (its cache policy keys the records, as for the first).
        name: its parameter that takes the first task's result.
        calls: its other parameters, one dict per call of the batch, in the batch's order.
    """

    task: Any
    name: str
    calls: list[dict[str, Any]]


def _cached_call(per_call: Any, parameters: dict[str, Any], storage: str) -> Any:
    hit, value = cached_result(per_call, parameters, storage)
    if not (hit and outputs_current(value)):
        value = per_call.fn(**parameters)
        store_result(per_call, parameters, storage, value)
    return value


@task(name="cached-batch", cache_policy=NO_CACHE)
def cached_batch(
    per_call: Any, calls: list[dict[str, Any]], storage: str, then: Then | None = None
) -> list[Any]:
    """Run ``per_call``'s function for each call of a batch, caching each result as its own task run would.

    One task run for many small calls (182 per-user ingestions cost 182 task runs, each a few
    milliseconds of engine work and API writes): the flow submits a few batches, and the next run still
    finds every call in the cache by itself, so a changed user recomputes alone. A call already in the cache
    with its files in place (a retry of this batch after a failure) is read back instead of run again.

    With ``then``, each call's result goes straight on to the second task (looked up and cached the same
    way) on the same thread, and the results are ``(first, second)`` pairs: one user's ingestion and
    staypoints, with no wait for the other users between (the positionfixes go over in memory:
    ``tasks.preprocess._read_positionfixes``).
    """
    results = []
    for i, parameters in enumerate(calls):
        value = _cached_call(per_call, parameters, storage)
        if then is not None:
            value = (value, _cached_call(then.task, {then.name: value, **then.calls[i]}, storage))
        results.append(value)
    return results


def call_cached(task: Any, *args: Any) -> Any:
    """Call ``task`` (its ``result_storage`` set), or return its cached result without a task run.

    The lookup is :func:`cached_result`'s, so a hit here is the one Prefect's engine would find; a miss
    runs the task, which caches its result.
    """
    parameters = dict(inspect.signature(task.fn).bind(*args).arguments)
    hit, result = cached_result(task, parameters, task.result_storage)
    return result if hit else task(*args)
