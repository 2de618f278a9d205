"""What axgrid asks of the device a rank computes on, and the CPU's answers.

:class:`Device` is the interface: identity (name, PCI address, the key that tells two ranks they share a device),
synchronisation, events (timing that does not stop the device), memory statistics and the energy counter.
:class:`CpuDevice` answers for a CPU; :mod:`axgrid.device.cuda` for NVIDIA and AMD GPUs (the only module of axgrid
that calls ``torch.cuda``; a GPU's random-number state is its :func:`~axgrid.device.cuda.rng_state`). A test double
for a GPU the machine does not have lives in :mod:`axgrid.dryrun.harness`.

An :class:`Event` marks a point in the work the device has been given (``record()``), and later tells the time
between two marks (``seconds_to(later)``) -- on a GPU without stopping the stream at the mark: the host only waits
when it reads the time, which callers do outside the timed path (at the end of a step).
"""
from __future__ import annotations

import platform
import resource
import socket
import sys
import time
from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from ..metrics.energy import Energy


def host_read(t: torch.Tensor) -> "bool | int | float | list":
    """The value of ``t`` on the host: a Python number for a 0-d tensor, else a flat list (a few values: an
    agreement, a stopping test). An intended read: on a GPU it waits for the device. The library reads device values
    only through here, so a dry run (:mod:`axgrid.dryrun.harness`) tells them from an accidental ``.item()`` or
    ``.cpu()`` in the hot path."""
    if t.dim() == 0:
        return t.item()
    flat = t.detach().reshape(-1).cpu()            # one copy from the device, then host reads only
    return [flat[i].item() for i in range(flat.numel())]


class Event:
    """A point in the device's work; ``seconds_to(later)`` is the time from this point to ``later``'s."""

    def record(self) -> "Event":
        raise NotImplementedError

    def done(self) -> bool:
        """Whether the device has reached this point (never blocks)."""
        raise NotImplementedError

    def seconds_to(self, later: "Event") -> float:
        """Seconds from this event to ``later`` (both recorded; waits for ``later`` to be reached)."""
        raise NotImplementedError


class HostEvent(Event):
    """The host's clock: a CPU runs its work synchronously, so the moment ``record`` is called is the moment."""

    def __init__(self) -> None:
        self.t: Optional[float] = None

    def record(self) -> "HostEvent":
        self.t = time.perf_counter()
        return self

    def done(self) -> bool:
        return self.t is not None

    def seconds_to(self, later: Event) -> float:
        assert isinstance(later, HostEvent) and self.t is not None and later.t is not None
        return later.t - self.t


def _reset_host_peak() -> bool:
    """Reset the kernel's high-water mark of this process's resident set (Linux >= 4.0); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Device:
    """The device of one rank (``torch``: its ``torch.device``). Subclasses answer for a kind of hardware:
    ``kind`` is "cpu", "cuda" (NVIDIA) or "rocm" (AMD); ``is_gpu`` says whether work runs asynchronously to the
    host (so timing needs events, and reading a value back to the host stops the host until the device is done)."""

    kind = "cpu"
    is_gpu = False

    def __init__(self, device: torch.device) -> None:
        self.torch = torch.device(device)

    # -- identity ---------------------------------------------------------------------------------------------
    def name(self) -> str:
        """What the device calls itself (a GPU's marketing name, a CPU's model name)."""
        raise NotImplementedError

    def pci_bus_id(self) -> Optional[str]:
        """NVML/amdsmi's ``DDDDDDDD:BB:DD.F`` address of the device, or None (a CPU, or not reported)."""
        return None

    def energy_key(self) -> str:
        """What names the energy counter this rank's work is measured by, the same string on every rank that shares
        it (``axgrid.metrics.energy.energy_readers`` picks one reader per key)."""
        raise NotImplementedError

    def energy(self) -> "Energy":
        """The energy counter of :meth:`energy_key` (:mod:`axgrid.metrics.energy`), or one that says why none."""
        raise NotImplementedError

    # -- work, events, streams -----------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait until the device has done all the work given to it (a no-op on a CPU)."""

    def event(self) -> Event:
        """A new :class:`Event` on the stream that does this rank's work (record it with ``.record()``)."""
        return HostEvent()

    # -- memory ------------------------------------------------------------------------------------------------
    memory_source = ""

    def reset_peak_memory(self) -> None:
        """Start a new peak (see :meth:`peak_memory`)."""

    def peak_memory(self) -> int:
        """Peak bytes since the last :meth:`reset_peak_memory` (``memory_source`` says of what)."""
        raise NotImplementedError

    def allocated_memory(self) -> int:
        """Bytes of live tensors on the device now (0 where the device does not count them)."""
        return 0

    def memory_info(self) -> Optional[tuple[int, int]]:
        """``(free, total)`` bytes of the device's memory, or None where unknown."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.torch})"


class CpuDevice(Device):
    """A CPU: work is synchronous, time is the host's clock, memory is the process's resident set, energy the node's
    RAPL package counters.

    Peak memory: the kernel's high-water mark of the resident set (``VmHWM``, read by ``getrusage``), reset by
    writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0). psutil reports the current RSS but not its peak on
    Linux and cannot reset one, so the standard library does it here; where the reset is refused the figure is the
    peak since the process started, and ``memory_source`` says so."""

    def __init__(self, device: torch.device = torch.device("cpu")) -> None:
        super().__init__(device)
        self.per_step_peak = _reset_host_peak()
        self.memory_source = ("host RSS peak (VmHWM via getrusage, reset each step through /proc/self/clear_refs)"
                              if self.per_step_peak else "host RSS peak since process start (getrusage ru_maxrss)")

    def name(self) -> str:
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or "cpu"

    def energy_key(self) -> str:
        return socket.gethostname()          # RAPL counts the node's packages, shared by all its ranks

    def energy(self) -> "Energy":
        from ..metrics.energy import rapl_energy
        return rapl_energy()

    def reset_peak_memory(self) -> None:
        if self.per_step_peak:
            _reset_host_peak()

    def peak_memory(self) -> int:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) if sys.platform == "darwin" else int(peak) * 1024     # macOS: bytes; Linux: KiB
