"""Time per step of an FC-layer stack for every combination of the overlap switches (OAR, ORS, OAG, ODP), on
4 and 8 local gloo ranks, with the ratio to no-overlap and the share of collective time hidden under compute.

    python experiments/bench_overlap.py                       # 4 and 8 ranks, default sizes
    python experiments/bench_overlap.py --ranks 8 --grid 2x1x2x2 --hidden 256 --trace runs/trace

"hidden" is 1 - (time blocked in wait) / (time from post to completion) summed over all collectives of the
timed steps, from the ledger's timings (synchronous collectives count as fully exposed). All ratios come from
one run: this machine's timings vary by tens of percent between runs.
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time

import torch
from torch import nn

import axgrid
from axgrid.models import MLPStack
from axgrid.testing import RankPool

COMBOS = list(itertools.product([False, True], repeat=4))   # (oar, ors, oag, odp)


def rank_bench(spec: str, hidden: int, depth: int, tokens: int, steps: int, warmup: int,
               trace_dir: str | None) -> list[dict]:
    torch.set_num_threads(1)
    out = []
    for combo in COMBOS:
        ov = axgrid.OverlapConfig(*combo)
        trace = trace_dir is not None and all(combo)
        grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=300, overlap=ov, record_timing=True,
                                                             trace=trace))
        try:
            gd, d = grid.size("d"), grid.coord.d
            model = MLPStack(hidden, depth, grid=grid, seed=0)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            x = torch.randn(tokens, hidden)
            per = tokens // gd
            times = []
            for step in range(warmup + steps):
                if step == warmup:
                    grid.ledger.reset()
                    if grid.tracer is not None:
                        grid.tracer.clear()
                grid.comm.broadcast(torch.zeros(1), "xyz")       # line the ranks up before timing a step
                t0 = time.perf_counter()
                loss = model(x[d * per:(d + 1) * per]).pow(2).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                axgrid.sync_gradients(model, grid)
                opt.step()
                if step >= warmup:
                    times.append(time.perf_counter() - t0)
            comm = [(k, e) for k, e in grid.ledger.entries.items() if k[1] != "broadcast"]
            total = sum(e.seconds for _, e in comm)
            blocked = sum(e.wait_seconds for _, e in comm)
            if grid.tracer is not None:
                os.makedirs(trace_dir, exist_ok=True)
                grid.tracer.write(os.path.join(trace_dir, "trace-{rank}.json"))
            out.append({"combo": combo, "step_s": statistics.median(times), "comm_s": total, "blocked_s": blocked})
        finally:
            grid.destroy()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--grid", default=None, help="grid for every rank count (default: 2x1x2x1 on 4, 2x1x2x2 on 8)")
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--trace", default=None, help="directory for Chrome traces of the all-on run")
    args = ap.parse_args(argv)
    defaults = {4: "2x1x2x1", 8: "2x1x2x2", 2: "1x1x2x1"}
    for n in args.ranks:
        spec = args.grid or defaults.get(n, f"1x1x{n}x1")
        with RankPool(n, timeout_s=300) as pool:
            results = pool.run(rank_bench, spec, args.hidden, args.depth, args.tokens, args.steps, args.warmup,
                               args.trace, deadline_s=3600)
        base = {r["combo"]: r for r in results[0]}[(False, False, False, False)]["step_s"]
        print(f"\n{n} ranks, grid {spec}, MLP stack hidden {args.hidden} depth {args.depth}, {args.tokens} tokens, "
              f"median of {args.steps} steps (rank 0; hidden share: mean over ranks)")
        print(f"{'OAR':>4} {'ORS':>4} {'OAG':>4} {'ODP':>4} {'step ms':>9} {'vs none':>8} {'comm ms':>9} "
              f"{'hidden':>7}")
        for i, combo in enumerate(COMBOS):
            r0 = results[0][i]
            hidden = statistics.mean(1 - r[i]["blocked_s"] / r[i]["comm_s"] if r[i]["comm_s"] else 0.0
                                     for r in results)
            flags = " ".join(f"{'on' if c else '-':>4}" for c in combo)
            print(f"{flags} {r0['step_s'] * 1e3:>9.1f} {r0['step_s'] / base:>8.2f} {r0['comm_s'] * 1e3:>9.1f} "
                  f"{hidden:>7.1%}")
    if args.trace:
        from axgrid.trace import merge_traces
        paths = sorted(os.path.join(args.trace, f) for f in os.listdir(args.trace) if f.startswith("trace-"))
        print("\nmerged trace:", merge_traces(paths, os.path.join(args.trace, "merged.json")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
