"""Flows whose parameters are typed sections, and the flat parameter names they replaced.

The flows take a few frozen pydantic sections (``preprocess``, ``training``, ``promotion``, ``runner``,
``tracking``, ...), validated by Prefect before any work. A flow run given a parameter name from before the
sections (a deployment run's ``--param promote_metric=...``, a schedule made then) fails at that validation,
before any work, with one line naming where the setting went: ``promote_metric is now
promotion.promote_metric``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prefect import Flow
from prefect.exceptions import ParameterTypeError


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
        return super().validate_parameters(parameters)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        check_moved(kwargs, self.renamed)
        return super().__call__(*args, **kwargs)


def sectioned_flow(
    renamed: Mapping[str, str], **options: Any
) -> Callable[[Callable[..., Any]], SectionedFlow]:
    """``@flow(**options)``, making a :class:`SectionedFlow` that knows the ``renamed`` parameters."""

    def decorate(fn: Callable[..., Any]) -> SectionedFlow:
        return SectionedFlow(fn=fn, renamed=renamed, **options)

    return decorate
