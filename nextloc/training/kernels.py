"""Which kernels compute this process's floats: the CPU, torch's and NumPy's builds and dispatch, the overrides.

The last bits of a training run depend on more than torch's capability name: two CPUs that both report
``AVX512`` run different oneDNN/MKL code paths (vendor, microarchitecture, the ISA each library picks for
itself), and ``DNNL_MAX_CPU_ISA`` changes the bits without changing the name. :func:`kernel_fingerprint`
records all of it; results may be compared bit for bit only where :func:`same_kernels` says every field is
equal, and within a tolerance elsewhere (``tests/nextloc/training/test_kernels.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Environment variables that change which kernels run without changing the hardware or the builds.
KERNEL_ENV = (
    "ATEN_CPU_CAPABILITY",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
    "MKL_DEBUG_CPU_TYPE",
    "NPY_DISABLE_CPU_FEATURES",
    "NPY_ENABLE_CPU_FEATURES",
)
_CPUINFO_KEYS = ("vendor_id", "cpu family", "model", "stepping", "model name")
# the instruction-set flags the kernels dispatch on (the rest of /proc/cpuinfo's flags change no result)
_ISA_PREFIXES = ("avx", "fma", "amx", "sse", "ssse", "f16c", "bmi", "vnni")


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any] | None:
    """The first processor's vendor, family, model, stepping, name and ISA flags; None where unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    fields: dict[str, Any] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key in _CPUINFO_KEYS:
            fields[key] = value.strip()
        elif sep and key == "flags":
            fields["isa"] = sorted(f for f in value.split() if f.startswith(_ISA_PREFIXES))
    return fields if "vendor_id" in fields and "isa" in fields else None


def _numpy_dispatch() -> list[str]:
    """The SIMD targets NumPy's functions run in this process (after ``NPY_DISABLE_CPU_FEATURES``)."""
    from numpy.lib.introspect import opt_func_info

    return sorted({target["current"] for func in opt_func_info().values() for target in func.values()})


def kernel_fingerprint() -> dict[str, Any]:
    """What decides this process's float bits on a CPU, as plain JSON."""
    libraries = [
        line.strip(" -")
        for line in torch.__config__.show().splitlines()
        if "Math Kernel Library" in line or "MKL-DNN" in line or "OpenBLAS" in line
    ]
    return {
        "cpu": cpu_identity(),
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "torch_libraries": libraries,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "numpy": np.__version__,
        "numpy_dispatch": _numpy_dispatch(),
        "env": {name: os.environ[name] for name in KERNEL_ENV if name in os.environ},
    }


def same_kernels(recorded: dict[str, Any] | None, current: dict[str, Any] | None = None) -> bool:
    """True only where ``recorded`` is proved to be this process's kernels: every field equal, the CPU known."""
    current = kernel_fingerprint() if current is None else current
    return recorded is not None and recorded.get("cpu") is not None and recorded == current


def describe_device(device: torch.device) -> str:
    """``device`` as a person reads it: the GPU's name, or the CPU's threads and torch's capability."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)}, torch {torch.__version__})"
    threads = torch.get_num_threads()
    capability = torch.backends.cpu.get_cpu_capability()
    return f"cpu ({threads} thread{'s' * (threads != 1)}, {capability}, torch {torch.__version__})"
