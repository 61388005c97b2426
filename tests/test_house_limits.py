"""The codebase's house limits: short functions, short modules, and one home each for MLflow and the kinds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("nextloc", "runtime", "tracking", "tasks", "flows", "services", "commands")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500
# MLflow is called from the tracking layer and from the models-from-code file MLflow logs as the model
MLFLOW_HOMES = {"tracking/mlflow_runs.py", "tracking/versions.py", "tracking/pyfunc_model.py"}


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


ARCHITECTURE = REPO / "docs" / "architecture.md"


def _floors() -> list[list[str]]:
    """The import order of docs/architecture.md (its fenced block after ``<!-- import order``), ground first."""
    text = ARCHITECTURE.read_text()
    block = text[text.index("<!-- import order") :].split("```")[1]
    return [[unit.strip() for unit in line.split(",")] for line in block.strip().splitlines()]


def _unit(module: str) -> str:
    """The folder a module belongs to: ``nextloc.<stage>`` or ``nextloc.<top module>``, else its package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "nextloc" else parts[0]


def test_folders_import_only_the_floors_before_their_own() -> None:
    """No loop between folders, lazy imports included: each imports only what docs/architecture.md lists
    before it, and every folder of the tree has its place there."""
    floor = {unit: i for i, line in enumerate(_floors()) for unit in line}
    graph = _import_graph()
    unplaced = sorted({_unit(m) for m in graph} - set(floor))
    assert not unplaced, f"folders missing from the import order in docs/architecture.md: {unplaced}"
    assert not sorted(set(floor) - {_unit(m) for m in graph}), "the import order names what is gone"
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _unit(module) != _unit(target) and floor[_unit(target)] >= floor[_unit(module)]
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


def test_tasks_hold_tasks() -> None:
    """Every module of ``tasks/`` defines a Prefect task: the runtime glue is ``runtime/``, the MLflow adapters
    ``tracking/``, and what the command line calls ``commands/``."""
    without = [
        _name(p)
        for p in sorted((REPO / "tasks").glob("*.py"))
        if p.name != "__init__.py" and not re.search(r"^@task\b", p.read_text(), re.M)
    ]
    assert not without, without


def test_the_architecture_page_names_every_library_module_and_nothing_gone() -> None:
    """docs/architecture.md's table of the library's folders lists each folder's modules exactly (``top``:
    the modules at ``nextloc/``'s top)."""
    rows = re.findall(r"^\| `?([a-z_]+)/?`? \| ((?:`[a-z_]+`(?:, )?)+) \|", ARCHITECTURE.read_text(), re.M)
    named = {folder: set(re.findall(r"`([a-z_]+)`", modules)) for folder, modules in rows}
    library = REPO / "nextloc"
    tree = {p.name: {m.stem for m in p.glob("*.py")} - {"__init__"} for p in library.iterdir() if p.is_dir()}
    tree = {folder: modules for folder, modules in tree.items() if modules}
    tree["top"] = {p.stem for p in library.glob("*.py")} - {"__init__"}
    assert named == tree


NAMED_PATH = re.compile(
    r"(?<![\w/.-])((?:nextloc|tasks|flows|services|commands|tests|benchmarks|docs|configs)/[\w/.-]*\.(?:py|md|yaml|json))"
)


def test_every_path_the_docs_and_docstrings_name_exists() -> None:
    """A file named in the docs, the Makefile or a module's text is in the tree (a move updates its mentions)."""
    texts = [*(REPO / "docs").glob("*.md"), REPO / "README.md", REPO / "BENCHMARKS.md", REPO / "Makefile"]
    texts += [p for d in (*PACKAGES, "benchmarks", "tests") for p in (REPO / d).rglob("*.py")]
    gone = sorted(
        f"{_name(text)}: {path}"
        for text in texts
        if "__pycache__" not in text.parts
        for path in NAMED_PATH.findall(text.read_text())
        if not (REPO / path.rstrip(".")).exists()
    )
    assert not gone, gone
