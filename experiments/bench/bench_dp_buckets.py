"""``sync_gradients`` with its flat bucket buffers kept across steps ("kept", what it does) against a fresh
``torch.cat`` buffer per bucket per step ("fresh", what it did before), interleaved in one run on a pure
data-parallel grid ``1x1x1xN`` over the same gradients.

    python experiments/bench/bench_dp_buckets.py --ranks 2 --mb 64

Gradients: ``--mb`` MB of fp32 in 4 MB tensors (a GPT h=512 FC weight), bucketed at ``--bucket-mb``. Timed by
``axgrid/measure/harness.py`` (shuffled rounds, warm-up excluded); wall time is the slowest rank's, CPU seconds
the sum over ranks; ratios kept/fresh are taken within each round (median [min-max] over rounds).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist

from axgrid.measure import harness
import axgrid
from axgrid.data_parallel import _buckets, flat_grads, write_grads
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

        def fresh() -> None:                   # the code before buffers were kept
            for bucket in _buckets(params, grid.runtime.config.bucket_bytes):
                write_grads(bucket, grid.comm.all_reduce(flat_grads(bucket), "d", average=True))

        def kept() -> None:
            axgrid.sync_gradients(params, grid)

        res = harness.measure({"fresh": fresh, "kept": kept}, rounds=rounds, steps_per_round=steps, warmup=warmup,
                              barrier=dist.barrier, also={"cpu": time.process_time})
        wall = res.reduced(lambda v: _reduce(v, dist.ReduceOp.MAX))
        cpu = res.extra["cpu"].reduced(lambda v: _reduce(v, dist.ReduceOp.SUM))
        return {"wall": wall, "cpu": cpu, "kept_mb": grid.runtime.grad_buffers.nbytes() / 1e6}
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
          f"buckets; buffers kept: {out['kept_mb']:.1f} MB per rank")
    print(f"wall ms/sync (slowest rank): fresh {wall.spread('fresh').fmt(1e3)}  kept {wall.spread('kept').fmt(1e3)}"
          f"  kept/fresh {wall.ratio('kept', 'fresh').fmt(1.0, 3)}")
    print(f"CPU ms/sync (sum of ranks):  fresh {cpu.spread('fresh').fmt(1e3)}  kept {cpu.spread('kept').fmt(1e3)}"
          f"  kept/fresh {cpu.ratio('kept', 'fresh').fmt(1.0, 3)}")
    print(f"({args.rounds} rounds, both in a new shuffled order each round, {args.steps} timed sync(s) each per "
          f"round after {args.warmup} warm-up; spread = min-max over rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
