"""``sync_gradients`` on gradients that are views of the data-parallel buckets ("views", what it does: the buckets
are all-reduced in place, no second copy of any gradient) against copying the gradients into a bucket buffer kept
across steps, all-reducing it and copying back ("copy", what it did before: one more copy of every gradient),
interleaved in one run on a pure data-parallel grid ``1x1x1xN`` over the same gradients.

    python experiments/bench/bench_dp_buckets.py --ranks 2 --mb 64

Gradients: ``--mb`` MB of fp32 in 4 MB tensors (a GPT h=512 FC weight), bucketed at ``--bucket-mb``. Timed by
``axgrid/measure/harness.py`` (shuffled rounds, warm-up excluded); wall time is the slowest rank's, CPU seconds
the sum over ranks; ratios views/copy are taken within each round (median [min-max] over rounds).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist

from axgrid.measure import harness
import axgrid
from axgrid.testing import RankPool


def _reduce(values: list[float], op: dist.ReduceOp) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return t.tolist()


def rank_bench(n: int, mb: float, bucket_mb: float, rounds: int, steps: int, warmup: int) -> dict:
    grid = axgrid.init(f"1x1x1x{n}", config=axgrid.RuntimeConfig(timeout_s=300,
                                                                 bucket_bytes=int(bucket_mb * 2 ** 20)))
    try:
        per = 2 ** 20                          # 4 MB of fp32 per tensor
        params = [torch.nn.Parameter(torch.zeros(512, per // 512)) for _ in range(max(1, int(mb / 4)))]
        gen = torch.Generator().manual_seed(grid.coord.d)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        buckets = grid.runtime.dp.buckets_for(params)      # the gradients are now views of its buckets
        groups = [[buckets.order[m] for m in b.members] for b in buckets.buckets]
        buffers = [torch.empty(sum(p.numel() for p in g)) for g in groups]

        def copy() -> None:                    # a bucket buffer of its own: gradients copied in and out
            for g, buf in zip(groups, buffers):
                torch.cat([p.grad.reshape(-1) for p in g], out=buf)
                grid.comm.all_reduce(buf, "d", average=True)
                off = 0
                for p in g:
                    p.grad.copy_(buf[off: off + p.numel()].view_as(p))
                    off += p.numel()

        def views() -> None:
            buckets.reduced = False            # the same gradients again: reduce them as a new step would
            axgrid.sync_gradients(params, grid)

        res = harness.measure({"copy": copy, "views": views}, rounds=rounds, steps_per_round=steps, warmup=warmup,
                              barrier=dist.barrier, also={"cpu": time.process_time})
        wall = res.reduced(lambda v: _reduce(v, dist.ReduceOp.MAX))
        cpu = res.extra["cpu"].reduced(lambda v: _reduce(v, dist.ReduceOp.SUM))
        return {"wall": wall, "cpu": cpu, "copy_mb": sum(b.numel() * 4 for b in buffers) / 1e6}
    finally:
        grid.destroy()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mb", type=float, default=64.0, help="MB of gradients")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2, help="timed syncs per configuration per round")
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    with RankPool(args.ranks, timeout_s=300) as pool:
        out = pool.run(rank_bench, args.ranks, args.mb, args.bucket_mb, args.rounds, args.steps, args.warmup,
                       deadline_s=1800)[0]
    wall, cpu = out["wall"], out["cpu"]
    print(f"{args.ranks} ranks, grid 1x1x1x{args.ranks}, {args.mb:g} MB fp32 gradients, {args.bucket_mb:g} MiB "
          f"buckets; the copy's buffers: {out['copy_mb']:.1f} MB per rank more (views: none)")
    print(f"wall ms/sync (slowest rank): copy {wall.spread('copy').fmt(1e3)}  views {wall.spread('views').fmt(1e3)}"
          f"  views/copy {wall.ratio('views', 'copy').fmt(1.0, 3)}")
    print(f"CPU ms/sync (sum of ranks):  copy {cpu.spread('copy').fmt(1e3)}  views {cpu.spread('views').fmt(1e3)}"
          f"  views/copy {cpu.ratio('views', 'copy').fmt(1.0, 3)}")
    print(f"({args.rounds} rounds, both in a new shuffled order each round, {args.steps} timed sync(s) each per "
          f"round after {args.warmup} warm-up; spread = min-max over rounds)")
    return 0


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "bench_dp_buckets")     # errors said once, as one line (axgrid.launch.errors)
