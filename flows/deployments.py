"""The deployments, registered in the work pool: ``preprocess-train/<name>`` for every dataset profile, and
``retrain/<name>-dumps``.

``python -m flows.deployments`` (``make services`` runs it once the Prefect server is up) registers them with the
Prefect API in ``PREFECT_API_URL``, in the process work pool ``nextloc`` (``$NEXTLOC_WORK_POOL``). Their
flow runs go to whichever worker of the pool is free (``nextloc worker``, :mod:`services.worker`): each runs
in its worker's project folder (the deployment's pull step changes to ``$NEXTLOC_PROJECT_DIR``, which the
worker sets), with that folder's data, and tracks into the MLflow tracking server whose URL the deployment
carries (``$NEXTLOC_TRACKING_URI``, an ``http://`` URL: no database password on any worker).

Every ``configs/datasets/<name>.yaml`` (``$NEXTLOC_DATASETS_DIR`` points elsewhere) gets
``preprocess-train/<name>``, with the profile's input, protocol, model presets and outputs under
``data/<name>/`` as its parameters (the same resolution as ``nextloc run --dataset <name>``;
``preprocess-train/geolife`` is the GeoLife default). A profile whose input is missing still gets its
deployment; a run of it fails naming the missing path.

A profile that reads GeoLife ``.plt`` folders also gets ``retrain/<name>-dumps``, on a cron schedule
(``$NEXTLOC_RETRAIN_CRON``, default hourly at minute 17): ``retrain/geolife-dumps`` watches
``data/incoming``, another profile ``data/incoming-<name>``. Dumps are GeoLife-layout folders or
archives, so a profile reading another format (``diy``: visits) gets no retrain deployment; the log
says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

from flows import configure_environment

#: The process work pool the deployments run in (``$NEXTLOC_WORK_POOL``).
WORK_POOL = os.environ.get("NEXTLOC_WORK_POOL", "nextloc")

RETRAIN_CRON = os.environ.get("NEXTLOC_RETRAIN_CRON", "17 * * * *")
#: The deployments' pull step: a flow run starts in its worker's project folder (set by ``nextloc worker``).
PROJECT_DIR_STEP = {
    "prefect.deployments.steps.set_working_directory": {"directory": "{{ $NEXTLOC_PROJECT_DIR }}"}
}
#: What a deployment's flow runs get from the services, on whichever machine they run.
RUN_ENV = ("NEXTLOC_TRACKING_URI", "NEXTLOC_MLFLOW_UI_URL")
DEFAULT_PROFILE = "geolife"
log = logging.getLogger("nextloc.deployments")


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
    from prefect.deployments.runner import EntrypointType

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
                entrypoint_type=EntrypointType.MODULE_PATH,
            )
        )
        if profile.input.format != "geolife":
            log.info(
                "profile %s reads %s input: no retrain deployment (dumps are GeoLife .plt)",
                name,
                profile.input.format,
            )
            continue
        out.append(
            retrain.to_deployment(
                name=f"{name}-dumps",
                cron=RETRAIN_CRON,
                description=f"Merge new trajectory dumps from {incoming_dir(name)} into the {name} raw store, "
                "reprocess what changed, retrain, champion vs challenger.",
                tags=["nextloc", name, "retrain"],
                entrypoint_type=EntrypointType.MODULE_PATH,
                parameters={
                    "incoming_dir": incoming_dir(name),
                    "raw_dir": params["raw_dir"] or "data/raw/geolife",
                    **{k: v for k, v in params.items() if k not in ("raw_dir", "input_format", "columns")},
                },
            )
        )
    return out


def register(pool: str = WORK_POOL) -> list[str]:
    """Create the process work pool ``pool`` if missing and register :func:`deployments` in it; returns
    their names. A deployment's flow runs get :data:`RUN_ENV` from this process's environment. Also creates
    the limit behind :func:`runtime.locking.registry_lock`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate, WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    from runtime.locking import ensure_registry_limit

    env = {key: os.environ[key] for key in RUN_ENV if os.environ.get(key)}
    names = []
    with get_client(sync_client=True) as client:
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        for deployment in deployments():
            deployment.job_variables = {"env": env}
            deployment_id = deployment.apply(work_pool_name=pool)
            client.update_deployment(deployment_id, DeploymentUpdate(pull_steps=[PROJECT_DIR_STEP]))
            names.append(f"{deployment.flow_name}/{deployment.name}")
    ensure_registry_limit()
    log.info("registered in work pool %s: %s", pool, ", ".join(names))
    return names


def main() -> int:
    """Register the deployments in the work pool, then exit."""
    configure_environment()
    if not os.environ.get("PREFECT_API_URL"):
        sys.stderr.write("PREFECT_API_URL is not set: start a server (make services) or export its URL\n")
        return 2
    register()
    return 0


if __name__ == "__main__":
    sys.exit(main())
