"""The ``nextloc`` command: runs the Prefect flows with embedded defaults.

Defaults make a bare machine work: a temporary local Prefect API (:mod:`flows.local_api`) with its state
under ``./.prefect``, telemetry off, and library logs routed into the flow-run logs. Every preprocessing
config key is also a command-line option (``--locations.epsilon_m 50``), and ``--set key=value`` takes
any of them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from flows import OFFLINE_DEFAULTS, local_api
from nextloc.config import PreprocessConfig, flatten, load_config
from nextloc.inputs import INPUT_FORMATS
from nextloc.rawdata import DEFAULT_RAW_DIR
from tasks import compat

DEFAULT_DATA_DIR = "data/geolife"
log = logging.getLogger("nextloc.cli")


def configure_environment(project_dir: Path | None = None) -> None:
    """Set the embedded defaults (only where the user has not chosen otherwise); call before importing prefect."""
    root = project_dir or Path.cwd()
    defaults = {
        **OFFLINE_DEFAULTS,
        "PREFECT_HOME": str(root / ".prefect"),
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "PREFECT_LOGGING_EXTRA_LOGGERS": "nextloc",
        "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    logging.getLogger("nextloc").setLevel(logging.INFO)


def entry() -> NoReturn:
    """The ``nextloc`` console script: :func:`main`, then an exit that skips the interpreter's teardown
    (:func:`tasks.compat.exit_without_teardown`: the exit hooks, threads and ``atexit`` handlers run first).
    An exception leaves the normal way, traceback included."""
    code = main()
    compat.exit_without_teardown(code)


def main(argv: list[str] | None = None) -> int:
    """The ``nextloc`` command (``argv``: its arguments; default ``sys.argv[1:]``); the exit code."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    configure_environment()
    _setup_cli_logging()
    if args.command != "services":
        _report_to_services()
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        log.error("%s", err)
        return 2
    finally:
        local_api.stop()


def _report_to_services() -> None:
    """With ``PREFECT_API_URL`` set and this folder's services running, track into their MLflow store too.

    Prefect already reports to the server in ``PREFECT_API_URL``; MLflow follows the services' store
    (``.services/client.json``), so runs started by hand and deployment runs are in one place. An explicit
    ``--tracking-uri``/``$MLFLOW_TRACKING_URI`` or ``$NEXTLOC_TRACKING_URI`` wins.
    """
    if not os.environ.get("PREFECT_API_URL") or os.environ.get("NEXTLOC_TRACKING_URI"):
        return
    import services

    client = services.client_settings(Path.cwd())
    if client is not None:
        os.environ["NEXTLOC_TRACKING_URI"] = client["tracking_uri"]
        os.environ.setdefault("NEXTLOC_MLFLOW_UI_URL", client["mlflow_url"])
        log.info(
            "services running: reporting to %s and the MLflow UI %s",
            os.environ["PREFECT_API_URL"],
            client["mlflow_url"],
        )


def _setup_cli_logging() -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    if not log.handlers:  # stderr: stdout is for answers (`nextloc predict ... > answers.json`)
        log.addHandler(RichHandler(console=Console(stderr=True), show_path=False))
        log.setLevel(logging.INFO)
        log.propagate = False
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nextloc", description="GeoLife next-location prediction pipeline.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("preprocess", help="raw trajectories -> staypoints, samples and metadata (cached).")
    p.add_argument(
        "--raw-dir",
        default=None,
        help="GeoLife root (Data/NNN/Trajectory/*.plt), a CSV/parquet/visits file or folder, or a GPX folder "
        "(NNN/*.gpx); default: the --dataset profile's",
    )
    p.add_argument(
        "--data-dir", default=None, help=f"output folder (default data/<dataset>, {DEFAULT_DATA_DIR})"
    )
    _add_input_options(p)
    _add_config_options(p)
    p.set_defaults(func=_cmd_preprocess)

    r = sub.add_parser(
        "run", help="the main job: find (or unpack, or download) GeoLife, preprocess, train, evaluate."
    )
    r.add_argument("--data-dir", default=None, help=f"default data/<dataset> ({DEFAULT_DATA_DIR})")
    _add_input_options(r)
    _add_train_options(r)
    r.add_argument(
        "--raw-dir",
        default=None,
        help=f"default: $NEXTLOC_GEOLIFE_DIR, {DEFAULT_RAW_DIR}, a local archive, or download",
    )
    r.add_argument("--task-runner", choices=["local", "dask"], default="local", help="per-user preprocessing")
    r.add_argument(
        "--dask-address", default=None, help="scheduler of an existing Dask cluster (tcp://host:8786)"
    )
    r.add_argument("--dask-workers", type=int, default=None, help="processes of a new Dask LocalCluster")
    r.add_argument(
        "--dbscan-tiles",
        type=int,
        default=0,
        help="DBSCAN by this many spatial tiles (on the Dask workers with --task-runner dask); 0: one machine",
    )
    _add_config_options(r)
    r.set_defaults(func=_cmd_run)

    t = sub.add_parser(
        "train", help="train/evaluate models on preprocessed samples; every run goes to MLflow."
    )
    t.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    _add_train_options(t)
    t.set_defaults(func=_cmd_train)

    e = sub.add_parser(
        "evaluate", help="evaluate a registered model (default: the champion) on a test split."
    )
    e.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    e.add_argument("--model", default="ranker")
    e.add_argument("--alias", default="champion", help="registry alias or version number")
    e.add_argument("--split", default="test", choices=["train", "val", "test"])
    _add_tracking_options(e)
    e.set_defaults(func=_cmd_evaluate)

    c = sub.add_parser("compare", help="leaderboard from MLflow: mean +- std over seeds per model.")
    c.add_argument("--all-data", action="store_true", help="include runs on other datasets than the latest")
    _add_tracking_options(c)
    c.set_defaults(func=_cmd_compare)

    q = sub.add_parser(
        "predict",
        help="next places from the champion for a user's recent visits or raw GPS fixes (or samples).",
        description="Top-k next known places (location id, centre, visits in the training data, probability) "
        "and P(new place), from a registered model (default: the champion). --history takes visits "
        "(user_id, started_at, finished_at, latitude, longitude; CSV, parquet or JSON, an MLflow "
        "dataframe_records request included; optional history_id for several histories per user), raw GPS "
        "fixes (a .plt file or a folder of them, or CSV/parquet of tracked_at, latitude, longitude), or a "
        "samples parquet of the dataset. Times are ISO 8601; no zone means UTC.",
    )
    q.add_argument("--model", default="ranker")
    q.add_argument("--alias", default="champion", help="registry alias or version number")
    q.add_argument("--history", required=True, help="a file or folder (see above), or JSON text")
    q.add_argument("-k", type=int, default=5, help="places per answer (default 5)")
    q.add_argument(
        "--at", default=None, help="prediction time (ISO 8601); default: the end of each history's last visit"
    )
    q.add_argument("--user", type=int, default=None, help="raw user id for an input without a user_id column")
    q.add_argument("--format", choices=["json", "table"], default="json", help="output (default json)")
    _add_tracking_options(q)
    q.set_defaults(func=_cmd_predict)

    d = sub.add_parser("download", help="download and unpack the official GeoLife 1.3 zip.")
    d.add_argument("--dest", default="data/raw", help="download folder (default data/raw)")
    d.add_argument("--url", default=None)
    d.add_argument("--sha256", default=None, help="expected sha256 of the zip")
    d.set_defaults(func=_cmd_download)

    y = sub.add_parser(
        "synth",
        help="write a seeded synthetic trajectory data set (home, work, other places; GeoLife-like fixes).",
    )
    y.add_argument("--out", required=True, help="a file (csv, parquet, visits) or a folder (gpx, geolife)")
    y.add_argument("--format", choices=list(INPUT_FORMATS), default="csv")
    y.add_argument("--users", type=int, default=10)
    y.add_argument("--days", type=int, default=90)
    y.add_argument("--seed", type=int, default=0)
    y.add_argument("--columns", default=None, help="rename columns: user_id=uid,tracked_at=time,...")
    y.add_argument("--local-timezone", default=None, help="write naive wall-clock times in this zone")
    y.add_argument(
        "--night-at-home",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stays reach midnight, as in continuously tracked data (DIY); --no-night-at-home: GeoLife-like "
        "day records that start and end about an hour around the day's trips",
    )
    y.set_defaults(func=_cmd_synth)

    s = sub.add_parser(
        "services",
        help="start/stop a local Prefect server, the MLflow UI and the deployments (logs in .services/)",
    )
    s.add_argument(
        "action",
        choices=["start", "stop", "status", "copy-store"],
        help="copy-store: copy an MLflow store (default the SQLite mlruns/mlflow.db) into the services' PostgreSQL",
    )
    s.add_argument(
        "--backend",
        choices=["postgres", "sqlite"],
        default=os.environ.get("NEXTLOC_SERVICES_BACKEND", "postgres"),
        help="where Prefect and MLflow keep their state (default postgres; $NEXTLOC_SERVICES_BACKEND)",
    )
    s.add_argument(
        "--source", default=None, help="copy-store: source store URI (default sqlite:///mlruns/mlflow.db)"
    )
    s.add_argument(
        "--target",
        default=None,
        help="copy-store: target store URI (default the services' PostgreSQL database nextloc_mlflow)",
    )
    s.set_defaults(func=_cmd_services)
    return parser


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


def _input_options(args: argparse.Namespace, profile: Any) -> dict[str, Any]:
    """The input options given on the command line (``None`` where not given)."""
    from nextloc.inputs import parse_columns

    return {
        "raw_dir": args.raw_dir,
        "data_dir": args.data_dir or (None if profile else DEFAULT_DATA_DIR),
        "input_format": args.input_format,
        "columns": parse_columns(args.columns) if args.columns else None,
        "input_timezone": args.input_timezone,
    }


def _input_from_args(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The dataset profile (or None) and the input: ``raw_dir``, ``data_dir``, ``input_format``, ``columns``,
    ``input_timezone``. Command-line options win over the profile (:meth:`DatasetProfile.inputs`)."""
    from nextloc.profiles import DatasetProfile, load_profile

    profile = load_profile(args.dataset) if args.dataset else None
    return profile, (profile or DatasetProfile(name="geolife")).inputs(**_input_options(args, profile))


def _check_raw_dir(raw_dir: str | None) -> None:
    if raw_dir and not Path(raw_dir).exists():
        raise FileNotFoundError(f"--raw-dir {raw_dir} does not exist")


def _add_train_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="markov,mhsa,pointer_plus,ranker",
        help="comma list of: ranker (LambdaRank over the user's routine: the best), routine (a rule over it), "
        "mhsa, mhsa_diagonal (ablation), pointer (reference V45), pointer_plus (nextloc), pointer_plus_refit "
        "(refit on train + val, its own row), lstm, markov, most_frequent, last_location",
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


def _config_from_args(args: argparse.Namespace, profile: Any = None) -> PreprocessConfig:
    overrides: dict[str, Any] = {}
    for item in args.set:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        overrides[key] = _parse_value(value)
    for name, value in vars(args).items():
        if name.startswith("cfg::") and value is not None:
            overrides[name[5:]] = _parse_value(value)
    if profile is not None:
        return profile.config(overrides, args.config)
    return load_config(args.config, overrides)


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _cmd_preprocess(args: argparse.Namespace) -> int:
    profile, inputs = _input_from_args(args)
    config = _config_from_args(args, profile)
    if not inputs["raw_dir"]:
        raise ValueError("--raw-dir is required (or a --dataset profile naming its raw_dir)")
    _check_raw_dir(inputs["raw_dir"])
    local_api.start_if_needed()  # the arguments are valid: the API boots while the flow imports
    from flows.preprocess import preprocess
    from tasks.progress import quiet_task_runs_on_console

    quiet_task_runs_on_console()
    with local_api.ready():
        result = preprocess(config=config, **inputs)
    _print_summary(result)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    """The main job: the ``preprocess-train`` flow (the same one the deployment runs), with local defaults."""
    profile, inputs = _input_from_args(args)
    config = _config_from_args(args, profile)
    _check_raw_dir(inputs["raw_dir"])
    models, seeds, model_set, train_set = _train_plan(args)
    local_api.start_if_needed()  # the arguments are valid: the API boots while the flows import
    neural = _neural(models)
    from flows.pipeline import preprocess_train, profile_parameters
    from nextloc.profiles import DatasetProfile
    from tasks.progress import quiet_task_runs_on_console

    quiet_task_runs_on_console()
    parameters = profile_parameters(
        profile or DatasetProfile(name="geolife"),
        config=config,
        kinds=neural,
        model_set=model_set,
        train_set=train_set,
        **_input_options(args, profile),
    )
    with local_api.ready():
        result = preprocess_train(
            **parameters,
            models=models,
            seeds=seeds,
            device=args.device,
            workers=max(1, args.workers),
            task_runner=args.task_runner,
            dask_address=args.dask_address,
            dask_workers=args.dask_workers,
            dbscan_tiles=args.dbscan_tiles,
            tracking_uri=args.tracking_uri,
            experiment=args.experiment,
        )
    _print_summary(result)
    _print_leaderboard(result["leaderboard"], f"MLflow parent run {result['parent_run_id']}")
    for kind, decision in result["promotion"].items():
        log.info("%s champion: %s", kind, decision.get("decision") or decision["reason"])
    return 0


def _train_plan(args: argparse.Namespace) -> tuple[list[str], list[int], dict, dict]:
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    model_set, train_set = _kv(args.model_set), _kv(args.train_set)
    if model_set or train_set:  # what the trainings would reject, before the API starts (this imports torch)
        from nextloc.models import ENSEMBLES, MODEL_REGISTRY
        from nextloc.train import check_kind_overrides

        for kind in models:
            if kind in MODEL_REGISTRY or kind in ENSEMBLES:  # the neural kinds (tasks.train.NEURAL)
                check_kind_overrides(kind, model_set, train_set)
    return models, seeds, model_set, train_set


def _neural(models: list[str]) -> list[str]:
    from tasks.train import NEURAL  # imports torch

    return [m for m in models if m in NEURAL]


def _kv(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key] = _parse_value(value)
    return out


def _cmd_train(args: argparse.Namespace) -> int:
    from tasks.catalog import require_preprocessed

    models, seeds, model_set, train_set = _train_plan(args)
    require_preprocessed(args.data_dir)  # before the API starts, not in the flow
    local_api.start_if_needed()  # the arguments are valid: the API boots while the flow imports
    neural = _neural(models)
    from flows.train import train
    from tasks.progress import quiet_task_runs_on_console
    from tasks.runners import training_runner

    quiet_task_runs_on_console()
    workers = max(1, args.workers)
    runner = training_runner(workers)
    with local_api.ready():
        result = train.with_options(task_runner=runner)(
            data_dir=str(args.data_dir),
            models=models,
            seeds=seeds,
            model_overrides={m: model_set for m in neural},
            train_overrides={m: train_set for m in neural},
            tracking_uri=args.tracking_uri,
            experiment=args.experiment,
            device=args.device,
        )
    _print_leaderboard(result["leaderboard"], f"MLflow parent run {result['parent_run_id']}")
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from tasks.evaluate import evaluate_registered

    metrics = evaluate_registered(
        args.model, args.alias, Path(args.data_dir), args.split, args.tracking_uri, args.experiment
    )
    from rich.console import Console

    Console().print_json(json.dumps(metrics))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from tasks.evaluate import leaderboard_from_mlflow

    board, note = leaderboard_from_mlflow(
        args.tracking_uri, args.experiment, latest_data_only=not args.all_data
    )
    _print_leaderboard(board, note)
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    from tasks.evaluate import predict_registered

    answers = predict_registered(
        args.model,
        args.alias,
        args.history,
        args.k,
        args.tracking_uri,
        args.experiment,
        at=args.at,
        user_id=args.user,
    )
    if args.format == "json":
        sys.stdout.write(json.dumps(answers, indent=2) + "\n")
    else:
        _print_answers(answers)
    return 0


def _print_answers(answers: list[dict[str, Any]]) -> None:
    """One table per history: its user and time, P(new place), then the places."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(110, Console().width))
    for answer in answers:
        about = {k: v for k, v in answer.items() if k not in ("places", "p_new_place")}
        title = ", ".join(f"{k} {v}" for k, v in about.items())
        p_new = answer.get("p_new_place")
        table = Table(title=title, caption=f"P(new place) {p_new:.3f}" if p_new is not None else None)
        columns = [
            c
            for c in ("rank", "location_id", "latitude", "longitude", "n_visits", "probability")
            if any(c in place for place in answer["places"])
        ]
        for column in columns:
            table.add_column(column, justify="right")
        for place in answer["places"]:
            table.add_row(*(_cell(place.get(c)) for c in columns))
        console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _print_leaderboard(board: dict[str, Any], caption: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from nextloc.evaluate import format_summary, rank_board
    from nextloc.metrics import HEADLINE, NEW_PLACE_KEYS, PLACE_KEYS, REFERENCE_KEYS

    console = Console(width=max(150, Console().width))
    families = (
        ("place metrics (%): real places only, a new place is a miss", PLACE_KEYS),
        ("P(new place): share of new targets, ROC-AUC (%), Brier", NEW_PLACE_KEYS),
        ("reference protocol metrics (%): classes 0 and 1 ranked too", REFERENCE_KEYS),
    )
    for title, keys in families:
        table = Table(title=f"test {title}, mean +- std over seeds", caption=caption)
        table.add_column("model", no_wrap=True)
        table.add_column("seeds", justify="right")
        for key in keys:
            table.add_column(key, justify="right", no_wrap=True)
        for kind in rank_board(board, HEADLINE):
            row = board[kind]
            table.add_row(kind, str(row[HEADLINE]["n"]), *(format_summary(row.get(k), " +- ") for k in keys))
        console.print(table)


def _cmd_synth(args: argparse.Namespace) -> int:
    from nextloc.inputs import parse_columns
    from nextloc.synth import SynthConfig, generate

    counts = generate(
        SynthConfig(n_users=args.users, n_days=args.days, seed=args.seed, night_at_home=args.night_at_home),
        args.format,
        Path(args.out),
        columns=parse_columns(args.columns) or None,
        timezone=args.local_timezone,
    )
    sys.stdout.write(json.dumps({"out": args.out, "format": args.format, **counts}) + "\n")
    return 0


def _cmd_download(args: argparse.Namespace) -> int:
    from nextloc.download import GEOLIFE_URL, fetch_geolife

    path = fetch_geolife(Path(args.dest), url=args.url or GEOLIFE_URL, expected_sha256=args.sha256)
    log.info("GeoLife data ready at %s", path)
    return 0


def _cmd_services(args: argparse.Namespace) -> int:
    import services

    svc = services.Services(Path.cwd(), backend=args.backend)
    if args.action == "start":
        try:
            services.start(svc)
        except RuntimeError as err:
            log.error("%s", err)
            services.stop(svc)
            return 1
        sys.stdout.write(
            f"Prefect UI  {svc.api_url[: -len('/api')]}\nMLflow UI   {svc.mlflow_url}\n"
            f"export PREFECT_API_URL={svc.api_url}\n"
            "prefect deployment run preprocess-train/geolife --watch\n"
        )
    elif args.action == "stop":
        log.info("stopped: %s", ", ".join(services.stop(svc)) or "nothing was running")
    elif args.action == "copy-store":
        return _copy_store(svc, args.source, args.target)
    else:
        for name, pid in services.status(svc).items():
            sys.stdout.write(f"{name:15s} {'running, pid ' + str(pid) if pid else 'stopped'}\n")
    return 0


def _copy_store(svc: Any, source: str | None, target: str | None) -> int:
    """``nextloc services copy-store``: the whole MLflow store, table by table, into an empty store."""
    import services
    from tasks import tracking

    source = source or f"sqlite:///{Path.cwd().resolve() / 'mlruns' / 'mlflow.db'}"
    if target is None:
        try:
            services.ensure_databases(svc.server_url(), (services.MLFLOW_DB,), timeout_s=10)
        except (FileNotFoundError, RuntimeError) as err:
            log.error(
                "no PostgreSQL to copy into (start it with `make services` or set NEXTLOC_DB_URL): %s", err
            )
            return 1
        target = svc.database_url(services.MLFLOW_DB, "psycopg")
    try:
        counts = tracking.copy_store(source, target)
    except RuntimeError as err:
        log.error("%s", err)
        return 1
    sys.stdout.write(json.dumps(counts, indent=1) + "\n")
    return 0


def _print_summary(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    stats = result["stats"]
    table = Table(title=f"nextloc preprocess -> {result['data_dir']}")
    table.add_column("")
    for split in ("train", "val", "test"):
        table.add_column(split, justify="right")
    for key in ("n_users", "n_staypoints", "n_samples", "n_unseen_targets"):
        table.add_row(key, *(f"{stats[key][s]:,}" for s in ("train", "val", "test")))
    console = Console(stderr=False)
    console.print(table)
    console.print(
        f"total_loc_num {stats['total_loc_num']:,} | total_user_num {stats['total_user_num']} | "
        f"rows skipped {result['ingest']['rows_skipped']} | files skipped {result['ingest']['files_skipped']}"
    )


if __name__ == "__main__":
    entry()
