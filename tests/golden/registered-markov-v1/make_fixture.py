"""Write the registered-model fixture of tests/golden/registered-markov-v1 with the code of the tree it runs in.

A ``markov`` model fitted on the GeoLife sample, saved as a bundle and logged as the pyfunc model ``nextloc
train`` registers (:func:`tracking.versions.log_model`, into a throw-away SQLite store), its folder as MLflow
gives it back packed as ``model.tar.gz``; and the answers that code gives to the last week of each user's test
visits (and to one of them as a user it never saw): ``answers.json``.

    PYTHONPATH=<that tree> python make_fixture.py SAMPLE_DIR tests/golden/registered-markov-v1
"""

from __future__ import annotations

import gzip
import json
import sys
import tarfile
import tempfile
from pathlib import Path

import mlflow
import pandas as pd

from nextloc.config import PreprocessConfig
from nextloc.io.geolife import list_plt_files, list_user_dirs, read_user
from nextloc.models.baselines import BaselineModule, MarkovBaseline
from nextloc.models.batch import SampleTensors
from nextloc.predict.answer import predict_visits
from nextloc.preprocessing.dataset import build_dataset, locate_staypoints
from nextloc.preprocessing.staypoints import generate_staypoints
from nextloc.preprocessing.vocabulary import location_vocabulary, user_vocabulary
from nextloc.routine.novelty import NewPlaceHead
from nextloc.serving import load_bundle, save_bundle
from tracking import versions


def staypoints(sample: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every sample user's staypoints and tripleg extents, as the preprocess tasks make them."""
    users, _ = list_user_dirs(sample)
    found = {
        user_id: generate_staypoints(read_user(user_id, list_plt_files(folder))[0].to_pandas())
        for user_id, folder in users
    }
    extents = pd.DataFrame({"user_id": list(found)})
    for end in ("tripleg_start", "tripleg_end"):
        extents[end] = pd.to_datetime([getattr(result, end) for result in found.values()], utc=True)
    return pd.concat([result.staypoints for result in found.values()], ignore_index=True), extents


def pack(folder: Path, archive: Path) -> None:
    """``folder`` as a gzipped tar whose bytes depend on the files alone (no times, owners or modes)."""

    def plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        info.mode = 0o755 if info.isdir() else 0o644
        return info

    with gzip.GzipFile(archive, "wb", mtime=0) as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(
                path, arcname=str(Path(folder.name) / path.relative_to(folder)), recursive=False, filter=plain
            )


def histories(final: pd.DataFrame, locations: pd.DataFrame) -> pd.DataFrame:
    """Each user's last 7 days of test-split visits, at their locations' centres, and the first user's
    again as a user the model never saw."""
    centres = locations.set_index("loc_index")
    test = final[final["split"] == "test"]
    frames = []
    for user_id, rows in test.groupby("user_id"):
        rows = rows[rows["started_at"] >= rows["finished_at"].max() - pd.Timedelta(days=7)]
        frames.append(
            pd.DataFrame(
                {
                    "history_id": str(user_id),
                    "user_id": user_id,
                    "started_at": rows["started_at"].dt.strftime("%Y-%m-%dT%H:%M:%S").to_numpy(),
                    "finished_at": rows["finished_at"].dt.strftime("%Y-%m-%dT%H:%M:%S").to_numpy(),
                    "latitude": centres["latitude"].reindex(rows["location_id"]).fillna(10.0).to_numpy(),
                    "longitude": centres["longitude"].reindex(rows["location_id"]).fillna(10.0).to_numpy(),
                }
            )
        )
    stranger = frames[0].assign(history_id="stranger", user_id=999)  # a user the model never saw
    return pd.concat([*frames, stranger], ignore_index=True)


def main(sample: Path, out: Path) -> None:
    config = PreprocessConfig()
    sps, extents = staypoints(sample)
    located = locate_staypoints(sps, extents, config)
    dataset = build_dataset(located.staypoints, config)
    n_loc = int(dataset.stats["total_loc_num"])
    model = BaselineModule(MarkovBaseline(n_loc).fit(SampleTensors(dataset.samples["train"])))
    locations = location_vocabulary(located.staypoints, dataset.staypoints)
    visits = histories(dataset.staypoints, locations)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = save_bundle(
            Path(tmp) / "bundle",
            "markov",
            model,
            config,
            NewPlaceHead.constant(0.25),
            locations,
            user_vocabulary(dataset.staypoints),
        )
        mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
        mlflow.set_experiment(experiment_id=mlflow.create_experiment("fixture", f"{tmp}/artifacts"))
        with mlflow.start_run():
            uri, _, _ = versions.log_model(bundle, visits.head(3), "markov", ["mlflow", "nextloc"])
        model_dir = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=f"{tmp}/download"))
        pack(model_dir.rename(Path(tmp) / "model"), out / "model.tar.gz")
        answers = {
            "visits": visits.to_dict(orient="list"),
            "bundle": predict_visits(load_bundle(bundle), visits, k=5, coverage=0.8),
            "pyfunc": mlflow.pyfunc.load_model(f"{tmp}/model").predict(visits, params={"k": 3}),
        }
    (out / "answers.json").write_text(json.dumps(answers, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
