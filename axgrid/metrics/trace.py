"""A per-rank timeline of compute and collectives, written as Chrome trace JSON (chrome://tracing, Perfetto).

Spans are pairs of marks on the rank's clock (:mod:`axgrid.device.clocks`): host times on a CPU, events on the
compute stream on a GPU -- so a traced GEMM spans the kernel's run on the device, not its launch, and tracing does
not synchronise. The marks become host times (seconds of ``time.perf_counter``) when the events are read:
:attr:`Tracer.events`, :meth:`Tracer.write`.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Iterator

from ..device.clocks import HostClock


class Tracer:
    """Collects spans ``(name, category, start mark, end mark)`` of one rank on ``clock`` (default: the host's)."""

    def __init__(self, rank: int, clock=None) -> None:
        self.rank = rank
        self.clock = clock if clock is not None else HostClock()
        self._spans: list[tuple[str, str, object, object]] = []
        self._events: list[dict] = []

    def span(self, name: str, cat: str, start, end) -> None:
        """A span between two marks of the clock (``clock.mark()``)."""
        self._spans.append((name, cat, start, end))

    @property
    def events(self) -> list[dict]:
        """The spans as Chrome trace complete events ("X", microseconds), one track per category in this rank's row
        (host perf_counter time: shared by all ranks of one node, so rows line up). Reads pending device events."""
        for name, cat, start, end in self._spans:
            t0, t1 = self.clock.host_time(start), self.clock.host_time(end)
            self._events.append({"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": cat,
                                 "ts": t0 * 1e6, "dur": max(t1 - t0, 0.0) * 1e6})
        self._spans.clear()
        return self._events

    @contextmanager
    def compute(self, name: str) -> Iterator[None]:
        start = self.clock.mark()
        try:
            yield
        finally:
            self.span(name, "compute", start, self.clock.mark())

    def clear(self) -> None:
        self._spans.clear()
        self._events.clear()

    def write(self, path: str) -> str:
        """Write this rank's events to ``path`` (``{rank}`` in the path is replaced by the rank)."""
        path = path.format(rank=self.rank)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, f)
        return path


def merge_traces(paths: list[str], out: str) -> str:
    """Merge per-rank trace files into one (one process row per rank)."""
    events: list[dict] = []
    for p in paths:
        with open(p) as f:
            events.extend(json.load(f)["traceEvents"])
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return out
