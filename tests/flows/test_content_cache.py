"""Caches keyed on content, not on paths: a copied data directory and another spelling of the raw folder
find every result; a cached output whose file changed is recomputed, with a warning that names it.

Real flows on the GeoLife sample, a real Prefect API and a temporary MLflow store (one markov seed).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from uuid import UUID

import pytest

pytestmark = pytest.mark.usefixtures("prefect_api")

REPORT = "ingest_report.json"
CACHED_RERUN = {"discover-raw-users", "write-ingest-report", "report-duplicates"}  # the uncached IO tasks


def _preprocess(raw_dir: str | Path, data_dir: Path) -> dict:
    from flows.preprocess import preprocess

    state = preprocess(raw_dir=str(raw_dir), data_dir=str(data_dir), return_state=True)
    assert state.is_completed()
    return state.result()


def _train(data_dir: Path, uri: str) -> dict:
    from flows.train import train

    training = {"models": ["markov"], "seeds": [0]}
    return train(
        data_dir=str(data_dir), training=training, tracking={"tracking_uri": uri, "experiment": "cache"}
    )


def _files(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every output file under ``root`` (the cache and lock files aside): mtime and bytes."""
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file() and "_cache" not in p.parts and not p.name.startswith(".")
    }


def _assert_not_rewritten(before: dict, after: dict) -> None:
    """The same files with the same bytes, none written again but the ingest report (every run writes it)."""
    assert {k: v[1] for k, v in after.items()} == {k: v[1] for k, v in before.items()}
    assert {k: v for k, v in after.items() if k != REPORT} == {k: v for k, v in before.items() if k != REPORT}


def _task_names(task_states, result: dict) -> set[str]:
    return {name.rsplit("-", 1)[0] for name in task_states(UUID(result["flow_run_id"]), 3)}


@pytest.fixture(scope="module")
def base(sample_dir, tmp_path_factory):
    """A small preprocess + train (markov, seed 0) run: its data directory, tracking URI and results."""
    root = tmp_path_factory.mktemp("content-cache")
    data_dir = root / "data"
    uri = f"sqlite:///{root / 'mlflow.db'}"
    preprocessed = _preprocess(sample_dir, data_dir)
    trained = _train(data_dir, uri)
    return data_dir.resolve(), uri, preprocessed, trained


def test_a_copied_data_directory_is_all_cache_hits(base, sample_dir, tmp_path, task_states):
    """A data directory copied elsewhere (new mtimes, as ``cp -r`` gives) reruns nothing: no ingestion, no
    staypoints, no dataset step, no training; and every path handed on points into the copy."""
    from nextloc.preprocessing.sequences import SPLITS
    from runtime.caching import cached_result
    from runtime.catalog import Catalog
    from tasks.preprocess import discover_raw_users, ingest_user

    data_dir, uri, preprocessed, trained = base
    copy = (tmp_path / "elsewhere" / "copy").resolve()
    shutil.copytree(data_dir, copy, copy_function=shutil.copy)  # contents only: every mtime is new
    catalog = Catalog(str(copy))
    users, _ = discover_raw_users(str(sample_dir), catalog)
    call = {"user": users[2], "out_path": str(catalog.positionfixes(users[2].user_id))}
    hit, ingested = cached_result(ingest_user.with_options(result_storage=catalog.cache), call, catalog.cache)
    assert hit
    assert ingested.positionfixes.path == call["out_path"]  # the record was written in data_dir
    before = _files(copy)

    again = _preprocess(sample_dir, copy)
    assert again["users_run"] == {"ingest": 0, "staypoints": 0}
    assert _task_names(task_states, again) == CACHED_RERUN  # no locate-staypoints, no build-dataset
    assert again["data_dir"] == str(copy)
    assert again["stats"] == preprocessed["stats"]

    retrained = _train(copy, uri)
    assert [r["run_id"] for r in retrained["runs"]] == [r["run_id"] for r in trained["runs"]]  # no training
    assert retrained["data"].data_dir == str(copy)
    assert all(Path(retrained["data"].samples[s].path).is_relative_to(copy) for s in SPLITS)
    _assert_not_rewritten(before, _files(copy))
    # the records were written again as they are now: under the copy, with the copy's file stats
    hit, ingested = cached_result(ingest_user.with_options(result_storage=catalog.cache), call, catalog.cache)
    assert hit
    assert ingested.positionfixes.path == call["out_path"]
    assert ingested.positionfixes.mtime_ns == os.stat(call["out_path"]).st_mtime_ns


def test_another_spelling_of_the_raw_folder_is_all_cache_hits(base, sample_dir, task_states):
    """The raw folder given relative, with ``./`` and a trailing slash, instead of absolute: nothing runs."""
    data_dir, _, preprocessed, _ = base
    before = _files(data_dir)
    spelled = f"./{os.path.relpath(sample_dir)}/"
    assert not os.path.isabs(spelled)
    again = _preprocess(spelled, data_dir)
    assert again["users_run"] == {"ingest": 0, "staypoints": 0}
    assert _task_names(task_states, again) == CACHED_RERUN
    assert again["stats"] == preprocessed["stats"]
    _assert_not_rewritten(before, _files(data_dir))  # the report too: the raw paths in it are absolute


def test_a_corrupted_intermediate_output_is_recomputed_with_a_warning(
    base, sample_dir, tmp_path, task_states, caplog
):
    """One user's staypoints overwritten with other bytes of the same size: that user's staypoints are
    recomputed (byte-identical to the first run's), a warning names the file and the task, and the steps
    below are cache hits again (the same content)."""
    data_dir, _, preprocessed, _ = base
    copy = (tmp_path / "corrupt").resolve()
    shutil.copytree(data_dir, copy)  # mtimes kept: the fast path
    victim = sorted((copy / "02_staypoints").glob("user_id=*/part-0.parquet"))[1]
    user = victim.parent.name.removeprefix("user_id=")
    original = victim.read_bytes()
    victim.write_bytes(original[::-1])  # same size, other bytes, new mtime
    with caplog.at_level(logging.WARNING, logger="nextloc.cache"):
        again = _preprocess(sample_dir, copy)
    assert victim.read_bytes() == original
    assert again["users_run"] == {"ingest": 0, "staypoints": 1}
    assert _task_names(task_states, again) == CACHED_RERUN | {f"staypoints user {user}"}
    assert again["stats"] == preprocessed["stats"]
    warnings = [r.getMessage() for r in caplog.records if r.name == "nextloc.cache"]
    assert warnings == [
        f"cached output {victim} no longer matches what was written (content changed); "
        f"recomputing generate-staypoints-user (staypoints user {user})"
    ]
