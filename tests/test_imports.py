"""What the flows import: a cached ``nextloc run`` trains nothing, so importing the flows (and the train task,
the registry, the metric keys, the board) must not import torch (issue 33: about 1.5 s of every run)."""

from __future__ import annotations

import subprocess
import sys


def _imports_torch(modules: str) -> None:
    code = f"import sys, {modules}; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_registry_metrics_and_board_import_no_torch():
    _imports_torch(
        "nextloc.models.registry, nextloc.models, nextloc.training.overrides, nextloc.evaluation.metrics, nextloc.evaluation.leaderboard, "
        "nextloc.evaluation.champion"
    )


def test_the_flows_and_the_train_task_import_no_torch():
    _imports_torch("commands.main, flows.pipeline, flows.train, flows.preprocess, tasks.train")
