"""The codebase's house limits: short functions, short modules, and one home each for MLflow and the kinds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("nextloc", "tasks", "flows", "services", "commands")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500
# MLflow is called from the tracking layer and from the models-from-code file MLflow logs as the model
MLFLOW_HOMES = {"tasks/tracking.py", "tasks/versions.py", "tasks/pyfunc_model.py"}


def _modules() -> list[Path]:
    return sorted(
        p for package in PACKAGES for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts
    )


def _name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@pytest.mark.parametrize("path", _modules(), ids=_name)
def test_modules_and_functions_are_short(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{_name(path)} is over {MAX_MODULE_LINES} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{_name(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"
    assert "noqa: C901" not in text, f"{_name(path)} silences the complexity rule"


def test_mlflow_is_called_from_the_tracking_layer_only() -> None:
    importers = {
        _name(p) for p in _modules() if re.search(r"^\s*(import mlflow|from mlflow)", p.read_text(), re.M)
    }
    assert importers <= MLFLOW_HOMES, sorted(importers - MLFLOW_HOMES)


def test_the_library_imports_neither_prefect_nor_mlflow() -> None:
    offenders = [
        _name(p)
        for p in (REPO / "nextloc").rglob("*.py")
        if re.search(r"^\s*(import|from) (prefect|mlflow)\b", p.read_text(), re.M)
    ]
    assert not offenders


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports, anywhere in the file (inside functions and under
    ``TYPE_CHECKING`` too: a lazy import is still a dependency)."""
    names = {_module_name(p): p for p in _modules()}

    def project_module(dotted: str) -> str | None:
        while dotted and dotted not in names:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {m for t in targets if (m := project_module(t)) and m != name}
    return graph


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A path of imports from ``start`` back to ``start``, if there is one (depth first)."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(graph[node]):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_cycles_lazy_imports_included() -> None:
    graph = _import_graph()
    cycles = {" -> ".join(c) for name in graph if (c := _cycle_from(name, graph))}
    assert not cycles, sorted(cycles)


# stage -> the stages it must never import (nextloc/<stage>/): the pipeline's order, one way
LAYERS = {
    "nextloc.raw": ("nextloc.preprocessing", "nextloc.training", "nextloc.evaluation", "nextloc.predict"),
    "nextloc.io": ("nextloc.training", "nextloc.evaluation", "nextloc.predict", "nextloc.routine"),
    "nextloc.preprocessing": ("nextloc.training", "nextloc.evaluation", "nextloc.predict", "nextloc.routine"),
}


def test_stages_import_one_way() -> None:
    graph = _import_graph()
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for stage, banned in LAYERS.items()
        if module == stage or module.startswith(stage + ".")
        for target in targets
        if any(target == b or target.startswith(b + ".") for b in banned)
    )
    assert not wrong, wrong


def test_the_library_tests_mirror_its_folders() -> None:
    """``tests/nextloc/<stage>/`` for each stage folder of ``nextloc/`` that has tests; none for a folder that
    does not exist."""
    stages = {p.name for p in (REPO / "nextloc").iterdir() if (p / "__init__.py").is_file()}
    folders = {
        p.name for p in (REPO / "tests" / "nextloc").iterdir() if p.is_dir() and p.name != "__pycache__"
    }
    assert folders <= stages, sorted(folders - stages)
    top = {p.stem for p in (REPO / "nextloc").glob("*.py")} - {"__init__"}
    loose = {p.stem.removeprefix("test_") for p in (REPO / "tests" / "nextloc").glob("test_*.py")}
    assert loose <= top | {"boundaries"}, sorted(loose - top)
    assert len(top) <= 12, f"{len(top)} modules at nextloc's top: {sorted(top)}"


def test_flows_hold_flows_only() -> None:
    """The command line lives in ``commands/``: no argument parsing in ``flows/``."""
    parsers = [
        _name(p)
        for p in (REPO / "flows").rglob("*.py")
        if re.search(r"^\s*import argparse", p.read_text(), re.M)
    ]
    assert not parsers, parsers
