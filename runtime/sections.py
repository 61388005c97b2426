"""Flows whose parameters are typed sections, and the flat parameter names they replaced.

The flows take a few frozen pydantic sections (``preprocess``, ``training``, ``promotion``, ``runner``,
``tracking``, ...), validated by Prefect before any work. A flow run given a parameter name from before the
sections (a deployment run's ``--param promote_metric=...``, a schedule made then) fails at that validation,
before any work, with one line naming where the setting went: ``promote_metric is now
promotion.promote_metric``.

Prefect gives a deployment's flow run the deployment's parameters with the run's laid over them by name, so
a section given at run time would replace the deployment's whole section (``training='{"models":
["mhsa"]}'`` would drop a profile's model presets). A deployment run's sections are therefore laid over the
deployment's key by key (:func:`over_deployment`): each key given replaces the deployment's, as each flat
parameter did before the sections; the others keep the deployment's values.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prefect import Flow
from prefect.exceptions import ParameterTypeError
from pydantic import BaseModel


def moved(section: str, names: Iterable[str]) -> dict[str, str]:
    """``{name: "section.name"}`` for each flat parameter name that is now a key of ``section``."""
    return {name: f"{section}.{name}" for name in names}


def check_moved(parameters: Mapping[str, Any], renamed: Mapping[str, str]) -> None:
    """Refuse parameters given under a name from before the sections.

    Raises:
        ParameterTypeError: one line naming each such parameter and its new place.
    """
    old = [name for name in parameters if name in renamed]
    if old:
        where = "; ".join(f"{name} is now {renamed[name]}" for name in old)
        raise ParameterTypeError(
            f"{where} (pass the section as JSON, e.g. --param {_example(renamed[old[0]])})"
        )


def _example(place: str) -> str:
    section, _, key = place.partition(".")
    return f"{section}='{{\"{key}\": ...}}'" if key else f"{section}=..."


class SectionedFlow(Flow):
    """A Prefect flow that names the new place of a parameter given under its old flat name
    (:func:`check_moved`), when called from Python and when a flow run's parameters are validated."""

    def __init__(self, *args: Any, renamed: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.renamed = dict(renamed or {})

    def validate_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        check_moved(parameters, self.renamed)
        return super().validate_parameters(over_deployment(self, parameters))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        check_moved(kwargs, self.renamed)
        return super().__call__(*args, **kwargs)


def over_deployment(flow: Flow, parameters: dict[str, Any]) -> dict[str, Any]:
    """A deployment run's ``parameters`` with each section (a dict, for a pydantic-typed parameter) laid over
    the deployment's key by key; anything else (a call from Python, a subflow) as given.

    The flow run is the one in ``$PREFECT__FLOW_RUN_ID`` (set by the worker that runs it), when it is a run
    of ``flow`` from a deployment.
    """
    sections = [k for k, v in parameters.items() if isinstance(v, dict) and _is_section(flow, k)]
    run_id = os.environ.get("PREFECT__FLOW_RUN_ID")
    if not sections or not run_id:
        return parameters
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        if run.deployment_id is None or client.read_flow(run.flow_id).name != flow.name:
            return parameters
        deployed = client.read_deployment(run.deployment_id).parameters or {}
    out = dict(parameters)
    for name in sections:
        if isinstance(deployed.get(name), dict):
            out[name] = {**deployed[name], **parameters[name]}
    return out


def _is_section(flow: Flow, name: str) -> bool:
    annotation = flow.fn.__annotations__.get(name)
    if isinstance(annotation, str):  # postponed annotations: the name of a class in the flow's module
        annotation = flow.fn.__globals__.get(annotation)
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def sectioned_flow(
    renamed: Mapping[str, str], **options: Any
) -> Callable[[Callable[..., Any]], SectionedFlow]:
    """``@flow(**options)``, making a :class:`SectionedFlow` that knows the ``renamed`` parameters."""

    def decorate(fn: Callable[..., Any]) -> SectionedFlow:
        return SectionedFlow(fn=fn, renamed=renamed, **options)

    return decorate
