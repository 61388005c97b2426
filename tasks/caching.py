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
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prefect.cache_policies import TASK_SOURCE, CachePolicy
from prefect.filesystems import LocalFileSystem
from prefect.results import ResultStore
from pydantic import BaseModel

import nextloc
from nextloc.fingerprint import hash_text


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


def cached_result(task: Any, parameters: dict[str, Any], storage: str | Path) -> tuple[bool, Any]:
    """Look a call up in Prefect's cache without running it: ``(True, result)`` on a hit, else ``(False, None)``.

    The key is the one Prefect's task engine computes (the task's own cache policy over the same
    parameters), read from the same result storage, so a hit here is the hit the engine would find. Flows
    use it to skip submitting calls that are already done: a rerun of 182 cached per-user tasks then costs
    no task runs (and no burst of state events that slows the next API call), and cached trainings start
    no worker processes. A record that cannot be read (cut short by a crash) is removed and reported as a
    miss, so the call runs again instead of failing on it.
    """
    key = task.cache_policy.compute_key(
        task_ctx=SimpleNamespace(task=task), inputs=parameters, flow_parameters={}
    )
    if key is None:
        return False, None
    store = ResultStore(result_storage=LocalFileSystem(basepath=str(storage)))
    if not store.exists(key):
        return False, None
    try:
        return True, store.read(key).result
    except Exception as err:  # noqa: BLE001 - any unreadable record is a miss
        logger.warning("unreadable cache record %s (%s); recomputing", key, err)
        with contextlib.suppress(OSError):
            (Path(storage) / key).unlink()
        return False, None


def call_cached(task: Any, *args: Any) -> Any:
    """Call ``task`` (its ``result_storage`` set), or return its cached result without a task run.

    The lookup is :func:`cached_result`'s, so a hit here is the one Prefect's engine would find; a miss
    runs the task, which caches its result.
    """
    parameters = dict(inspect.signature(task.fn).bind(*args).arguments)
    hit, result = cached_result(task, parameters, task.result_storage)
    return result if hit else task(*args)
