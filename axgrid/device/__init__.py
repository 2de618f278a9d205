"""The one place that talks to the device: CPU, CUDA and ROCm differ here and nowhere else in axgrid.

    dev = axgrid.device.of(grid.device)       # or grid.accelerator, the grid's own
    dev.synchronize(); ev = dev.event().record(); ...; ev.seconds_to(dev.event().record())
    dev.reset_peak_memory(); ...; dev.peak_memory(); dev.memory_info()
    dev.name(), dev.pci_bus_id(), dev.energy_key(), dev.energy()

- :mod:`.base`: the :class:`Device` interface, the CPU's answers, host-clock events.
- :mod:`.cuda`: NVIDIA and AMD GPUs -- the only module that calls ``torch.cuda`` (``tests/unit/test_device.py``
  fails on a call into ``torch.cuda`` anywhere else in axgrid or experiments/).
- :mod:`.select`: which GPU a rank takes, and what a collective backend runs on.
- :mod:`.clocks`: timing collectives and compute spans with events on the stream that does the work.

A dry run or a test stands in its own :class:`Device` (:mod:`axgrid.dryrun.harness`), passed to
``axgrid.init(device=...)``.
"""
from .base import CpuDevice, Device, Event, HostEvent, host_read
from .select import (GPU_BACKENDS, backend_device_type, choose_device, default_backend, gpu_index, of)
from . import cuda

__all__ = ["CpuDevice", "Device", "Event", "HostEvent", "host_read", "GPU_BACKENDS", "backend_device_type",
           "choose_device", "default_backend", "gpu_index", "of", "cuda"]
