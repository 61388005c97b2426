"""Layout rules that keep the library pure."""

from __future__ import annotations

import subprocess
import sys


def test_library_imports_no_orchestration_or_tracking():
    """Importing every nextloc module loads neither prefect nor mlflow."""
    code = (
        "import importlib, pkgutil, sys, nextloc\n"
        "for m in pkgutil.walk_packages(nextloc.__path__, 'nextloc.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = [m for m in ('prefect', 'mlflow') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
