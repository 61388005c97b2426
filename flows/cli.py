"""The ``nextloc`` command: runs the Prefect flows with embedded defaults.

Defaults make a bare machine work: Prefect's ephemeral local API with its state under ``./.prefect``,
telemetry off, and library logs routed into the flow-run logs. Every preprocessing config key is also a
command-line option (``--locations.epsilon_m 50``), and ``--set key=value`` takes any of them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from nextloc.config import PreprocessConfig, flatten, load_config

DEFAULT_DATA_DIR = "data/geolife"
DEFAULT_RAW_DIR = "data/raw/geolife"
SHARED_ARCHIVE = Path("../shared/data/geolife-1.3-raw.tar.xz")
log = logging.getLogger("nextloc.cli")


def configure_environment(project_dir: Path | None = None) -> None:
    """Set the embedded defaults (only where the user has not chosen otherwise); call before importing prefect."""
    root = project_dir or Path.cwd()
    defaults = {
        "PREFECT_HOME": str(root / ".prefect"),
        "DO_NOT_TRACK": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PREFECT_LOGGING_EXTRA_LOGGERS": "nextloc",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    logging.getLogger("nextloc").setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nextloc`` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    configure_environment()
    _setup_cli_logging()
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        log.error("%s", err)
        return 2


def _setup_cli_logging() -> None:
    from rich.logging import RichHandler

    if not log.handlers:
        log.addHandler(RichHandler(show_path=False))
        log.setLevel(logging.INFO)
        log.propagate = False
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nextloc", description="GeoLife next-location prediction pipeline.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("preprocess", help="raw GeoLife .plt -> staypoints, samples and metadata (cached).")
    p.add_argument("--raw-dir", required=True, help="folder holding GeoLife Data/NNN/Trajectory/*.plt")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"output folder (default {DEFAULT_DATA_DIR})")
    _add_config_options(p)
    p.set_defaults(func=_cmd_preprocess)

    r = sub.add_parser("run", help="the main job: find (or unpack, or download) GeoLife, then preprocess.")
    r.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    r.add_argument("--raw-dir", default=None, help=f"default: $NEXTLOC_GEOLIFE_DIR, {DEFAULT_RAW_DIR}, a local archive, or download")
    _add_config_options(r)
    r.set_defaults(func=_cmd_run)

    d = sub.add_parser("download", help="download and unpack the official GeoLife 1.3 zip.")
    d.add_argument("--dest", default="data/raw", help="download folder (default data/raw)")
    d.add_argument("--url", default=None)
    d.add_argument("--sha256", default=None, help="expected sha256 of the zip")
    d.set_defaults(func=_cmd_download)
    return parser


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help="YAML config (its 'preprocess' section)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key")
    for key, default in flatten(PreprocessConfig()).items():
        parser.add_argument(f"--{key}", dest=f"cfg::{key}", default=None, metavar=type(default).__name__.upper(), help=f"(default {default})")


def _config_from_args(args: argparse.Namespace) -> PreprocessConfig:
    overrides: dict[str, Any] = {}
    for item in args.set:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        overrides[key] = _parse_value(value)
    for name, value in vars(args).items():
        if name.startswith("cfg::") and value is not None:
            overrides[name[5:]] = _parse_value(value)
    return load_config(args.config, overrides)


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _cmd_preprocess(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    if not Path(args.raw_dir).exists():
        raise FileNotFoundError(f"--raw-dir {args.raw_dir} does not exist")
    from flows.preprocess import preprocess

    result = preprocess(raw_dir=str(args.raw_dir), data_dir=str(args.data_dir), config=config)
    _print_summary(result)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    if args.raw_dir:
        raw_dir, source = Path(args.raw_dir), f"--raw-dir {args.raw_dir}"
    else:
        from nextloc.rawdata import locate_raw_data

        found = locate_raw_data(Path(DEFAULT_RAW_DIR), [SHARED_ARCHIVE])
        raw_dir, source = found.path, found.source
    log.info("GeoLife raw data: %s", source)
    from flows.preprocess import preprocess

    result = preprocess(raw_dir=str(raw_dir), data_dir=str(args.data_dir), config=config)
    _print_summary(result)
    return 0


def _cmd_download(args: argparse.Namespace) -> int:
    from nextloc.download import GEOLIFE_URL, fetch_geolife

    path = fetch_geolife(Path(args.dest), url=args.url or GEOLIFE_URL, expected_sha256=args.sha256)
    log.info("GeoLife data ready at %s", path)
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
    sys.exit(main())

