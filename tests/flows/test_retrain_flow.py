"""retrain: new trajectory dumps reach the model, and only what they touch is recomputed.

Real Prefect API (temporary), real MLflow store (SQLite in tmp), real GeoLife sample files. The store
starts as the sample without the last days of user 073; those days then arrive as a dump (zip), next to a
byte-identical copy of it (a repeat) and a broken dump.
"""

from __future__ import annotations

import json
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

USER = 73
WITHHELD = 25
SHORT = {"max_epochs": 1, "min_epochs": 0}


def _zip(folder: Path, files: list[Path], out: Path, prefix: str = "Geolife Trajectories 1.3/") -> Path:
    with zipfile.ZipFile(out, "w") as zf:
        for f in files:
            zf.write(f, prefix + str(f.relative_to(folder)))
    return out


def _stat(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*.parquet")
    }


@pytest.fixture(scope="module")
def world(sample_dir, tmp_path_factory):
    """A raw store missing user 073's last days, a first preprocess-train (the champion), then the dumps."""
    from flows.pipeline import preprocess_train

    root = tmp_path_factory.mktemp("retrain")
    store = root / "store"
    shutil.copytree(sample_dir / "Data", store / "Data")
    user_files = sorted((store / "Data" / f"{USER:03d}" / "Trajectory").glob("*.plt"))
    withheld = root / "withheld"
    for f in user_files[-WITHHELD:]:
        target = withheld / f.relative_to(store)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(f, target)
    (root / "mlruns").mkdir()
    common = {
        "data_dir": str(root / "data"),
        "training": {"models": ["markov", "mhsa"], "train_overrides": {"mhsa": SHORT}, "workers": 1},
        "tracking": {"tracking_uri": f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"},
    }
    first = preprocess_train(raw_dir=str(store), **common)
    incoming = root / "incoming"
    incoming.mkdir()
    new_days = sorted(withheld.rglob("*.plt"))
    _zip(withheld, new_days, incoming / "2026-11-01-user073.zip")
    shutil.copy(incoming / "2026-11-01-user073.zip", incoming / "2026-11-02-resent.zip")
    broken = incoming / "2026-11-03-broken"
    (broken / "Data" / "011" / "Trajectory").mkdir(parents=True)
    (broken / "Data" / "011" / "Trajectory" / "20990101000000.plt").write_text("<html>503</html>\n")
    # a valid header over garbage rows, beside a good new file: the whole dump must stay out of the store
    good = sorted((store / "Data" / "011" / "Trajectory").glob("*.plt"))[0]
    header = b"".join(good.read_bytes().splitlines(keepends=True)[:6])
    with zipfile.ZipFile(incoming / "2026-11-04-garbage.zip", "w") as zf:
        zf.writestr("export/Data/011/Trajectory/20990102000000.plt", header + b"x,y,z\n" * 5)
        zf.writestr("export/Data/011/Trajectory/20990103000000.plt", good.read_bytes())
    before = {
        "store": sorted(p.relative_to(store) for p in store.rglob("*.plt")),
        "data": _stat(root / "data"),
    }
    return root, store, incoming, common, first, before, new_days


@pytest.fixture(scope="module")
def retrained(world):
    from flows.retrain import retrain

    root, store, incoming, common, *_ = world
    result = retrain(incoming_dir=str(incoming), raw_dir=str(store), intake={"min_age_s": 0}, **common)
    return result


def test_new_dump_merged_repeat_is_noop_broken_is_quarantined(world, retrained):
    root, store, incoming, _, _, before, new_days = world
    by_name = {d["name"]: d for d in retrained["merged"]["dumps"]}
    assert by_name["2026-11-01-user073.zip"]["status"] == "merged"
    assert by_name["2026-11-01-user073.zip"]["files_new"] == WITHHELD
    assert by_name["2026-11-01-user073.zip"]["users"] == [USER]
    assert by_name["2026-11-02-resent.zip"]["status"] == "duplicate"
    assert "2026-11-01-user073.zip" in by_name["2026-11-02-resent.zip"]["reason"]
    rejected = by_name["2026-11-03-broken"]
    assert rejected["status"] == "rejected"
    assert "20990101000000.plt" in rejected["reason"]
    reason_file = incoming / "quarantine" / "2026-11-03-broken.reason.txt"
    assert "do not parse" in reason_file.read_text()
    assert (incoming / "quarantine" / "2026-11-03-broken" / "Data").is_dir()  # kept for a human to look at
    assert sorted(p.name for p in (incoming / "applied").iterdir()) == [
        "2026-11-01-user073.zip",
        "2026-11-02-resent.zip",
    ]
    # nothing lost or changed: every file that was there is still there; the new days were added
    after = sorted(p.relative_to(store) for p in store.rglob("*.plt"))
    assert set(before["store"]) <= set(after)
    assert len(after) == len(before["store"]) + WITHHELD
    assert not (store / "Data" / "011" / "Trajectory" / "20990101000000.plt").exists()
    manifest = json.loads((store / "dumps-manifest.json").read_text())
    assert [d["status"] for d in manifest["dumps"]] == ["merged", "duplicate", "rejected", "rejected"]


def test_a_dump_with_a_file_of_no_valid_row_is_quarantined_whole(world, retrained):
    """A GeoLife header over garbage rows used to be merged ("3 rows skipped") and stay in the append-only
    store for good; now the dump is quarantined with its good file, and the reason names the file by its
    path inside the archive (not the deleted staging folder)."""
    root, store, incoming, *_ = world
    by_name = {d["name"]: d for d in retrained["merged"]["dumps"]}
    rejected = by_name["2026-11-04-garbage.zip"]
    assert rejected["status"] == "rejected"
    reason = (incoming / "quarantine" / "2026-11-04-garbage.zip.reason.txt").read_text()
    assert reason.startswith(
        "2026-11-04-garbage.zip: export/Data/011/Trajectory/20990102000000.plt: no valid row"
    )
    assert "_dumps" not in reason
    assert "staging" not in reason
    for name in ("20990102000000.plt", "20990103000000.plt"):
        assert not (store / "Data" / "011" / "Trajectory" / name).exists()


def test_merged_files_keep_the_store_permissions(world, retrained):
    _, store, *_ = world
    modes = {stat.S_IMODE(p.stat().st_mode) for p in store.rglob("*.plt")}
    assert len(modes) == 1, modes  # the new days have the mode of the files already there


def test_only_the_affected_user_was_recomputed(world, retrained, task_states):
    root, *_, before, _ = world
    states = task_states(retrained["preprocess_flow_run_id"], expected=5)
    ran = {k for k in states if k.startswith(("ingest user", "staypoints user", "ingest-user", "generate-"))}
    # the other 10 users: cache; the changed user's ingestion goes straight on to its staypoints
    assert ran == {f"ingest user {USER:03d} + generate-staypoints-user"}
    assert all(states[k] == "Completed" for k in ran)
    assert retrained["users_run"] == {"ingest": 1, "staypoints": 1}
    after = _stat(root / "data")
    changed = {k for k in before["data"] if after.get(k) != before["data"][k]}
    per_user = {k for k in changed if k.startswith(("01_", "02_"))}
    assert per_user == {
        f"01_positionfixes/user_id={USER:03d}/part-0.parquet",
        f"02_staypoints/user_id={USER:03d}/part-0.parquet",
    }


def test_champion_moves_only_if_the_challenger_is_better(world, retrained):
    import mlflow
    from mlflow import MlflowClient

    root, _, _, common, first, *_ = world
    assert first["promotion"]["mhsa"]["promoted"]
    assert first["promotion"]["mhsa"]["reason"] == "no champion yet"
    decision = retrained["promotion"]["mhsa"]
    assert {"challenger_score", "champion_score", "champion_version", "challenger_version"} <= set(decision)
    # the one champion rule: a place metric, a paired bootstrap over the validation samples (test is read
    # by no decision) and a minimum effect
    assert decision["metric"] == "val place_mrr"
    assert decision["test"].startswith("paired bootstrap over ")
    assert "validation samples" in decision["test"]
    import pandas as pd

    val = pd.read_parquet(Path(common["data_dir"]) / "results" / "mhsa" / "seed0" / "val_per_sample.parquet")
    assert decision["challenger_score"] == pytest.approx(val["place_mrr"].mean())
    assert sum(g["n"] for g in decision["groups"].values()) == len(val)
    assert decision["delta"] == pytest.approx(decision["challenger_score"] - decision["champion_score"])
    assert 0 < decision["p_value"] <= 1
    assert decision["promoted"] == (
        decision["delta"] >= decision["min_effect"] and decision["p_value"] < decision["alpha"]
    )
    # the data changed under it: the champion reads today's validation in its own ids
    assert decision["champion_scored_on"].startswith("the validation split translated into its ids")
    # user 073 got new days: its validation samples are the "changed" group, the other users "unchanged"
    assert decision["groups"]["changed"]["n"] > 0
    assert set(decision["groups"]) <= {"changed", "unchanged", "new_user"}
    uri = common["tracking"]["tracking_uri"]
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri, uri)
    champion = client.get_model_version_by_alias("nextloc-mhsa", "champion")
    expected = (
        decision["challenger_version"]
        if decision["promoted"]
        else first["promotion"]["mhsa"]["challenger_version"]
    )
    assert str(champion.version) == expected
    parent = client.get_run(retrained["parent_run_id"])
    assert parent.data.tags["champion_challenger.mhsa.decision"] == (
        "promoted" if decision["promoted"] else "kept"
    )
    metrics = parent.data.metrics
    assert metrics["champion_challenger.mhsa.challenger_val_place_mrr"] == pytest.approx(
        decision["challenger_score"]
    )
    assert metrics["champion_challenger.mhsa.champion_val_place_mrr"] == pytest.approx(
        decision["champion_score"]
    )
    assert metrics["champion_challenger.mhsa.p_value"] == pytest.approx(decision["p_value"])


def test_nothing_new_is_a_noop(world, retrained):
    from flows.retrain import retrain

    root, store, incoming, common, *_ = world
    shutil.copy(incoming / "applied" / "2026-11-01-user073.zip", incoming / "again.zip")
    result = retrain(
        incoming_dir=str(incoming), raw_dir=str(store), data_dir=common["data_dir"], intake={"min_age_s": 0}
    )
    assert result["retrained"] is False
    assert [d["status"] for d in result["merged"]["dumps"]] == ["duplicate"]
