"""Where one training step's time goes, on rank 0: GEMMs, collectives, copies, elementwise, and the rest
(Python, autograd, the optimizer's bookkeeping), from torch.profiler over a few steps after warm-up.

    python experiments/bench/profile_step.py --ranks 4 --grid 1x2x1x2            # the MLP workload of bench_peers
    python experiments/bench/profile_step.py --ranks 4 --peer ddp --rows 25
    python experiments/bench/profile_step.py --workload gpt --ranks 8 --grid 1x1x1x8   # bench_peers' GPT

Prints the wall time per step, the time per category (self CPU time of the operators in it, per step) and the
top operators. "collectives" is the time rank 0 spends inside collective calls and waits (blocked, not the
transfer itself); "other" is wall time no operator accounts for: Python, autograd and hooks.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from typing import Optional, Sequence

import torch
import torch.distributed as dist

import axgrid
from axgrid.testing import RankPool

import peers                         # experiments/bench/peers/

CATEGORIES = [
    ("GEMM", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::_scaled_dot")),
    ("collectives", ("c10d", "gloo", "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter",
                     "_reduce_scatter", "barrier", "wait", "broadcast")),
    ("copies", ("aten::copy_", "aten::clone", "aten::contiguous", "aten::cat", "aten::to", "aten::_to_copy",
                "aten::constant_pad_nd", "aten::zeros", "aten::new_zeros", "aten::empty", "aten::fill_",
                "aten::zero_")),
    ("elementwise", ("aten::gelu", "aten::gelu_backward", "aten::add", "aten::mul", "aten::div", "aten::pow",
                     "aten::sum", "aten::mean", "aten::add_", "aten::mul_", "aten::div_", "aten::sub",
                     "aten::_foreach", "aten::threshold")),
]


def category(name: str) -> str:
    for cat, keys in CATEGORIES:
        if any(name.startswith(k) or k in name for k in keys):
            return cat
    return "other ops"


def rank_profile(w: peers.Workload, a: argparse.Namespace) -> Optional[dict]:
    torch.set_num_threads(1)
    if a.peer == "axgrid":
        c: peers.Contender = peers.AxgridContender(w, a.grid, axgrid.OverlapConfig.parse(a.overlap), 300)
    else:
        c = {"ddp": lambda: peers.DDPContender(w), "fsdp2": lambda: peers.FSDP2Contender(w),
             "dtensor1d": lambda: peers.DTensorContender(w, dist.get_world_size()),
             "dtensor2d": lambda: peers.DTensorContender(w, a.tp)}[a.peer]()
    for _ in range(a.warmup):
        c.step()
    dist.barrier()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(a.steps):
            c.step()
        wall = (time.perf_counter() - t0) / a.steps
    dist.barrier()
    name = c.name
    c.close()
    if dist.get_rank() != 0:
        return None
    rows = [(e.key, e.self_cpu_time_total / 1e6 / a.steps, e.count // a.steps) for e in prof.key_averages()]
    return {"name": name, "wall": wall, "rows": rows}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--peer", default="axgrid", choices=["axgrid", "ddp", "fsdp2", "dtensor1d", "dtensor2d"])
    ap.add_argument("--grid", default="1x2x1x2")
    ap.add_argument("--tp", type=int, default=2, help="TP size of dtensor2d")
    ap.add_argument("--overlap", default="none")
    ap.add_argument("--workload", choices=["mlp", "gpt"], default="mlp")
    peers.add_workload_args(ap)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rows", type=int, default=15)
    a = ap.parse_args(argv)
    w = peers.workload_from_args(a.workload, a)
    with RankPool(a.ranks, timeout_s=300) as pool:
        r = pool.run(rank_profile, w, a, deadline_s=1800)[0]
    by_cat: dict[str, float] = defaultdict(float)
    for key, sec, _ in r["rows"]:
        by_cat[category(key)] += sec
    accounted = sum(by_cat.values())
    print(f"{r['name']}, {a.ranks} ranks, {w.describe()}: {r['wall'] * 1e3:.1f} ms/step wall (rank 0, mean of "
          f"{a.steps} profiled steps)")
    for cat in [c for c, _ in CATEGORIES] + ["other ops"]:
        print(f"  {cat:<14} {by_cat[cat] * 1e3:>8.1f} ms  {by_cat[cat] / r['wall']:>6.1%}")
    rest = r["wall"] - accounted
    print(f"  {'Python/autograd (unaccounted)':<14} {rest * 1e3:>8.1f} ms  {rest / r['wall']:>6.1%}")
    print(f"\n{'operator':<48} {'ms/step':>8} {'calls/step':>10}")
    for key, sec, n in sorted(r["rows"], key=lambda t: -t[1])[: a.rows]:
        print(f"{key[:48]:<48} {sec * 1e3:>8.2f} {n:>10}")
    return 0


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "profile_step")     # errors said once, as one line (axgrid.launch.errors)
