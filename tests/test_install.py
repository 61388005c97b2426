"""`make install` takes torch's CUDA build where an NVIDIA GPU is listed, the local CPU wheel elsewhere.

Tried without a GPU and without the multi-GB download: a stand-in ``nvidia-smi`` on ``PATH`` and uv's dry
run of the very command the install runs (``make torch-plan``; uv reads the wheels' metadata from the
package index, nothing is installed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
H100 = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d0c2f3e-0000-4000-8000-000000000000)"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _bin_dir(tmp_path: Path, nvidia_smi: str | None) -> Path:
    """A PATH folder with a stand-in ``nvidia-smi`` printing ``nvidia_smi`` (None: it fails, as with no driver)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "nvidia-smi"
    body = f"echo '{nvidia_smi}'" if nvidia_smi is not None else "echo 'NVIDIA-SMI has failed' >&2; exit 9"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return folder


def _plan(tmp_path: Path, nvidia_smi: str | None, choice: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NEXTLOC_TORCH"}
    env["PATH"] = f"{_bin_dir(tmp_path, nvidia_smi)}:{env['PATH']}"
    if choice is not None:
        env["NEXTLOC_TORCH"] = choice
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "torch-plan"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_listed_nvidia_gpu_gets_the_pinned_versions_cuda_build(tmp_path):
    plan = _plan(tmp_path, H100)
    assert plan.returncode == 0, plan.stderr
    assert "torch build: cuda" in plan.stdout
    installs = plan.stdout + plan.stderr
    assert " + torch==2.13.0\n" in installs  # the pinned version, not the local +cpu wheel
    assert " + nvidia-cublas" in installs
    assert "--find-links" not in plan.stdout


@pytest.mark.parametrize(
    "nvidia_smi", [None, "No devices were found"], ids=["nvidia-smi-fails", "no-gpu-listed"]
)
def test_without_a_listed_gpu_the_local_cpu_wheel_as_today(tmp_path, nvidia_smi):
    if not os.environ.get("PIP_FIND_LINKS"):
        pytest.skip("no local CPU wheel on this machine ($PIP_FIND_LINKS is unset)")
    plan = _plan(tmp_path, nvidia_smi)
    assert plan.returncode == 0, plan.stderr
    assert "torch build: cpu" in plan.stdout
    installs = plan.stdout + plan.stderr
    assert " + torch==2.13.0+cpu" in installs
    assert "nvidia-" not in installs


@pytest.mark.parametrize(("nvidia_smi", "choice"), [(H100, "cpu"), (None, "cuda")])
def test_nextloc_torch_overrides_the_choice(tmp_path, nvidia_smi, choice):
    plan = _plan(tmp_path, nvidia_smi, choice)
    assert plan.returncode == 0, plan.stderr
    assert f"torch build: {choice}" in plan.stdout
    assert ("nvidia-cublas" in plan.stdout + plan.stderr) == (choice == "cuda")


def test_a_misspelt_choice_stops_make_naming_it(tmp_path):
    plan = _plan(tmp_path, H100, "rocm")
    assert plan.returncode != 0
    assert "NEXTLOC_TORCH=rocm: expected cpu or cuda" in plan.stderr
