"""Which results may be compared bit for bit: every recorded machine's kernels, and the recipes' digests.

The recordings are the real CPUs this project has met (``../shared/machines/``, the repo's own digest
files); no test here may depend on the CPU it runs on: each change of a field is made relative to the
recording it changes, and asserted to have changed it.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nextloc.training.kernels import kernel_fingerprint, same_kernels

REPO = Path(__file__).resolve().parents[3]
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

MACHINES = REPO.parent / "shared" / "machines"
DIGEST_SCRIPT = REPO / "benchmarks" / "train_digest.py"
# the repo's own recordings: an Intel Xeon (AVX-512 + AMX), and another Xeon whose CPU was not recorded
REPO_DIGESTS = (
    REPO / "benchmarks" / "results" / "train-digest-after.json",
    REPO / "tests" / "golden" / "train-digest-another-xeon.json",
)


def _machines(pattern: str) -> list[Path]:
    """``../shared/machines/<pattern>``: required in CI (shared/ is there), optional elsewhere."""
    found = sorted(MACHINES.glob(pattern))
    if not found and IN_CI:
        raise FileNotFoundError(f"no {pattern} in {MACHINES} (CI must have ../shared)")
    return found


def _digest_paths(extra: str | None) -> list[Path]:
    paths = [*REPO_DIGESTS, *_machines("*.train-digest.json")]
    if extra and Path(extra).resolve() not in {p.resolve() for p in paths}:
        paths.append(Path(extra))
    return paths


def _recorded_fingerprints() -> dict[str, dict[str, Any]]:
    """Every recorded fingerprint by its file's name: shared/machines' and each digest file's kernels."""
    recorded = {p.name: json.loads(p.read_text()) for p in _machines("*.fingerprint.json")}
    for path in _digest_paths(None):
        recorded[path.name] = json.loads(path.read_text())["kernels"]
    return recorded


RECORDED = _recorded_fingerprints()
KNOWN_CPU = [name for name, kernels in RECORDED.items() if kernels.get("cpu") is not None]


# --- the kernels: only the very same ones compare bits ------------------------------------------------


def _other(value: Any, *choices: str) -> str:
    """The first of ``choices`` that is not ``value``."""
    return next(choice for choice in choices if choice != value)


def _missing(values: list[str], *choices: str) -> str:
    """The first of ``choices`` not in ``values``."""
    return next(choice for choice in choices if choice not in values)


def _bump(number: str) -> str:
    return str(int(number) + 1)


# Each changes one field of a fingerprint to a value that differs from the fingerprint's own.
CHANGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "another vendor": lambda k: k["cpu"].update(
        vendor_id=_other(k["cpu"]["vendor_id"], "GenuineIntel", "AuthenticAMD")
    ),
    "another CPU family": lambda k: k["cpu"].update({"cpu family": _bump(k["cpu"]["cpu family"])}),
    "another CPU model": lambda k: k["cpu"].update(model=_bump(k["cpu"]["model"])),
    "another model name": lambda k: k["cpu"].update({"model name": k["cpu"]["model name"] + " v2"}),
    "another stepping": lambda k: k["cpu"].update(stepping=_bump(k["cpu"]["stepping"])),
    "fewer ISA flags": lambda k: k["cpu"].update(isa=k["cpu"]["isa"][:-1]),
    "more ISA flags": lambda k: k["cpu"].update(
        isa=sorted(
            {*k["cpu"]["isa"], _missing(k["cpu"]["isa"], "amx_tile", "avx512_fp16", "sse4a", "avx10_1")}
        )
    ),
    "another torch": lambda k: k.update(torch=k["torch"] + ".post1"),
    "another torch commit": lambda k: k.update(torch_git=_other(k["torch_git"], "0" * 40, "1" * 40)),
    "another oneDNN": lambda k: k.update(
        torch_libraries=_other(k["torch_libraries"], ["Intel(R) MKL-DNN v3.0.0"], ["Intel(R) MKL-DNN v3.1.0"])
    ),
    "torch's dispatch held": lambda k: k["env"].update(
        ATEN_CPU_CAPABILITY=_other(k["env"].get("ATEN_CPU_CAPABILITY"), "avx2", "default")
    ),
    "oneDNN held to another ISA": lambda k: k["env"].update(
        DNNL_MAX_CPU_ISA=_other(k["env"].get("DNNL_MAX_CPU_ISA"), "AVX2", "SSE41")
    ),
    "NumPy held back": lambda k: k.update(numpy_dispatch=k["numpy_dispatch"][1:]),
    "another NumPy": lambda k: k.update(numpy=k["numpy"] + ".post1"),
    "an unknown CPU": lambda k: k.update(cpu=None),
}


def _fingerprint(name: str) -> dict[str, Any]:
    return kernel_fingerprint() if name == "this machine" else copy.deepcopy(RECORDED[name])


@pytest.mark.parametrize("base", ["this machine", *KNOWN_CPU])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_fingerprint_with_any_field_changed_is_other_kernels(base, change):
    """A recording is its own kernels; changed in any one field (another CPU model, stepping or ISA with
    the same capability name, another MKL/oneDNN build, an override, an unknown CPU) it is not."""
    recorded = _fingerprint(base)
    if recorded["cpu"] is None:  # this machine's CPU cannot be read: nothing is proved, ever
        assert not same_kernels(copy.deepcopy(recorded), recorded)
        return
    assert same_kernels(copy.deepcopy(recorded), recorded)
    changed = copy.deepcopy(recorded)
    CHANGES[change](changed)
    assert changed != recorded, f"{change} left {base}'s fingerprint as it was"
    assert not same_kernels(changed, recorded)


@pytest.mark.parametrize("name", list(RECORDED))
def test_another_machines_recording_is_never_this_machines_kernels(name):
    """Every recorded machine is the same kernels as this one only if it is field for field this one; a
    recording without its CPU never is; no two recordings of different machines are the same kernels."""
    recorded, here = RECORDED[name], kernel_fingerprint()
    assert same_kernels(recorded, here) == (recorded.get("cpu") is not None and recorded == here)
    for other_name, other in RECORDED.items():
        if other_name != name and other != recorded:
            assert not same_kernels(other, recorded), (other_name, name)


def test_the_recordings_include_other_machines_than_this_one():
    """The tolerant path is exercised wherever the suite runs: at least one recording is another CPU's."""
    here = kernel_fingerprint()
    assert any(not same_kernels(recorded, here) for recorded in RECORDED.values())


# --- the recipes' results, pinned ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def digest_script():
    spec = importlib.util.spec_from_file_location("train_digest", DIGEST_SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def recorded_digests(request) -> dict[str, dict]:
    """Every recording the recipes are held to (the repo's, shared/machines', and ``--digests PATH``)."""
    paths = _digest_paths(request.config.getoption("--digests"))
    return {path.name: json.loads(path.read_text()) for path in paths}


@pytest.mark.parametrize("setup", ["mhsa", "mhsa_drops", "pointer", "pointer_plus", "lstm"])
def test_each_recipes_results_are_the_recorded_ones(setup, digest_script, recorded_digests):
    """Tiny deterministic runs of each recipe (``benchmarks/train_digest.py``) give every recording's
    history within 1e-5 (relative), and its weights (sha256) and history bit for bit where the kernels are
    proved the recorded ones (``nextloc.training.kernels``): a change of a recipe's results is caught,
    another machine's kernels are not (they move the last bits, about 2e-7 relative)."""
    got = digest_script.run_setup(setup)
    for name, recording in recorded_digests.items():
        want = recording["runs"][setup]
        assert (got["epochs"], got["best_epoch"]) == (want["epochs"], want["best_epoch"]), name
        assert [sorted(r) for r in got["history"]] == [sorted(r) for r in want["history"]], name
        for got_record, want_record in zip(got["history"], want["history"], strict=True):
            assert got_record == pytest.approx(want_record, rel=1e-5), name
        if same_kernels(recording["kernels"]):
            assert got["history"] == want["history"], name
            assert got["weights_sha256"] == want["weights_sha256"], name
