"""Trustworthy timing of competing GEMM candidates.

Candidates are timed in interleaved rounds (every round times each candidate once, in a rotated
order) so that drift in machine load affects all of them alike; the statistic is the median.
GPU calls are timed with CUDA events, CPU calls with ``time.perf_counter``.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class Measurement:
    """Median seconds per call for each candidate, and how many timed rounds produced them."""

    median_s: dict[str, float]
    rounds: int
    samples: dict[str, list[float]] = field(repr=False, default_factory=dict)


def _time_cpu(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _time_cuda(fn: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def measure(fns: dict[str, Callable[[], object]], device: torch.device | str, warmup: int = 3,
            repeats: int = 10, max_seconds: float = 10.0) -> Measurement:
    """Time each callable in ``fns``: ``warmup`` untimed rounds, then up to ``repeats`` timed rounds.

    Stops early (after at least one warm-up and one timed round) once ``max_seconds`` have passed.
    """
    if warmup < 0 or repeats < 1 or max_seconds <= 0:
        raise ValueError(f"need warmup >= 0, repeats >= 1, max_seconds > 0; got {warmup}, {repeats}, {max_seconds}")
    dev = torch.device(device)
    timer = _time_cuda if dev.type == "cuda" else _time_cpu
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    names = list(fns)
    deadline = time.perf_counter() + max_seconds
    for i in range(max(warmup, 1)):
        for name in names:
            fns[name]()
        if time.perf_counter() > deadline:
            break
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    samples: dict[str, list[float]] = {name: [] for name in names}
    rounds = 0
    while rounds < repeats:
        shift = rounds % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(timer(fns[name]))
        rounds += 1
        if time.perf_counter() > deadline:
            break
    return Measurement({n: statistics.median(s) for n, s in samples.items()}, rounds, samples)
