"""The ``nextloc`` command: runs the Prefect flows with embedded defaults.

Defaults make a bare machine work: the project's local Prefect API (:mod:`services.local_api`), started by
the first command and shared by the next ones, with its state under ``./.prefect``, telemetry off, and library logs routed into the flow-run logs. Every preprocessing
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

from commands import output
from commands.args import (
    SUBCOMMANDS,
    check_raw_dir,
    config_from_args,
    input_from_args,
    input_options,
    parse_value,
)
from flows import configure_environment
from runtime import compat
from services import local_api
from services.auth import PIPELINE, READER, use_credentials
from tracking.access import ServiceRefused, check_prefect
from tracking.versions import ModelNotFound

log = logging.getLogger("nextloc.cli")
#: Whose credentials (``.services/auth/<identity>.env``, where the environment has none) each command uses.
IDENTITIES = {
    **dict.fromkeys(("run", "train", "preprocess", "worker"), (PIPELINE,)),
    **dict.fromkeys(("predict", "serve", "evaluate", "compare", "ui"), (READER, PIPELINE)),
}


def entry() -> NoReturn:
    """The ``nextloc`` console script: :func:`main`, then an exit that skips the interpreter's teardown
    (:func:`runtime.compat.exit_without_teardown`: the exit hooks, threads and ``atexit`` handlers run first).
    An exception leaves the normal way, traceback included."""
    code = main()
    compat.exit_without_teardown(code)


def main(argv: list[str] | None = None) -> int:
    """The ``nextloc`` command (``argv``: its arguments; default ``sys.argv[1:]``); the exit code."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    configure_environment()
    _setup_cli_logging()
    if args.command in IDENTITIES:
        use_credentials(Path.cwd(), IDENTITIES[args.command])
    if args.command != "services":
        _report_to_services()
    api = getattr(args, "api", None) or os.environ.get("PREFECT_API_URL")
    try:
        if IDENTITIES.get(args.command) == (PIPELINE,) and api:
            check_prefect(api)  # a refused credential named now, not as a traceback from the flow
        return args.func(args)
    except (ValueError, FileNotFoundError, ServiceRefused, ModelNotFound) as err:
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
    commands = {
        "preprocess": _cmd_preprocess,
        "run": _cmd_run,
        "train": _cmd_train,
        "evaluate": _cmd_evaluate,
        "compare": _cmd_compare,
        "ui": _cmd_ui,
        "predict": _cmd_predict,
        "map": _cmd_map,
        "download": _cmd_download,
        "synth": _cmd_synth,
        "export": _cmd_export,
        "services": _cmd_services,
        "worker": _cmd_worker,
        "serve": _cmd_serve,
    }
    for name, spec in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=spec.help, description=spec.description)
        spec.add_arguments(command)
        command.set_defaults(func=commands[name])
    return parser


def _cmd_preprocess(args: argparse.Namespace) -> int:
    profile, inputs = input_from_args(args)
    config = config_from_args(args, profile)
    if not inputs["raw_dir"]:
        raise ValueError("--raw-dir is required (or a --dataset profile naming its raw_dir)")
    check_raw_dir(inputs["raw_dir"])
    local_api.start_if_needed()  # the arguments are valid: a new API boots while the flow imports
    from flows.preprocess import preprocess
    from runtime.progress import quiet_task_runs_on_console

    quiet_task_runs_on_console()
    with local_api.ready():
        result = preprocess(config=config, **inputs)
    output.print_summary(result)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    """The main job: the ``preprocess-train`` flow (the same one the deployment runs), with local defaults."""
    profile, inputs = input_from_args(args)
    config = config_from_args(args, profile)
    check_raw_dir(inputs["raw_dir"])
    models, seeds, model_set, train_set = _train_plan(args)
    local_api.start_if_needed()  # the arguments are valid: a new API boots while the flows import
    runner, tracking = _runner(args), _tracking(args)  # they import prefect: after the API is known
    neural = _neural(models)
    from flows.pipeline import preprocess_train, profile_parameters
    from nextloc.profiles import DatasetProfile
    from runtime.progress import quiet_task_runs_on_console

    quiet_task_runs_on_console()
    parameters = profile_parameters(
        profile or DatasetProfile(name="geolife"),
        config=config,
        kinds=neural,
        model_set=model_set,
        train_set=train_set,
        training={"models": models, "seeds": seeds, "device": args.device, "workers": max(1, args.workers)},
        **input_options(args, profile),
    )
    with local_api.ready():
        result = preprocess_train(**parameters, runner=runner, tracking=tracking)
    output.print_summary(result)
    output.print_leaderboard(result["leaderboard"], f"MLflow parent run {result['parent_run_id']}")
    for kind, decision in result["promotion"].items():
        log.info("%s champion: %s", kind, decision.get("decision") or decision["reason"])
    output.print_comparison(args.tracking_uri, args.experiment)
    return 0


def _train_plan(args: argparse.Namespace) -> tuple[list[str], list[int], dict, dict]:
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    model_set, train_set = _kv(args.model_set), _kv(args.train_set)
    if model_set or train_set:  # what the trainings would reject, before the API starts
        from nextloc.models.registry import neural_kinds
        from nextloc.training.overrides import check_kind_overrides

        for kind in models:
            if kind in neural_kinds():
                check_kind_overrides(kind, model_set, train_set)
    return models, seeds, model_set, train_set


def _runner(args: argparse.Namespace) -> Any:
    """The ``runner`` section from the command line (checked: before the API starts)."""
    from runtime.runners import Runner

    return Runner(
        task_runner=args.task_runner,
        dask_address=args.dask_address,
        dask_workers=args.dask_workers,
        dbscan_tiles=getattr(args, "dbscan_tiles", 0),
    )


def _tracking(args: argparse.Namespace) -> Any:
    """The ``tracking`` section from the command line."""
    from tracking.settings import Tracking

    return Tracking(tracking_uri=args.tracking_uri, experiment=args.experiment)


def _neural(models: list[str]) -> list[str]:
    from nextloc.models.registry import neural_kinds

    return [m for m in models if m in neural_kinds()]


def _kv(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key] = parse_value(value)
    return out


def _cmd_train(args: argparse.Namespace) -> int:
    from runtime.catalog import require_preprocessed

    models, seeds, model_set, train_set = _train_plan(args)
    require_preprocessed(args.data_dir)  # before the API starts, not in the flow
    if args.dask_address and args.task_runner != "dask":
        raise ValueError("--dask-address is only used with --task-runner dask")
    local_api.start_if_needed()  # the arguments are valid: a new API boots while the flow imports
    runner, tracking = _runner(args), _tracking(args)  # they import prefect: after the API is known
    neural = _neural(models)
    from tasks.train import TrainRun

    workers = max(1, args.workers)
    training = TrainRun(
        models=models,
        seeds=seeds,
        model_overrides={m: model_set for m in neural},
        train_overrides={m: train_set for m in neural},
        device=args.device,
        workers=workers,
    )
    from flows.train import train
    from runtime.progress import quiet_task_runs_on_console

    quiet_task_runs_on_console()
    with local_api.ready():  # a Dask runner points its workers at the API (runtime.runners)
        result = train.with_options(task_runner=runner.trainings(workers))(
            data_dir=str(args.data_dir), training=training, tracking=tracking
        )
    output.print_leaderboard(result["leaderboard"], f"MLflow parent run {result['parent_run_id']}")
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from commands.evaluate import evaluate_registered

    metrics = evaluate_registered(
        args.model, args.alias, Path(args.data_dir), args.split, args.tracking_uri, args.experiment
    )
    from rich.console import Console

    Console().print_json(json.dumps(metrics))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from tracking.registered import leaderboard_from_mlflow

    board, note = leaderboard_from_mlflow(
        args.tracking_uri, args.experiment, latest_data_only=not args.all_data
    )
    output.print_leaderboard(board, note)
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    from services.ui import ensure_ui, stop_ui
    from tracking import mlflow_runs
    from tracking.settings import default_tracking_uri, tracking_server

    if args.stop:
        log.info("stopped: %s", ", ".join(stop_ui(Path.cwd())) or "no UI was running")
        return 0
    uri = args.tracking_uri or default_tracking_uri()
    experiment = mlflow_runs.experiment_id(uri, args.experiment)
    if experiment is None:
        log.error("no experiment %r in %s yet: `make run` records one", args.experiment, uri)
        return 1
    try:
        ui = tracking_server(uri) or ensure_ui(Path.cwd(), uri, args.port)
    except RuntimeError as err:
        log.error("%s", err)
        return 1
    sys.stdout.write(mlflow_runs.comparison_url(ui, experiment) + "\n")
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    from commands.evaluate import predict_registered

    answers = predict_registered(
        args.model,
        args.alias,
        args.history,
        args.k,
        args.tracking_uri,
        args.experiment,
        at=args.at,
        user_id=args.user,
        map_path=args.map,
        coverage=args.coverage,
    )
    if args.format == "json":
        sys.stdout.write(json.dumps(answers, indent=2) + "\n")
    else:
        output.print_answers(answers)
    return 0


def _cmd_map(args: argparse.Namespace) -> int:
    from commands.dataset_map import draw_dataset_map

    path = draw_dataset_map(args.data_dir, args.out, args.user)
    sys.stdout.write(json.dumps({"map": str(path)}) + "\n")
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from services.worker import run_worker

    if not args.api:
        log.error("no Prefect API: pass --api http://SERVICES_HOST:4200/api or export PREFECT_API_URL")
        return 2
    run_worker(Path.cwd(), args.api, args.pool, args.limit)
    return 0  # not reached: the worker replaces this process


def _cmd_serve(args: argparse.Namespace) -> int:
    from services.model_server import serve_registered

    return serve_registered(
        args.model, args.alias, args.port, args.tracking_uri, args.experiment, args.timeout
    )


def _cmd_synth(args: argparse.Namespace) -> int:
    from nextloc.io.inputs import parse_columns
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


def _cmd_export(args: argparse.Namespace) -> int:
    from nextloc.preprocessing.trackintel_export import export_trackintel
    from runtime.catalog import Catalog

    catalog = Catalog(args.data_dir)
    counts = export_trackintel(
        catalog.user_files("positionfixes"),
        catalog.user_files("staypoints"),
        catalog.located,
        Path(args.out),
        args.format,
    )
    sys.stdout.write(json.dumps({"out": args.out, "to": args.to, "format": args.format, **counts}) + "\n")
    return 0


def _cmd_download(args: argparse.Namespace) -> int:
    from nextloc.raw.download import GEOLIFE_URL, fetch_geolife

    path = fetch_geolife(Path(args.dest), url=args.url or GEOLIFE_URL, expected_sha256=args.sha256)
    log.info("GeoLife data ready at %s", path)
    return 0


def _cmd_services(args: argparse.Namespace) -> int:
    import services

    svc = services.Services(Path.cwd(), backend=args.backend)
    if args.action == "start":
        try:
            services.start(svc, worker=args.worker)
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
        stopped = services.stop(svc)
        if local_api.stop_server(local_api.prefect_home()) is not None:
            stopped.append("local Prefect API")
        log.info("stopped: %s", ", ".join(stopped) or "nothing was running")
    elif args.action == "copy-store":
        return _copy_store(svc, args.source, args.target)
    elif args.action == "credentials":
        sys.stdout.write(services.credentials_text(svc, args.identity))
    else:
        for name, pid in services.status(svc).items():
            sys.stdout.write(f"{name:15s} {'running, pid ' + str(pid) if pid else 'stopped'}\n")
        api = local_api.running(local_api.prefect_home())
        state = f"running, pid {api.pid}, UI {api.ui_url}" if api else "stopped (the next command starts it)"
        sys.stdout.write(f"{'local API':15s} {state}\n")
    return 0


def _copy_store(svc: Any, source: str | None, target: str | None) -> int:
    """``nextloc services copy-store``: the whole MLflow store, table by table, into an empty store."""
    import services
    from tracking import mlflow_runs

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
        counts = mlflow_runs.copy_store(source, target)
    except RuntimeError as err:
        log.error("%s", err)
        return 1
    sys.stdout.write(json.dumps(counts, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    entry()
