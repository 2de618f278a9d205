"""Clocks for timing collectives and compute spans where the work runs, without stopping it.

- :class:`HostClock`: the host's ``perf_counter``. Right for a CPU (gloo): its work is synchronous, so a
  collective's ``wait()`` returns when it is done. It never touches a GPU, so gloo ranks on a GPU node create
  no CUDA context.
- :class:`DeviceClock`: events on the stream the rank's work runs on (CUDA/HIP events). A collective is timed
  from an event recorded at its post to one recorded right after its ``wait()`` (which makes the compute stream
  wait for the communication stream), and its exposed part from an event recorded just before the ``wait()``:
  the time the compute stream stood still for it. Nothing synchronises: the times are read when the ledger is
  read (:meth:`axgrid.core.comm.Ledger.settle`), after the step. Spans become host times through an anchor: one
  synchronise when the clock is made, then ``host time of the anchor + (event - anchor event)``.

The communicator picks the clock from its backend (:func:`clock_for`), not from whether a GPU exists.
"""
from __future__ import annotations

import time

from .base import Device, Event, HostEvent
from .select import backend_device_type


class HostClock:
    """``mark()`` is the host's time now."""

    on_device = False

    def mark(self) -> Event:
        return HostEvent().record()

    def host_time(self, ev: Event) -> float:
        assert isinstance(ev, HostEvent) and ev.t is not None
        return ev.t


class DeviceClock:
    """``mark()`` records an event on ``dev``'s current stream; :meth:`host_time` maps it to the host's clock."""

    on_device = True

    def __init__(self, dev: Device) -> None:
        self.dev = dev
        dev.synchronize()                       # once, outside any timed path: the stream is idle at the anchor
        self.anchor_host = time.perf_counter()
        self.anchor = dev.event().record()

    def mark(self) -> Event:
        return self.dev.event().record()

    def host_time(self, ev: Event) -> float:
        return self.anchor_host + self.anchor.seconds_to(ev)


def clock_for(backend: str, dev: Device) -> "HostClock | DeviceClock":
    """Device events when ``backend`` runs collectives on a GPU (NCCL/RCCL) and the rank computes on one; the host
    clock otherwise (gloo, also on a GPU node)."""
    if dev.is_gpu and backend_device_type(backend) != "cpu":
        return DeviceClock(dev)
    return HostClock()
