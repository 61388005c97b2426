"""Scale-out: per-user preprocessing on a 2-worker Dask LocalCluster gives the local runner's bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def _digests(root: Path) -> dict[str, str]:
    outputs = [
        p for p in root.rglob("*") if p.is_file() and "_cache" not in p.parts and not p.name.startswith(".")
    ]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in outputs}


def test_dask_local_cluster_outputs_are_byte_identical(sample_dir, tmp_path):
    from flows.preprocess import preprocess
    from tasks.runners import make_task_runner

    local = preprocess.with_options(task_runner=make_task_runner("local", 2))(
        raw_dir=str(sample_dir), data_dir=str(tmp_path / "local")
    )
    dask = preprocess.with_options(task_runner=make_task_runner("dask", 2))(
        raw_dir=str(sample_dir), data_dir=str(tmp_path / "dask")
    )
    assert dask["stats"] == local["stats"]
    a, b = _digests(tmp_path / "local"), _digests(tmp_path / "dask")
    assert len(a) > 20  # per-user partitions, staypoints, samples, vocabulary, metadata, report
    assert a == b


def test_runner_choices_are_checked():
    from tasks.runners import make_task_runner

    with pytest.raises(ValueError, match="'local' or 'dask'"):
        make_task_runner("spark")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only used with task_runner='dask'"):
        make_task_runner("local", dask_address="tcp://127.0.0.1:8786")
