"""Every ``--param NAME=VALUE`` the README and docs/ give a ``preprocess-train`` deployment run is one the flow
takes: validated as Prefect validates a flow run's parameters (the sections, their keys and values); the
docs' example of a name from before the sections (``--param promote_metric=...``) fails naming its section."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: ``--param NAME=VALUE``: a value in single quotes may run over a line break (prose wraps it)
PARAM = re.compile(r"--param\s+(\w+)=('[^']*'|[^\s`\\]+)")


def _documented() -> list[tuple[str, str, Any]]:
    found = []
    for doc in DOCS:
        for name, raw in PARAM.findall(doc.read_text()):
            text = " ".join(raw.strip("'").split())
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                value = text
            found.append((doc.name, name, value))
    return found


DOCUMENTED = _documented()


def test_the_docs_give_deployment_parameters() -> None:
    names = {name for _, name, _ in DOCUMENTED}
    assert {"preprocess", "training", "runner", "raw_dir", "data_dir"} <= names, names


@pytest.mark.parametrize(("doc", "name", "value"), DOCUMENTED, ids=[f"{d}:{n}" for d, n, _ in DOCUMENTED])
def test_a_documented_parameter_is_one_the_flow_takes(doc: str, name: str, value: Any) -> None:
    from prefect.exceptions import ParameterTypeError

    from flows.pipeline import RENAMED, preprocess_train

    if value == "...":  # the docs' example of an old name that now fails: it names the new place
        assert name in RENAMED, f"{doc}: --param {name}=... is not a name from before the sections"
        with pytest.raises(ParameterTypeError, match=rf"^{name} is now {re.escape(RENAMED[name])}"):
            preprocess_train.validate_parameters({name: value})
        return
    validated = preprocess_train.validate_parameters({name: value})
    assert name in validated, f"{doc}: --param {name} is not a parameter of preprocess-train"
