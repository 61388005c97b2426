"""A duplicate user on the real GeoLife sample: one sample user's files copied under a new user id.

The preprocess flow must name the pair with the right counts in ``ingest_report.json``; the option must
drop the copy (and count it), after which the outputs are those of the sample without the copy, byte for
byte; with the option off the sample's own outputs are unchanged; and the metrics without copies leave out
exactly the copied user's test samples.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from nextloc.config import PreprocessConfig
from nextloc.io.geolife import list_plt_files

pytestmark = pytest.mark.usefixtures("prefect_api")

COPY = 900  # above every sample user: the copy, never the first holder
OUTPUTS = [
    "staypoints.parquet",
    "samples/train.parquet",
    "samples/val.parquet",
    "samples/test.parquet",
    "vocabulary/locations.parquet",
    "vocabulary/users.parquet",
]
DROP = PreprocessConfig(duplicates={"drop_shared_files": True})


def _run(raw_dir: Path, data_dir: Path, config: PreprocessConfig | None = None) -> dict:
    from flows.preprocess import preprocess

    return preprocess(raw_dir=str(raw_dir), data_dir=str(data_dir), config=config)


def _report(data_dir: Path) -> dict:
    return json.loads((data_dir / "ingest_report.json").read_text())


@pytest.fixture(scope="module")
def runs(sample_dir, tmp_path_factory) -> dict:
    """The sample (as is, and with the option on), and the sample plus a copy of one of its users with
    a test split (option off, and on)."""
    root = tmp_path_factory.mktemp("dupes")
    out = {"plain": root / "plain", "plain_drop": root / "plain-drop", "kept": root / "kept"}
    out["dropped"] = root / "dropped"
    _run(sample_dir, out["plain"])
    source = int(pq.read_table(out["plain"] / "samples" / "test.parquet").column("user_id")[0].as_py())
    raw = root / "raw" / "Data"
    raw.mkdir(parents=True)
    for user in sorted((sample_dir / "Data").iterdir()):
        (raw / user.name).symlink_to(user.resolve(), target_is_directory=True)
    files = list_plt_files(sample_dir / "Data" / f"{source:03d}")
    (raw / f"{COPY:03d}" / "Trajectory").mkdir(parents=True)
    for f in files:
        shutil.copyfile(f, raw / f"{COPY:03d}" / "Trajectory" / f.name)
    _run(sample_dir, out["plain_drop"], DROP)
    _run(raw.parent, out["kept"])
    _run(raw.parent, out["dropped"], DROP)
    return {**out, "source": source, "n_files": len(files)}


def _user_rows(data_dir: Path, name: str, user_id: int):
    table = pq.read_table(data_dir / name)
    return table.filter(pc.equal(table.column("user_id"), user_id))


def test_the_sample_has_no_duplicates(runs) -> None:
    duplicates = _report(runs["plain"])["duplicates"]
    assert duplicates["pairs"] == []
    assert duplicates["copied_test_samples"] == 0
    assert duplicates["n_files_dropped"] == 0
    assert duplicates["test_samples"] == pq.read_table(runs["plain"] / "samples" / "test.parquet").num_rows


def test_report_names_the_pair_with_its_counts(runs) -> None:
    kept, source = runs["kept"], runs["source"]
    duplicates = _report(kept)["duplicates"]
    source_sp = _user_rows(kept, "staypoints.parquet", source)
    copy_sp = _user_rows(kept, "staypoints.parquet", COPY)
    columns = ["started_at", "finished_at", "raw_location_id", "split"]
    assert copy_sp.select(columns).equals(source_sp.select(columns))  # the copy, staypoint for staypoint
    n_copied_test = _user_rows(kept, "samples/test.parquet", COPY).num_rows
    assert n_copied_test > 0
    assert duplicates["pairs"] == [
        {
            "users": [source, COPY],
            "shared_files": runs["n_files"],
            "shared_staypoints": source_sp.num_rows,
            "copied_test_samples": n_copied_test,
        }
    ]
    assert duplicates["copied_staypoints"] == copy_sp.num_rows
    assert duplicates["copied_test_samples"] == n_copied_test
    assert duplicates["drop_shared_files"] is False
    assert duplicates["files_dropped"] == {}
    assert duplicates["n_files_dropped"] == 0


def test_the_option_drops_the_copy_and_counts_it(runs) -> None:
    dropped, source = runs["dropped"], runs["source"]
    report = _report(dropped)
    duplicates = report["duplicates"]
    assert duplicates["drop_shared_files"] is True
    assert duplicates["files_dropped"] == {str(COPY): runs["n_files"]}
    assert duplicates["n_files_dropped"] == runs["n_files"]
    # the files are still shared (and reported); their staypoints are read once
    assert duplicates["pairs"] == [
        {
            "users": [source, COPY],
            "shared_files": runs["n_files"],
            "shared_staypoints": 0,
            "copied_test_samples": 0,
        }
    ]
    assert report["files_read"] == _report(runs["plain"])["files_read"]
    assert _user_rows(dropped, "staypoints.parquet", COPY).num_rows == 0


@pytest.mark.parametrize("pair", [("dropped", "plain"), ("plain_drop", "plain")])
def test_outputs_are_byte_identical(runs, pair) -> None:
    """The copy dropped gives the sample's own outputs; on data without copies the option changes nothing."""
    left, right = (runs[name] for name in pair)
    for name in OUTPUTS:
        assert (left / name).read_bytes() == (right / name).read_bytes(), name


def test_metrics_without_copies_leave_out_exactly_the_copied_samples(runs) -> None:
    """The copied user's test samples are flagged, and only they; the metrics without them are those of a
    split holding only the other samples."""
    from nextloc.evaluation.evaluate import evaluate, model_scores
    from nextloc.evaluation.metrics import DEDUP_KEYS
    from nextloc.models import registry
    from nextloc.models.baselines import BaselineModule
    from nextloc.models.batch import SampleTensors
    from nextloc.raw.duplicates import copied_samples

    kept = runs["kept"]
    splits = {
        s: SampleTensors.from_parquet(kept / "samples" / f"{s}.parquet") for s in ("train", "val", "test")
    }
    meta = json.loads((kept / "metadata.json").read_text())
    model = BaselineModule(registry.kind("markov").model_class(meta["total_loc_num"]).fit(splits["train"]))
    evaluation = evaluate(model_scores(model), model_scores(model), splits["val"], splits["test"])
    evaluation.test_copied = copied_samples(kept / "staypoints.parquet", splits["test"].table)
    assert np.array_equal(evaluation.test_copied, splits["test"].user_id_np == COPY)
    assert evaluation.per_sample()["target_is_copy"].tolist() == evaluation.test_copied.tolist()
    dedup = evaluation.dedup()
    table = splits["test"].table
    others = SampleTensors(table.filter(pc.not_equal(table.column("user_id"), COPY)))
    alone = evaluate(model_scores(model), model_scores(model), splits["val"], others).test
    assert dedup["n_test_dedup"] == alone["n"] == len(table) - int(evaluation.test_copied.sum())
    for key in DEDUP_KEYS:
        assert dedup[key] == pytest.approx(alone[key.removesuffix("_dedup")])
    assert evaluation.test["n"] == len(table)
