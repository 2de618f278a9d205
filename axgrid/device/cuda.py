"""NVIDIA and AMD GPUs: the only module of axgrid that calls ``torch.cuda`` (a ROCm build of torch answers to the same
API; :class:`RocmDevice` differs only where the hardware does: its energy counter, and MI250X's two dies per
package).

Events record on the current stream of the rank's own device (not the current device's: a tuner timing
``cuda:1`` from a process whose current device is 0 would otherwise time nothing), and read their time only when
asked (:meth:`CudaEvent.seconds_to`), so timing never stops the device in the middle of a step.
"""
from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Optional

import torch

from .base import Device, Event

if TYPE_CHECKING:
    from ..metrics.energy import Energy


def available() -> bool:
    """Whether torch sees a GPU (does not create a CUDA context)."""
    return torch.cuda.is_available()


def count() -> int:
    """GPUs this process sees (``CUDA_VISIBLE_DEVICES``/``ROCR_VISIBLE_DEVICES`` applied); 0 without any."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def is_rocm() -> bool:
    """Whether this torch is a ROCm (HIP) build."""
    return getattr(torch.version, "hip", None) is not None


def current_index() -> int:
    return torch.cuda.current_device()


def set_current(index: int) -> None:
    torch.cuda.set_device(index)


def rng_state() -> Optional[torch.Tensor]:
    """The current GPU's generator state, or None when this process has not started CUDA (nothing to keep)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.get_rng_state()
    return None


def set_rng_state(state: torch.Tensor) -> None:
    """Restore :func:`rng_state` on the current GPU (nothing without a GPU)."""
    if torch.cuda.is_available():
        torch.cuda.set_rng_state(state)


def toolkit() -> str:
    """The GPU toolkit torch was built with, e.g. "CUDA 12.4" or "ROCm/HIP 6.2", or "none"."""
    if is_rocm():
        return f"ROCm/HIP {torch.version.hip}"
    return f"CUDA {torch.version.cuda}" if torch.version.cuda else "none"


class CudaEvent(Event):
    """A ``torch.cuda.Event`` with timing, recorded on the current stream of ``index``."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.ev = torch.cuda.Event(enable_timing=True)

    def record(self) -> "CudaEvent":
        self.ev.record(torch.cuda.current_stream(self.index))
        return self

    def done(self) -> bool:
        return bool(self.ev.query())

    def seconds_to(self, later: Event) -> float:
        assert isinstance(later, CudaEvent)
        later.ev.synchronize()
        return self.ev.elapsed_time(later.ev) / 1e3


def _pci_bus_id(props: object) -> Optional[str]:
    """NVML's ``DDDDDDDD:BB:DD.0`` for a torch device (None when this torch does not report it)."""
    parts = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    if not all(isinstance(p, int) for p in parts):
        return None
    return "{:08X}:{:02X}:{:02X}.0".format(*parts)


class CudaDevice(Device):
    """An NVIDIA GPU (``torch.device("cuda", index)``; no index: the current device when made)."""

    kind = "cuda"
    is_gpu = True
    memory_source = "torch.cuda.max_memory_allocated (allocator peak, reset each step)"

    def __init__(self, device: torch.device) -> None:
        device = torch.device(device)
        self.index = device.index if device.index is not None else current_index()
        super().__init__(torch.device("cuda", self.index))

    def properties(self):
        return torch.cuda.get_device_properties(self.index)

    def name(self) -> str:
        return torch.cuda.get_device_name(self.index)

    def pci_bus_id(self) -> Optional[str]:
        return _pci_bus_id(self.properties())

    def energy_key(self) -> str:
        props = self.properties()
        return f"{socket.gethostname()}/{_pci_bus_id(props) or getattr(props, 'uuid', None) or self.index}"

    def energy(self) -> "Energy":
        from ..metrics.energy import nvml_energy
        return nvml_energy(self.index, self.pci_bus_id())

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.index)

    def event(self) -> Event:
        return CudaEvent(self.index)

    def current_stream(self) -> "torch.cuda.Stream":
        """The stream kernels of this device launch on now (for libraries that take a raw stream, e.g. cupy)."""
        return torch.cuda.current_stream(self.index)

    def reset_peak_memory(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.index)

    def peak_memory(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.index))

    def allocated_memory(self) -> int:
        return int(torch.cuda.memory_allocated(self.index))

    def memory_info(self) -> Optional[tuple[int, int]]:
        free, total = torch.cuda.mem_get_info(self.index)
        return int(free), int(total)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()


class RocmDevice(CudaDevice):
    """An AMD GPU under a ROCm build of torch (an MI250X GCD, an MI300X...).

    Energy comes from amdsmi, found by the GPU's PCI address: the HIP index is no name for it (under
    ``--gpu-bind=closest`` every task sees its GCD as device 0). An MI250X package holds two GCDs and reports its
    power per package: the ranks on both GCDs share one energy key (the package's serial number), so one of them
    reads the package (:func:`axgrid.metrics.energy.amdsmi_energy`)."""

    kind = "rocm"
    memory_source = "torch.cuda.max_memory_allocated on ROCm (allocator peak, reset each step)"

    def energy_key(self) -> str:
        from ..metrics.energy import amdsmi_package
        pci = self.pci_bus_id()
        package = amdsmi_package(pci) if pci is not None else None
        return f"{socket.gethostname()}/{package or pci or self.index}"

    def energy(self) -> "Energy":
        from ..metrics.energy import amdsmi_energy
        return amdsmi_energy(self.pci_bus_id(), self.index)
