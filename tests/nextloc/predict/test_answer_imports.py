"""A routine kind's answer imports only what answering needs (issue 33): no torch, scikit-learn, LightGBM."""

from __future__ import annotations

import subprocess
import sys


def test_answering_imports_no_torch_sklearn_or_lightgbm():
    code = (
        "import sys; import nextloc.predict.answer, nextloc.bundle, commands.evaluate, tracking.registered, commands.main; "
        "print(sorted(m for m in ('torch', 'sklearn', 'lightgbm', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
