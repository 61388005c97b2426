"""Cache keys for nextloc tasks: task source + library code + config + upstream content fingerprints.

Prefect's ``INPUTS`` policy hashes raw inputs (pickles, paths as strings). Ours hashes what the result
really depends on: configs as canonical JSON, upstream outputs by their content fingerprint, and the
source of the whole ``nextloc`` library, so a bug fix in a pure function invalidates every cached result
computed with the old code.

Keys are on content, not on where things are: an :class:`Artifact` is keyed by its fingerprint alone, a
dataclass field marked ``metadata={"cache_key": False}`` (a raw folder beside its content fingerprint, the
data directory of a :class:`~runtime.catalog.Catalog`) is left out, and a path under the data directory
whose cache holds the result (an output location) is keyed relative to it. So the same raw data spelled
another way, or a data directory copied elsewhere, finds its results. A result read back from a data
directory that was moved or copied points at the files under the current one (:func:`cached_result`), and
is reused only if each file is still the one written (:func:`current_result`: size and mtime, else the
content's fingerprint); otherwise the call runs again and a warning names the file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE, TASK_SOURCE, CachePolicy
from prefect.filesystems import LocalFileSystem
from prefect.results import ResultStore
from pydantic import BaseModel

import nextloc
from nextloc.fingerprint import hash_file, hash_text
from nextloc.storage import atomic_path
from runtime import compat
from runtime.catalog import Catalog

logger = logging.getLogger("nextloc.cache")


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

    def problem(self) -> str | None:
        """None if the file is still the one that was written, else what is wrong with it.

        Same size and mtime as written: the same file (no read). Same size, another mtime (a copied data
        directory): the same file if its content has the fingerprint written. A file that was deleted,
        overwritten by a run with another configuration, or corrupted fails this check.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "missing"
        if st.st_size == self.size and st.st_mtime_ns == self.mtime_ns:
            return None
        if st.st_size != self.size:
            return "content changed"
        try:
            same = hash_file(Path(self.path)) == self.fingerprint
        except OSError as err:
            return f"unreadable: {err}"
        return None if same else "content changed"

    def is_current(self) -> bool:
        """True if the file is still the one that was written (a cached result is reused only then)."""
        return self.problem() is None

    def restat(self) -> Artifact:
        """This artifact with the file's stat now (itself if unchanged); for a file that passed the check."""
        st = os.stat(self.path)
        if (st.st_size, st.st_mtime_ns) == (self.size, self.mtime_ns):
            return self
        return replace(self, size=st.st_size, mtime_ns=st.st_mtime_ns)


@functools.cache
def library_fingerprint() -> str:
    """Hash of every source file of the ``nextloc`` package."""
    root = Path(nextloc.__file__).parent
    parts = [f"{p.relative_to(root)}:{hash_text(p.read_text())}" for p in sorted(root.rglob("*.py"))]
    return hash_text("\n".join(parts))


def _stable(value: Any, root: str | None = None) -> Any:
    """``value`` as JSON-ready data that says what it is, not where (see the module docstring)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Artifact):
        return {"artifact": value.fingerprint}
    if is_dataclass(value) and not isinstance(value, type):
        keyed = (f for f in fields(value) if f.metadata.get("cache_key", True))
        return {f.name: _stable(getattr(value, f.name), root) for f in keyed}
    if isinstance(value, dict):
        return {str(k): _stable(v, root) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_stable(v, root) for v in value]
    if isinstance(value, Path | str) and root is not None:
        rest = _under(str(value), root)
        if rest is not None:
            return "<data_dir>" + rest
    if isinstance(value, Path):
        return str(value)
    return value


def _under(text: str, folder: str) -> str | None:
    """What follows ``folder`` in the path ``text`` (``""`` for the folder itself), or None if it is not in it."""
    return text[len(folder) :] if text == folder or text.startswith(folder + os.sep) else None


def _storage_path(storage: Any) -> str | None:
    """The folder of a result storage given as a path or a local file system block, else None."""
    if isinstance(storage, str | Path):
        return str(storage)
    return getattr(storage, "basepath", None) if isinstance(storage, LocalFileSystem) else None


def _data_root(storage: str) -> str | None:
    """The data directory whose cache ``storage`` is (resolved), or None."""
    return _data_root_of(os.path.abspath(storage))


@functools.lru_cache(maxsize=256)
def _data_root_of(storage: str) -> str | None:
    catalog = Catalog.of_cache(storage)
    return None if catalog is None else catalog.data_dir


@dataclass
class ContentInputs(CachePolicy):
    """Key = canonical JSON of the inputs (configs, fingerprints) + the library's code fingerprint.

    Paths under the data directory whose cache the task's result storage is are keyed relative to it.
    """

    exclude: list[str] = field(default_factory=list)

    def compute_key(
        self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any
    ) -> str | None:
        storage = _storage_path(getattr(getattr(task_ctx, "task", None), "result_storage", None))
        root = _data_root(storage) if storage else None
        payload = {k: _stable(v, root) for k, v in (inputs or {}).items() if k not in self.exclude}
        payload["__nextloc__"] = library_fingerprint()
        return hash_text(json.dumps(payload, sort_keys=True, default=str))


CACHE_POLICY = TASK_SOURCE + ContentInputs()


def _store(storage: str | Path) -> ResultStore:
    return ResultStore(result_storage=LocalFileSystem(basepath=str(storage)))


def cached_result(task: Any, parameters: dict[str, Any], storage: str | Path) -> tuple[bool, Any]:
    """Look a call up in Prefect's cache without running it: ``(True, result)`` on a hit, else ``(False, None)``.

    The key is the one Prefect's task engine computes (the task's own cache policy over the same
    parameters), read from the same result storage, so a hit here is the hit the engine would find. Flows
    use it to skip submitting calls that are already done: a rerun of 182 cached per-user tasks then costs
    no task runs (and no burst of state events that slows the next API call), and cached trainings start
    no worker processes. A record that cannot be read (cut short by a crash) is removed and reported as a
    miss, so the call runs again instead of failing on it. A record written in another data directory (this
    one moved or copied) is given with its paths under that directory moved to this one's
    (:func:`relocated`). The files are not checked here: :func:`current_result` does.
    """
    hit, value, _ = _lookup(task, parameters, storage)
    return hit, value


def _lookup(task: Any, parameters: dict[str, Any], storage: str | Path) -> tuple[bool, Any, bool]:
    """:func:`cached_result`, and whether the record was written in another data directory."""
    key = compat.engine_cache_key(task, parameters)
    if key is None:
        return False, None, False
    if not (Path(storage) / key).is_file():  # a stat: the store's exists() would deserialise the record
        return False, None, False
    try:
        record = _store(storage).read(key)
    except Exception as err:  # noqa: BLE001 - any unreadable record is a miss
        logger.warning("unreadable cache record %s (%s); recomputing", key, err)
        _drop(storage, key)
        return False, None, False
    written = record.metadata.storage_key
    then = _data_root(str(Path(written).parent)) if written and Path(written).is_absolute() else None
    now = _data_root(str(storage))
    if then is None or now is None or then == now:
        return True, record.result, False
    return True, relocated(record.result, then, now), True


def _drop(storage: str | Path, key: str) -> None:
    with contextlib.suppress(OSError):
        (Path(storage) / key).unlink()


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


def current_result(task: Any, parameters: dict[str, Any], storage: str | Path) -> tuple[bool, Any]:
    """:func:`cached_result`, reused only if every file the result points at is still the one written.

    A result with a file that is missing or whose content changed (:meth:`Artifact.problem`) is a miss: a
    warning names the file and the call, and the record is removed (the call runs again and writes a new
    one). A record read from a moved or copied data directory, or whose files passed on their content
    (new mtimes), is written again as it is now, so the next lookup takes the fast path.
    """
    hit, value, moved = _lookup(task, parameters, storage)
    if not hit:
        return False, None
    stale = stale_output(value)
    if stale is not None:
        logger.warning(
            "cached output %s no longer matches what was written (%s); recomputing %s",
            *stale,
            _call_name(task, parameters),
        )
        _drop(storage, compat.engine_cache_key(task, parameters))
        return False, None
    fresh = _map_artifacts(value, Artifact.restat)
    if moved or fresh is not value:
        store_result(task, parameters, storage, fresh)
    return True, fresh


def _call_name(task: Any, parameters: dict[str, Any]) -> str:
    """``task-name (its run's name)``, or the task's name where the run name cannot be formatted."""
    run_name = getattr(task, "task_run_name", None)
    if isinstance(run_name, str):
        with contextlib.suppress(Exception):
            return f"{task.name} ({run_name.format(**parameters)})"
    return task.name


def relocated(result: Any, then: str, now: str) -> Any:
    """``result`` with every :class:`Artifact` path and string under the folder ``then`` moved to ``now``."""

    def move(text: str) -> str:
        rest = _under(text, then)
        return text if rest is None else now + rest

    def one(value: Any) -> Any:
        if isinstance(value, Artifact):
            path = move(value.path)
            return value if path == value.path else replace(value, path=path)
        if isinstance(value, str):
            return move(value)
        return value

    return _map(result, one)


def _map_artifacts(result: Any, fn: Any) -> Any:
    """``result`` with ``fn`` applied to every :class:`Artifact` in it (itself if nothing changed)."""
    return _map(result, lambda value: fn(value) if isinstance(value, Artifact) else value)


def _map(value: Any, fn: Any) -> Any:
    """``fn`` applied to every leaf of dataclass fields, lists, tuples and dict values; containers are new
    only where something inside them changed (else the same object is returned)."""
    if isinstance(value, dict):
        items = {k: _map(v, fn) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    if isinstance(value, list | tuple):
        new = [_map(v, fn) for v in value]
        if all(a is b for a, b in zip(new, value, strict=True)):
            return value
        if isinstance(value, list):
            return new
        return type(value)(*new) if hasattr(value, "_fields") else tuple(new)  # a named tuple keeps its type
    if _is_instance(value) and not isinstance(value, Artifact):
        changed = {f.name: _map(getattr(value, f.name), fn) for f in fields(value) if f.init}
        changed = {k: v for k, v in changed.items() if v is not getattr(value, k)}
        return replace(value, **changed) if changed else value
    return fn(value)


def _is_instance(value: Any) -> bool:
    """A dataclass instance (not a dataclass type)."""
    return is_dataclass(value) and not isinstance(value, type)


def stale_output(result: Any) -> tuple[str, str] | None:
    """The first file a result points to that is not the one written, as ``(path, what is wrong)``, or None.

    Looks for :class:`Artifact` values in dataclass fields, lists, tuples and dict values.
    """
    if isinstance(result, Artifact):
        problem = result.problem()
        return None if problem is None else (result.path, problem)
    if _is_instance(result):
        children = (getattr(result, f.name) for f in fields(result))
    elif isinstance(result, dict):
        children = iter(result.values())
    elif isinstance(result, list | tuple):
        children = iter(result)
    else:
        return None
    return next((s for s in map(stale_output, children) if s is not None), None)


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
    hit, value = current_result(per_call, parameters, storage)
    if not hit:
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
