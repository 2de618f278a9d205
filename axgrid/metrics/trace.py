"""A per-rank timeline of compute and collectives, written as Chrome trace JSON (chrome://tracing, Perfetto)."""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from typing import Iterator


class Tracer:
    """Collects spans ``(name, category, start, end)`` of one rank; times are ``time.perf_counter()`` seconds."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.events: list[dict] = []

    def span(self, name: str, cat: str, start: float, end: float) -> None:
        # Chrome trace: complete events ("X") in microseconds, one track per category in this rank's row.
        # perf_counter is the host's monotonic clock, shared by all ranks of one node, so rows line up.
        self.events.append({"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": cat,
                            "ts": start * 1e6, "dur": max(end - start, 0.0) * 1e6})

    @contextmanager
    def compute(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.span(name, "compute", t, time.perf_counter())

    def clear(self) -> None:
        self.events.clear()

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
