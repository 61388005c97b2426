"""Serve the deployments: ``preprocess-train/<name>`` for every dataset profile, and ``retrain/<name>-dumps``.

``python -m flows.serve`` (``make services`` starts it in the background) registers the deployments with
the Prefect API in ``PREFECT_API_URL`` and runs their flow runs in subprocesses of this process, in the
current folder, until interrupted. Every ``configs/datasets/<name>.yaml`` (``$NEXTLOC_DATASETS_DIR``
points elsewhere) gets ``preprocess-train/<name>``, with the profile's input, protocol, model presets and
outputs under ``data/<name>/`` as its parameters (the same resolution as ``nextloc run --dataset <name>``;
``preprocess-train/geolife`` is the GeoLife default). A profile whose input is missing still gets its
deployment; a run of it fails naming the missing path.

A profile that reads GeoLife ``.plt`` folders also gets ``retrain/<name>-dumps``, on a cron schedule
(``$NEXTLOC_RETRAIN_CRON``, default hourly at minute 17): ``retrain/geolife-dumps`` watches
``data/incoming``, another profile ``data/incoming-<name>``. Dumps are GeoLife-layout folders or
archives, so a profile reading another format (``diy``: visits) gets no retrain deployment; the log
says so.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from flows.cli import configure_environment

RETRAIN_CRON = os.environ.get("NEXTLOC_RETRAIN_CRON", "17 * * * *")
DEFAULT_PROFILE = "geolife"
log = logging.getLogger("nextloc.serve")


def incoming_dir(name: str) -> str:
    """Where the retrain deployment of profile ``name`` looks for dumps (``data/incoming`` for GeoLife)."""
    return "data/incoming" if name == DEFAULT_PROFILE else f"data/incoming-{name}"


def deployments(profile_root: Path | None = None) -> list:
    """One ``preprocess-train/<name>`` per profile in ``profile_root`` (default: ``configs/datasets`` or
    ``$NEXTLOC_DATASETS_DIR``), and ``retrain/<name>-dumps`` per profile with GeoLife ``.plt`` input.

    Raises:
        FileNotFoundError: if the folder holds no profile.
        ValueError: on a bad profile (the message names its file and key).
    """
    from flows.pipeline import preprocess_train, profile_parameters
    from flows.retrain import retrain
    from nextloc.profiles import list_profiles, load_profile, profile_dir

    root = Path(profile_root or profile_dir())
    names = list_profiles(root)
    if not names:
        raise FileNotFoundError(f"no dataset profile (*.yaml) in {root}: nothing to deploy")
    out = []
    for name in names:
        profile = load_profile(name, root)
        params = profile_parameters(profile)
        where = params["raw_dir"] or "found as for GeoLife ($NEXTLOC_GEOLIFE_DIR, data/raw/geolife, ...)"
        out.append(
            preprocess_train.to_deployment(
                name=name,
                description=f"{name}: read {profile.input.format} input from {where}, preprocess (the "
                f"profile's protocol), train and evaluate into {params['data_dir']}/, promote the champion.",
                tags=["nextloc", name],
                parameters=params,
            )
        )
        if profile.input.format != "geolife":
            log.info(
                "profile %s reads %s input: no retrain deployment (dumps are GeoLife .plt)",
                name,
                profile.input.format,
            )
            continue
        pipeline = {
            k: v
            for k, v in params.items()
            if k not in ("raw_dir", "data_dir", "model_overrides", "train_overrides")
        }
        out.append(
            retrain.to_deployment(
                name=f"{name}-dumps",
                cron=RETRAIN_CRON,
                description=f"Merge new trajectory dumps from {incoming_dir(name)} into the {name} raw store, "
                "reprocess what changed, retrain, champion vs challenger.",
                tags=["nextloc", name, "retrain"],
                parameters={
                    "incoming_dir": incoming_dir(name),
                    "raw_dir": params["raw_dir"] or "data/raw/geolife",
                    "data_dir": params["data_dir"],
                    "model_overrides": params["model_overrides"],
                    "train_overrides": params["train_overrides"],
                    "pipeline": pipeline,
                },
            )
        )
    return out


def main() -> int:
    """Serve until SIGINT/SIGTERM."""
    configure_environment()
    if not os.environ.get("PREFECT_API_URL"):
        sys.stderr.write("PREFECT_API_URL is not set: start a server (make services) or export its URL\n")
        return 2
    from prefect import serve

    serve(*deployments(), limit=int(os.environ.get("NEXTLOC_SERVE_LIMIT", "1")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
