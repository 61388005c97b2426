"""The ``nextloc`` command's arguments: each subcommand's options, and how they become the flows' inputs.

One function per subcommand adds its options; :data:`SUBCOMMANDS` lists them in the order ``nextloc --help``
shows them. The option groups several subcommands share (input, training, tracking, preprocessing config)
are defined once, below them.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.deployments import WORK_POOL
from nextloc.config import PreprocessConfig, flatten, load_config
from nextloc.io.inputs import INPUT_FORMATS
from nextloc.models.registry import DEFAULT_KINDS, KINDS
from nextloc.preprocessing.trackintel_export import TRACKINTEL_FORMATS
from nextloc.raw.rawdata import DEFAULT_RAW_DIR
from nextloc.synth import SYNTH_FORMATS
from services.ui import DEFAULT_PORT as UI_PORT

DEFAULT_DATA_DIR = "data/geolife"


@dataclass(frozen=True)
class Subcommand:
    """A subcommand: the function adding its options, its one-line help and its longer description."""

    add_arguments: Callable[[argparse.ArgumentParser], None]
    help: str
    description: str | None = None


def _preprocess_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--raw-dir",
        default=None,
        help="GeoLife root (Data/NNN/Trajectory/*.plt), a CSV/parquet/visits file or folder, or a GPX folder "
        "(NNN/*.gpx); default: the --dataset profile's",
    )
    parser.add_argument(
        "--data-dir", default=None, help=f"output folder (default data/<dataset>, {DEFAULT_DATA_DIR})"
    )
    _add_input_options(parser)
    _add_config_options(parser)


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=None, help=f"default data/<dataset> ({DEFAULT_DATA_DIR})")
    _add_input_options(parser)
    _add_train_options(parser)
    parser.add_argument(
        "--raw-dir",
        default=None,
        help=f"default: $NEXTLOC_GEOLIFE_DIR, {DEFAULT_RAW_DIR}, a local archive, or download",
    )
    _add_runner_options(parser, "per-user preprocessing and the trainings")
    parser.add_argument(
        "--dbscan-tiles",
        type=int,
        default=0,
        help="DBSCAN by this many spatial tiles (on the Dask workers with --task-runner dask); 0: one machine",
    )
    _add_config_options(parser)


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    _add_train_options(parser)
    _add_runner_options(parser, "the trainings: --workers processes here, or one Dask task per model x seed")


def _add_runner_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--task-runner``, ``--dask-address``, ``--dask-workers``: where ``what`` runs."""
    parser.add_argument("--task-runner", choices=["local", "dask"], default="local", help=what)
    parser.add_argument(
        "--dask-address", default=None, help="scheduler of an existing Dask cluster (tcp://host:8786)"
    )
    parser.add_argument("--dask-workers", type=int, default=None, help="processes of a new Dask LocalCluster")


def _evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument("--model", default="ranker")
    parser.add_argument("--alias", default="champion", help="registry alias or version number")
    parser.add_argument("--split", default="test", choices=["train", "val", "test"])
    _add_tracking_options(parser)


def _ui_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=UI_PORT, help="the UI's port on 127.0.0.1 (default 5050)")
    parser.add_argument("--stop", action="store_true", help="stop the UIs started in this folder")
    _add_tracking_options(parser)


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--all-data", action="store_true", help="include runs on other datasets than the latest"
    )
    _add_tracking_options(parser)


def _predict_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="ranker")
    parser.add_argument("--alias", default="champion", help="registry alias or version number")
    parser.add_argument("--history", required=True, help="a file or folder (see above), or JSON text")
    parser.add_argument("-k", type=int, default=5, help="places per answer (default 5)")
    parser.add_argument(
        "--coverage",
        type=_coverage,
        default=None,
        metavar="P",
        help="also answer with a set: the fewest places (and 'a new place' when it belongs), most likely "
        "first, whose probabilities hold the next one with probability P (0 < P < 1)",
    )
    parser.add_argument(
        "--at", default=None, help="prediction time (ISO 8601); default: the end of each history's last visit"
    )
    parser.add_argument(
        "--user", type=int, default=None, help="raw user id for an input without a user_id column"
    )
    parser.add_argument("--format", choices=["json", "table"], default="json", help="output (default json)")
    parser.add_argument(
        "--map",
        type=Path,
        default=None,
        metavar="PNG|HTML",
        help="also draw the answers on a map: .png, the first 4 (one panel each: the history's visits in "
        "order, the predicted places sized by probability, P(new place) in the title; on map tiles, "
        "$NEXTLOC_MAP_TILES (OpenStreetMap by default, cached; off: none), where they can be had); "
        ".html, a web map with a layer per history and a popup per place (Leaflet inside the page; "
        "OpenStreetMap tiles when online)",
    )
    _add_tracking_options(parser)


def _coverage(text: str) -> float:
    """``--coverage``: a probability strictly between 0 and 1, else a usage error (before any work)."""
    from nextloc.predict.answer_set import check_coverage  # numpy, pandas: only when the option is given

    try:
        return check_coverage(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _map_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="a preprocessed data dir")
    parser.add_argument("--user", type=int, default=None, help="also draw this user's staypoints and moves")
    parser.add_argument("--out", type=Path, required=True, metavar="HTML", help="the page to write (.html)")


def _download_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dest", default="data/raw", help="download folder (default data/raw)")
    parser.add_argument("--url", default=None)
    parser.add_argument("--sha256", default=None, help="expected sha256 of the zip")


def _synth_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", required=True, help="a file (csv, parquet, visits) or a folder (gpx, geolife)"
    )
    parser.add_argument("--format", choices=list(SYNTH_FORMATS), default="csv")
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--columns", default=None, help="rename columns: user_id=uid,tracked_at=time,...")
    parser.add_argument("--local-timezone", default=None, help="write naive wall-clock times in this zone")
    parser.add_argument(
        "--night-at-home",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stays reach midnight, as in continuously tracked data (DIY); --no-night-at-home: GeoLife-like "
        "day records that start and end about an hour around the day's trips",
    )


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--to", choices=["trackintel"], default="trackintel", help="the target (trackintel)")
    parser.add_argument("out", help="output folder")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="a preprocessed data dir")
    parser.add_argument(
        "--format",
        choices=list(TRACKINTEL_FORMATS),
        default="csv",
        help="csv (trackintel's own writers and readers; the default) or geoparquet",
    )


def _services_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["start", "stop", "status", "copy-store", "credentials"],
        help="copy-store: copy an MLflow store (default the SQLite mlruns/mlflow.db) into the services' "
        "PostgreSQL; credentials: print an identity's credentials (docs/services.md)",
    )
    parser.add_argument(
        "--identity",
        choices=["pipeline", "reader"],
        default="pipeline",
        help="credentials: pipeline (workers, runs; default) or reader (the UIs, predict, serve)",
    )
    parser.add_argument(
        "--backend",
        choices=["postgres", "sqlite"],
        default=os.environ.get("NEXTLOC_SERVICES_BACKEND", "postgres"),
        help="where Prefect and MLflow keep their state (default postgres; $NEXTLOC_SERVICES_BACKEND)",
    )
    parser.add_argument(
        "--no-worker",
        dest="worker",
        action="store_false",
        help="start: no worker on this machine (flow runs wait for `nextloc worker` elsewhere)",
    )
    parser.add_argument(
        "--source", default=None, help="copy-store: source store URI (default sqlite:///mlruns/mlflow.db)"
    )
    parser.add_argument(
        "--target",
        default=None,
        help="copy-store: target store URI (default the services' PostgreSQL database nextloc_mlflow)",
    )


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="ranker", help="model kind (default ranker)")
    parser.add_argument("--alias", default="champion", help="registry alias or version number")
    parser.add_argument("--port", type=int, default=5001, help="port on 127.0.0.1 (default 5001)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for the server to answer (default 300)"
    )
    _add_tracking_options(parser)


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api",
        default=os.environ.get("PREFECT_API_URL"),
        help="the services' Prefect API, e.g. http://SERVICES_HOST:4200/api (default $PREFECT_API_URL)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=int(os.environ.get("NEXTLOC_SERVE_LIMIT", "1")),
        help="flow runs this worker takes at once (default 1; $NEXTLOC_SERVE_LIMIT)",
    )
    parser.add_argument("--pool", default=WORK_POOL, help="work pool (default nextloc)")


SUBCOMMANDS: dict[str, Subcommand] = {
    "preprocess": Subcommand(
        _preprocess_arguments,
        help="raw trajectories -> staypoints, samples and metadata (cached).",
    ),
    "run": Subcommand(
        _run_arguments,
        help="the main job: find (or unpack, or download) GeoLife, preprocess, train, evaluate.",
    ),
    "train": Subcommand(
        _train_arguments,
        help="train/evaluate models on preprocessed samples; every run goes to MLflow.",
    ),
    "evaluate": Subcommand(
        _evaluate_arguments,
        help="evaluate a registered model (default: the champion) on a test split.",
    ),
    "compare": Subcommand(
        _compare_arguments,
        help="leaderboard from MLflow: mean +- std over seeds per model.",
    ),
    "ui": Subcommand(
        _ui_arguments,
        help="MLflow's UI on the project's store, started once (or found running): prints the model comparison's URL.",
        description="Starts `mlflow ui` on mlruns/mlflow.db in the background (127.0.0.1, --port), or finds the "
        "one started before, and prints the URL of the experiment's runs opened on the 'Model comparison' "
        "view: every model run, best test place Acc@1 first. With a tracking server (--tracking-uri "
        "http://...) the server is the UI. --stop stops it.",
    ),
    "predict": Subcommand(
        _predict_arguments,
        help="next places from the champion for a user's recent visits or raw GPS fixes (or samples).",
        description="Top-k next known places (location id, centre, visits in the training data, probability) "
        "and P(new place), from a registered model (default: the champion). --history takes visits "
        "(user_id, started_at, finished_at, latitude, longitude; CSV, parquet or JSON, an MLflow "
        "dataframe_records request included; optional history_id for several histories per user), raw GPS "
        "fixes (a .plt file or a folder of them, or CSV/parquet of tracked_at, latitude, longitude), or a "
        "samples parquet of the dataset. Times are ISO 8601; no zone means UTC. --coverage P adds the "
        "answer set: the fewest places (and 'a new place' when it belongs) that hold the next one with "
        "probability P.",
    ),
    "map": Subcommand(
        _map_arguments,
        help="draw a preprocessed dataset on a web map: locations, a user's staypoints, shared recordings.",
        description="An .html page (Leaflet inside it: it opens offline; OpenStreetMap tiles when online): "
        "the locations sized by visits and coloured by how many users visit them, the staypoints several "
        "users hold (GeoLife's shared recordings), and with --user that user's staypoints and moves.",
    ),
    "download": Subcommand(
        _download_arguments,
        help="download and unpack the official GeoLife 1.3 zip.",
    ),
    "synth": Subcommand(
        _synth_arguments,
        help="write a seeded synthetic trajectory data set (home, work, other places; GeoLife-like fixes).",
    ),
    "export": Subcommand(
        _export_arguments,
        help="write a preprocessed dataset's positionfixes, staypoints and locations as trackintel models.",
        description="Writes DIR/positionfixes, staypoints and locations (.csv by trackintel's writers, or "
        ".parquet as GeoParquet), valid ti.Positionfixes / ti.Staypoints / ti.Locations; read them back "
        "with ti.read_staypoints_csv(path, index_col='id'), or into nextloc with --input-format trackintel.",
    ),
    "services": Subcommand(
        _services_arguments,
        help="start/stop PostgreSQL, the Prefect server, the MLflow server, the work pool and a worker (logs in .services/)",
    ),
    "worker": Subcommand(
        _worker_arguments,
        help="join the services' work pool: run deployment flow runs in this project folder, with its data.",
        description="A Prefect process worker of the work pool `nextloc` (`prefect worker start`), run in "
        "the foreground until Ctrl-C. Flow runs start in this folder and track into the services' MLflow "
        "tracking server: a second machine needs nextloc, its data and network access to the services.",
    ),
    "serve": Subcommand(
        _serve_arguments,
        help="serve a registered model (default: the ranker champion) over HTTP on 127.0.0.1 with MLflow.",
        description="MLflow's scoring server (`mlflow models serve --env-manager local`) for "
        "models:/nextloc-<model>@<alias> from the project's tracking store, in the foreground: it waits "
        "until the server answers, prints the URL and an example request (POST /invocations, the visits "
        "as `nextloc predict` reads them), and stops it on Ctrl-C.",
    ),
}


def _add_input_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset",
        default=None,
        help="dataset profile configs/datasets/<name>.yaml (input, protocol, presets)",
    )
    parser.add_argument("--input-format", choices=list(INPUT_FORMATS), default=None, help="default geolife")
    parser.add_argument(
        "--columns", default=None, help="column mapping, e.g. user_id=uid,tracked_at=time,latitude=lat"
    )
    parser.add_argument("--input-timezone", default=None, help="zone of timestamps without one (default UTC)")


def input_options(args: argparse.Namespace, profile: Any) -> dict[str, Any]:
    """The input options given on the command line (``None`` where not given)."""
    from nextloc.io.inputs import parse_columns

    return {
        "raw_dir": args.raw_dir,
        "data_dir": args.data_dir or (None if profile else DEFAULT_DATA_DIR),
        "input_format": args.input_format,
        "columns": parse_columns(args.columns) if args.columns else None,
        "input_timezone": args.input_timezone,
    }


def input_from_args(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The dataset profile (or None) and the input: ``raw_dir``, ``data_dir``, ``input_format``, ``columns``,
    ``input_timezone``. Command-line options win over the profile (:meth:`DatasetProfile.inputs`)."""
    from nextloc.profiles import DatasetProfile, load_profile

    profile = load_profile(args.dataset) if args.dataset else None
    return profile, (profile or DatasetProfile(name="geolife")).inputs(**input_options(args, profile))


def check_raw_dir(raw_dir: str | None) -> None:
    if raw_dir and not Path(raw_dir).exists():
        raise FileNotFoundError(f"--raw-dir {raw_dir} does not exist")


def _add_train_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=",".join(DEFAULT_KINDS),
        help="comma list of: " + "; ".join(f"{kind.name}: {kind.description}" for kind in KINDS.values()),
    )
    parser.add_argument("--seeds", default="0", help="comma list, e.g. 0,1,2,3,4")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    parser.add_argument(
        "--workers", type=int, default=min(2, os.cpu_count() or 1), help="trainings at once (processes)"
    )
    parser.add_argument(
        "--model-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="model config override, e.g. d_model=96 (all chosen models)",
    )
    parser.add_argument(
        "--train-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="training override, e.g. max_epochs=5",
    )
    _add_tracking_options(parser)


def _add_tracking_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="default: sqlite:///mlruns/mlflow.db",
    )
    parser.add_argument("--experiment", default="nextloc-geolife")


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="YAML config (its 'preprocess' section; with --dataset, the keys it sets apply over the profile's)",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key"
    )
    for key, default in flatten(PreprocessConfig()).items():
        parser.add_argument(
            f"--{key}",
            dest=f"cfg::{key}",
            default=None,
            metavar="FLOAT" if default is None else type(default).__name__.upper(),
            help=f"(default {default})",
        )


def config_from_args(args: argparse.Namespace, profile: Any = None) -> PreprocessConfig:
    overrides: dict[str, Any] = {}
    for item in args.set:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        overrides[key] = parse_value(value)
    for name, value in vars(args).items():
        if name.startswith("cfg::") and value is not None:
            overrides[name[5:]] = parse_value(value)
    if profile is not None:
        return profile.config(overrides, args.config)
    return load_config(args.config, overrides)


def parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
