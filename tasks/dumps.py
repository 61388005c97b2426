"""Prefect task: merge the new trajectory dumps of an incoming folder into the raw store, once each.

The manifest (``<raw_dir>/dumps-manifest.json``) records every dump by content fingerprint: merged,
duplicate (the same bytes as a dump merged before: a no-op) or rejected. Merged and duplicate dumps move
to ``<incoming>/applied/``; rejected ones to ``<incoming>/quarantine/`` with a ``<name>.reason.txt``
beside them. Nothing already in the store is ever changed or removed.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Annotated, Any

from prefect import get_run_logger, task
from pydantic import BaseModel, ConfigDict, Field

from nextloc.atomic import write_text_atomic
from nextloc.raw.dumps import (
    DEFAULT_MAX_BAD_ROW_SHARE,
    DumpRejected,
    apply_merge,
    dump_fingerprint,
    list_dumps,
    plan_merge,
    unpack_dump,
)
from nextloc.storage import write_json

APPLIED = "applied"
QUARANTINE = "quarantine"
MANIFEST = "dumps-manifest.json"


class DumpIntake(BaseModel):
    """The ``intake`` section of the ``retrain`` flow: which dumps are merged, and whether to retrain anyway.

    Attributes:
        min_age_s: dumps changed more recently than this are left for the next run (a copy may be running).
        max_bad_row_share: a dump with a file that has more than this share of bad rows (or no valid row)
            is quarantined whole: the raw store is append-only.
        force: run ``preprocess-train`` even if no new file arrived.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_age_s: Annotated[float, Field(ge=0)] = 60.0
    max_bad_row_share: Annotated[float, Field(ge=0, le=1)] = DEFAULT_MAX_BAD_ROW_SHARE
    force: bool = False


def manifest_path(raw_dir: str | Path) -> Path:
    """Where the manifest of merged dumps lives: beside the store's ``Data/``."""
    return Path(raw_dir) / MANIFEST


def read_manifest(raw_dir: str | Path) -> dict[str, Any]:
    """The manifest (``{"dumps": [...]}``); empty when no dump was merged yet."""
    path = manifest_path(raw_dir)
    if not path.exists():
        return {"dumps": []}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: the dumps manifest is not valid JSON ({err}); fix or remove it") from err
    if not isinstance(data, dict) or not isinstance(data.get("dumps"), list):
        raise ValueError(f"{path}: expected an object with a 'dumps' list")
    return data


@task(name="merge-new-dumps")
def merge_new_dumps(
    incoming_dir: str,
    raw_dir: str,
    staging_dir: str,
    min_age_s: float = 30.0,
    max_bad_row_share: float = DEFAULT_MAX_BAD_ROW_SHARE,
) -> dict[str, Any]:
    """Merge every new dump in ``incoming_dir`` into ``raw_dir``; returns what happened to each.

    A dump with a file that has no valid row, or more than ``max_bad_row_share`` of its rows bad, is
    quarantined whole (see :func:`nextloc.raw.dumps.plan_merge`).

    Returns:
        ``{"dumps": [manifest entries of this run], "users": [users with new files], "files_new": n}``.
    """
    logger = get_run_logger()
    incoming, store = Path(incoming_dir), Path(raw_dir)
    manifest = read_manifest(store)
    merged_by_fp = {d["fingerprint"]: d for d in manifest["dumps"] if d["status"] == "merged"}
    entries: list[dict[str, Any]] = []
    for dump in list_dumps(incoming, min_age_s, skip=(APPLIED, QUARANTINE)):
        fingerprint = dump_fingerprint(dump)
        staging = Path(staging_dir) / fingerprint.replace(":", "-")
        entry: dict[str, Any] = {
            "name": dump.name,
            "fingerprint": fingerprint,
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        if fingerprint in merged_by_fp:
            entry.update(status="duplicate", reason=f"same content as {merged_by_fp[fingerprint]['name']}")
            logger.info("%s: %s; nothing to do", dump.name, entry["reason"])
        else:
            try:
                root = unpack_dump(dump, staging)
                plan = plan_merge(dump.name, root, store, max_bad_row_share)
                users = apply_merge(plan, store)
                entry.update(
                    status="merged",
                    users=users,
                    files_new=len(plan.new),
                    files_present=len(plan.present),
                    rows_skipped=plan.report.rows_skipped,
                    issues=[str(i) for i in plan.report.issues[:20]],
                )
                merged_by_fp[fingerprint] = entry
                logger.info(
                    "%s: merged %d new files (%d already present) for users %s",
                    dump.name,
                    len(plan.new),
                    len(plan.present),
                    users,
                )
            except DumpRejected as err:
                entry.update(status="rejected", reason=str(err))
                logger.error("%s: quarantined: %s", dump.name, err)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        manifest["dumps"].append(entry)
        write_json(manifest, manifest_path(store))  # recorded before the dump moves
        _move(dump, incoming / (QUARANTINE if entry["status"] == "rejected" else APPLIED), entry)
        entries.append(entry)
    users = sorted({u for e in entries for u in e.get("users", [])})
    return {"dumps": entries, "users": users, "files_new": sum(e.get("files_new", 0) for e in entries)}


def _move(dump: Path, folder: Path, entry: dict[str, Any]) -> None:
    """Move a processed dump out of the way (never overwriting); a rejected one gets its reason beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / dump.name
    if target.exists():
        target = folder / f"{dump.name}.{entry['fingerprint'].split(':')[-1][:8]}"
    shutil.move(str(dump), str(target))
    entry["moved_to"] = str(target)
    if entry["status"] == "rejected":
        write_text_atomic(target.with_name(target.name + ".reason.txt"), entry["reason"] + "\n")
