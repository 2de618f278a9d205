"""Calibration samples: every collective the grid posts (all-reduce, all-gather, reduce-scatter) over each (group
size, stride) a grid of this many ranks can have, all groups of a dimension busy at once, each rep started together
(barrier), the slowest rank's time per rep, the median over reps; and torch GEMMs ``[m,k]·[k,n]`` on every rank at
once, one thread per rank, timed as the throughput of a window (each rank's fair share of the cores, as in
training). JSON: {"comm": [{"op", "group_size", "stride", "bytes" (the ledger's: AR tensor / AG output / RS input),
"seconds", "concurrent": 1}], "gemm": [{"m", "n", "k", "seconds", "dtype"}], "nranks"}.
"""
from __future__ import annotations

import statistics
import time
import argparse
from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..core.config import RuntimeConfig
from ..core.runtime import init

OPS = ("all_reduce", "all_gather", "reduce_scatter")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def group_layouts(nranks: int) -> list[tuple[int, int, str, str]]:
    """Every (group size p > 1, stride s) a grid of ``nranks`` ranks in the default order can have, each with a
    grid spec and the dimension whose groups have that size and stride: (p, s, spec, dim).

    Stride 1 comes from x groups (``p x 1 x 1 x n/p``), stride s > 1 from y groups (``s x p x 1 x n/(s·p)``)."""
    if not isinstance(nranks, int) or nranks < 2:
        raise ValueError(f"measuring collectives needs >= 2 ranks, got {nranks!r}; run under `axgrid launch -n 4`")
    divisors = [d for d in range(1, nranks + 1) if nranks % d == 0]
    out = []
    for s in divisors:
        for p in (d for d in divisors if (nranks // s) % d == 0 and d > 1):
            out.append((p, 1, f"{p}x1x1x{nranks // p}", "x") if s == 1 else
                       (p, s, f"{s}x{p}x1x{nranks // (s * p)}", "y"))
    return out


def _elements(op: str, nbytes: int, p: int) -> int:
    """Elements of the fp32 tensor passed to ``op`` for a ledger buffer of about ``nbytes`` (a multiple of p)."""
    total = max(p, (nbytes // 4) // p * p)
    return total // p if op == "all_gather" else total


def rank_collectives(spec: str, dim: str, ops: Sequence[str], sizes_bytes: Sequence[int], reps: int, warmup: int,
                     timeout_s: float) -> dict[tuple[str, int], list[float]]:
    """On one rank: seconds per rep of every (op, ledger bytes) through ``grid.comm``, timed by the ledger."""
    grid = init(spec, config=RuntimeConfig(timeout_s=timeout_s, record_timing=True))
    try:
        p = grid.size(dim)
        out: dict[tuple[str, int], list[float]] = {}
        for op in ops:                     # the first use of a group sets up its connections: not timed
            getattr(grid.comm, op)(torch.zeros(p), dim)
        for op in ops:
            for nb in sizes_bytes:
                t = torch.randn(_elements(op, nb, p))
                times = []
                for i in range(warmup + reps):
                    x = t.clone() if op == "all_reduce" else t
                    dist.barrier()
                    grid.ledger.reset()
                    getattr(grid.comm, op)(x, dim)
                    e = grid.ledger.entries[(dim, op)]
                    if i >= warmup:
                        times.append(e.seconds)
                out[(op, e.bytes)] = times
        return out
    finally:
        grid.destroy()


def rank_gemms(shapes: Sequence[tuple[int, int, int]], dtype: str, min_time_s: float) -> list[float]:
    """On one rank: seconds per ``A[m,k] @ B[k,n]`` of each shape, as the throughput of a window of at least
    ``min_time_s`` during which every rank runs the same GEMM (they start together after a barrier). With more
    ranks than cores this is each rank's fair share, preemption included, as in a training step; timing single
    calls instead would catch the ones that ran undisturbed and overstate the rate."""
    out = []
    for m, n, k in shapes:
        a, b = torch.randn(m, k, dtype=DTYPES[dtype]), torch.randn(k, n, dtype=DTYPES[dtype])
        a @ b                                     # warm-up (allocations, first-call costs)
        dist.barrier()
        count, t0 = 0, time.perf_counter()
        while True:
            a @ b
            count += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_time_s and count >= 2:
                break
        out.append(elapsed / count)
    return out


def measure_collectives(a: argparse.Namespace) -> dict[str, Any]:
    """The calibration samples of this job's ranks (see the module docstring)."""
    n = dist.get_world_size()
    layouts = group_layouts(n)
    comm: list[dict] = []
    for p, s, spec, dim in layouts:
        per_rank = _gather(rank_collectives(spec, dim, a.ops, a.sizes, a.reps, a.warmup, a.timeout))
        for key in per_rank[0]:
            slowest = [max(r[key][i] for r in per_rank) for i in range(a.reps)]
            comm.append({"op": key[0], "group_size": p, "stride": s, "bytes": int(key[1]),
                         "seconds": float(statistics.median(slowest)), "concurrent": 1})
    gemm: list[dict] = []
    if a.shapes:
        per_rank = _gather(rank_gemms(a.shapes, a.gemm_dtype, a.gemm_min_time))
        gemm = [{"m": m, "n": nn, "k": k, "seconds": float(statistics.mean(r[i] for r in per_rank)),
                 "dtype": a.gemm_dtype} for i, (m, nn, k) in enumerate(a.shapes)]
    return {"nranks": n, "comm": comm, "gemm": gemm}


def _gather(value: Any) -> list[Any]:
    """``value`` of every rank, on every rank (rank order)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out
