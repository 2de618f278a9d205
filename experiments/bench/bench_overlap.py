"""Time per step of an FC-layer stack for every combination of the overlap switches (OAR, ORS, OAG, ODP), on
4 and 8 local gloo ranks, with the ratio to no-overlap and the share of collective time hidden under compute.

    python experiments/bench/bench_overlap.py                       # 4 and 8 ranks, default sizes
    python experiments/bench/bench_overlap.py --ranks 8 --grid 2x1x2x2 --hidden 256 --trace runs/trace

All 16 combinations are built side by side and timed by ``axgrid/measure/harness.py``: warm-up excluded, every
combination once per round in a new shuffled order, the ratio to "none" taken within each round, median and
min-max over rounds printed (the time per step is the slowest rank's). "hidden" is 1 - (time blocked in wait) /
(time from post to completion) summed over all collectives of the timed steps, from the ledger's timings
(synchronous collectives count as fully exposed).
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

import torch
import torch.distributed as dist

import axgrid
from axgrid.models import MLPStack
from axgrid.testing import RankPool
from axgrid.train import train_step
from axgrid.measure import harness

from peers import side_grid          # experiments/bench/peers/

COMBOS = list(itertools.product([False, True], repeat=4))   # (oar, ors, oag, odp)


def rank_bench(spec: str, hidden: int, depth: int, tokens: int, rounds: int, steps: int, warmup: int,
               trace_dir: str | None, seed: int) -> dict:
    """All 16 combinations alive side by side, timed interleaved by the harness; this rank's ledger timings."""
    torch.set_num_threads(1)
    runs = {}
    for combo in COMBOS:
        trace = trace_dir is not None and all(combo)
        grid = side_grid(spec, axgrid.OverlapConfig(*combo), 300, record_timing=True, trace=trace)
        gd, d = grid.size("d"), grid.coord.d
        model = MLPStack(hidden, depth, grid=grid, seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        per = tokens // gd
        x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(0))[d * per:(d + 1) * per]

        def step(model=model, opt=opt, grid=grid, x=x) -> None:
            train_step(model, opt, lambda _: model(x).pow(2).mean(), grid)

        runs[combo] = (grid, step)

    def start_timing(r: int, order: list[str]) -> None:
        if r == 0:                                   # warm-up done: count only the timed steps
            for grid, _ in runs.values():
                grid.ledger.reset()
                if grid.runtime.tracer is not None:
                    grid.runtime.tracer.clear()

    res = harness.measure({label(c): s for c, (_, s) in runs.items()}, rounds=rounds, steps_per_round=steps,
                          warmup=warmup, seed=seed, barrier=dist.barrier, on_round=start_timing)
    res = res.reduced(_slowest)
    comm = {}
    for combo, (grid, _) in runs.items():
        es = list(grid.ledger.entries.values())
        comm[label(combo)] = (sum(e.seconds for e in es), sum(e.wait_seconds for e in es))
        if grid.runtime.tracer is not None:
            os.makedirs(trace_dir, exist_ok=True)
            grid.runtime.tracer.write(os.path.join(trace_dir, "trace-{rank}.json"))
        grid.destroy()
    return {"res": res, "comm": comm}


def _slowest(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def label(combo: tuple[bool, ...]) -> str:
    return "+".join(n for n, on in zip(("OAR", "ORS", "OAG", "ODP"), combo) if on) or "none"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--grid", default=None, help="grid for every rank count (default: 2x1x2x1 on 4, 2x1x2x2 on 8)")
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per combination per round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="seed of the shuffled orders")
    ap.add_argument("--trace", default=None, help="directory for Chrome traces of the all-on run")
    args = ap.parse_args(argv)
    defaults = {4: "2x1x2x1", 8: "2x1x2x2", 2: "1x1x2x1"}
    for n in args.ranks:
        spec = args.grid or defaults.get(n, f"1x1x{n}x1")
        with RankPool(n, timeout_s=300) as pool:
            results = pool.run(rank_bench, spec, args.hidden, args.depth, args.tokens, args.rounds, args.steps,
                               args.warmup, args.trace, args.seed, deadline_s=3600)
        res: harness.Result = results[0]["res"]
        print(f"\n{n} ranks, grid {spec}, MLP stack hidden {args.hidden} depth {args.depth}, {args.tokens} tokens; "
              f"time per step = slowest rank; 'hidden' = share of collective time not blocked on (mean over ranks)")
        print(f"{'OAR':>4} {'ORS':>4} {'OAG':>4} {'ODP':>4} {'ms/step median [min-max]':>26} "
              f"{'÷ none, per round':>22} {'comm ms/step':>13} {'hidden':>7}")
        timed = args.rounds * args.steps
        for combo in COMBOS:
            name = label(combo)
            hid = statistics.mean(1 - r["comm"][name][1] / r["comm"][name][0] if r["comm"][name][0] else 0.0
                                  for r in results)
            flags = " ".join(f"{'on' if c else '-':>4}" for c in combo)
            print(f"{flags} {res.spread(name).fmt(1e3):>26} {res.ratio(name, 'none').fmt(1.0, 3):>22} "
                  f"{results[0]['comm'][name][0] / timed * 1e3:>13.1f} {hid:>7.1%}")
        print(f"({args.rounds} rounds, the 16 combinations in a new shuffled order each round, {args.steps} timed "
              f"step(s) each per round after {args.warmup} warm-up step(s); spread = min-max over rounds)")
    if args.trace:
        from axgrid.metrics.trace import merge_traces
        paths = sorted(os.path.join(args.trace, f) for f in os.listdir(args.trace) if f.startswith("trace-"))
        print("\nmerged trace:", merge_traces(paths, os.path.join(args.trace, "merged.json")))
    return 0


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "bench_overlap")     # errors said once, as one line (axgrid.launch.errors)
