"""The benchmark scripts stay runnable: each answers ``--help``, and none shadows a standard-library module.

A script's folder comes first on ``sys.path``: a benchmark named ``profile.py`` would hide the standard
library's ``profile``, which torch imports when training turns on deterministic algorithms, and
``benchmarks/train.py`` would crash before it measured anything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py"))


def test_no_benchmark_module_shadows_the_standard_library() -> None:
    shadowing = [p.name for p in SCRIPTS if p.stem in sys.stdlib_module_names]
    assert shadowing == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_answers_help(script: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=BENCHMARKS.parent,
    )
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout.lower()
