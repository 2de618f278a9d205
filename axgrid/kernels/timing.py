"""Trustworthy timing of competing GEMM candidates.

Candidates are timed in interleaved rounds (every round times each candidate once, in a rotated
order) so that drift in machine load affects all of them alike; the statistic is the median.
Calls are timed with the device's events (:mod:`axgrid.device`): on a GPU, events on the current stream of the
device being tuned -- not of the process's current device, where a call on ``cuda:1`` would take no time --; on a
CPU, the host's clock.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Union

import torch

from axgrid.device import Device, of


@dataclass
class Measurement:
    """Median seconds per call for each candidate, and how many timed rounds produced them."""

    median_s: dict[str, float]
    rounds: int
    samples: dict[str, list[float]] = field(repr=False, default_factory=dict)


def time_call(dev: Device, fn: Callable[[], object]) -> float:
    """Seconds ``fn`` takes on ``dev``: events around it on the device's stream, read once it is done."""
    start = dev.event().record()
    fn()
    end = dev.event().record()
    return start.seconds_to(end)


def measure(fns: dict[str, Callable[[], object]], device: Union[torch.device, str, Device], warmup: int = 3,
            repeats: int = 10, max_seconds: float = 10.0) -> Measurement:
    """Time each callable in ``fns``: ``warmup`` untimed rounds, then up to ``repeats`` timed rounds.

    ``max_seconds`` bounds the whole measurement, warm-up included (which may take at most half of it): each
    phase stops at the first call that ends past its deadline, so the total overruns by at most one call per
    phase; the first callable always gets one timed sample. A callable that never got a timed sample is left out
    of ``median_s`` (big GEMMs on a short budget).
    """
    if warmup < 0 or repeats < 1 or max_seconds <= 0:
        raise ValueError(f"need warmup >= 0, repeats >= 1, max_seconds > 0; got {warmup}, {repeats}, {max_seconds}")
    dev = device if isinstance(device, Device) else of(device)
    dev.synchronize()
    names = list(fns)
    start = time.perf_counter()
    deadline = start + max_seconds

    def over(limit: float) -> bool:
        dev.synchronize()
        return time.perf_counter() > limit

    for name in [name for _ in range(warmup) for name in names]:                # interleaved warm-up rounds
        fns[name]()
        if over(start + 0.5 * max_seconds):
            break
    samples: dict[str, list[float]] = {name: [] for name in names}
    rounds = 0
    for r, name in [(r, name) for r in range(repeats)                             # each round in a rotated order
                    for name in names[r % len(names):] + names[:r % len(names)]]:
        rounds = r + 1
        samples[name].append(time_call(dev, fns[name]))
        if over(deadline):
            break
    return Measurement({n: statistics.median(s) for n, s in samples.items() if s}, rounds, samples)
