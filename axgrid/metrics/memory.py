"""Peak memory of one step: the CUDA/ROCm caching allocator's peak on a GPU, the host resident set's peak on a CPU.

GPU: ``torch.cuda.reset_peak_memory_stats`` at the start of the step, ``torch.cuda.max_memory_allocated`` at
its end (tensors only; the allocator's reserved pool is larger). CPU: the kernel's high-water mark of the
process's resident set (``VmHWM``, the counter ``getrusage``'s ``ru_maxrss`` reads), reset at the start of the step
by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0). psutil, the field's library for process memory,
reports the current RSS but not its peak on Linux (its ``peak_wset`` exists on Windows only) and cannot reset
one, so the peak is read here with the standard library. Where the reset is refused (not Linux, or a locked
``/proc``) the figure is the peak since the process started, and :attr:`PeakMemory.source` says so.
"""
from __future__ import annotations

import resource
import sys

import torch


def _reset_host_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """``reset()`` before a step, ``read()`` after it: peak bytes on ``device`` during the step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            self.source = "torch.cuda.max_memory_allocated (allocator peak, reset each step)"
            self.per_step = True
        else:
            self.per_step = _reset_host_peak()
            self.source = ("host RSS peak (VmHWM via getrusage, reset each step through /proc/self/clear_refs)"
                           if self.per_step else "host RSS peak since process start (getrusage ru_maxrss)")

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.per_step:
            _reset_host_peak()

    def read(self) -> int:
        """Peak bytes since the last :meth:`reset`."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) if sys.platform == "darwin" else int(peak) * 1024     # macOS: bytes; Linux: KiB
