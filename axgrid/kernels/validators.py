"""Fingerprint of the software/hardware a GEMM timing was taken on.

A cache entry is only trusted when its validators equal the current ones; any difference
(another GPU model, torch/cupy/BLAS version, TF32 setting, CPU thread count) means re-tune.
"""
from __future__ import annotations

import platform
import re

import torch

from axgrid.device import of

from .candidates import cupy_version


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def _cpu_blas() -> str:
    found = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    name = found.group(1) if found else "unknown"
    return f"{name} (mkl={torch.backends.mkl.is_available()}, mkldnn={torch.backends.mkldnn.is_available()})"


def _gpu_blas() -> str:
    if getattr(torch.version, "hip", None):
        lib = f"hipblas/rocblas (hip {torch.version.hip})"
    else:
        lib = f"cublas (cuda {torch.version.cuda})"
    pref = getattr(torch.backends.cuda, "preferred_blas_library", None)
    return f"{lib}, preferred={pref()}" if pref else lib


def current_validators(device: str | torch.device) -> dict[str, object]:
    """Validator fields for timings taken now on ``device`` (a device type or a torch.device)."""
    dev = torch.device(device)
    common = {"torch": torch.__version__, "cupy": cupy_version(),
              "fp32_matmul_precision": torch.get_float32_matmul_precision()}
    if dev.type == "cuda":
        return {"device_name": of(dev).name(), "blas": _gpu_blas(),
                "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32), **common}
    return {"device_name": _cpu_name(), "blas": _cpu_blas(), "cpu_threads": torch.get_num_threads(), **common}
