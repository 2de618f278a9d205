"""Peak memory of one step, as the device counts it (:mod:`axgrid.device`): the CUDA/ROCm caching allocator's peak of
allocated bytes on a GPU (tensors only; its reserved pool is larger), the host resident set's peak on a CPU (reset
per step where Linux allows, see :class:`axgrid.device.CpuDevice`). ``source`` says which.
"""
from __future__ import annotations

from typing import Union

import torch

from ..device import Device, of


class PeakMemory:
    """``reset()`` before a step, ``read()`` after it: peak bytes on ``device`` during the step."""

    def __init__(self, device: Union[torch.device, Device]) -> None:
        self.device = device if isinstance(device, Device) else of(device)
        self.source = self.device.memory_source
        self.per_step = getattr(self.device, "per_step_peak", True)

    def reset(self) -> None:
        self.device.reset_peak_memory()

    def read(self) -> int:
        """Peak bytes since the last :meth:`reset`."""
        return self.device.peak_memory()
