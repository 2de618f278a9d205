"""axgrid against PyTorch's own parallelism at their best, interleaved in one run on the same workload.

    python experiments/bench/bench_peers.py                                  # MLP and GPT, 4 and 8 local gloo ranks
    python experiments/bench/bench_peers.py --workload mlp --ranks 4 --hidden 512 --tokens 2048 --rounds 7
    python experiments/bench/bench_peers.py --workload gpt --ranks 8 --grid 1x2x1x4

Contenders (see ``experiments/bench/peers/``): axgrid on its best grid (the fastest of the ``--finalists`` of an
interleaved quick sweep over every grid the workload fits, or ``--grid``), on 1-D tensor parallelism
(``1xNx1x1``: Megatron's layout) and on pure data parallelism (``1x1x1xN``: DDP's layout);
PyTorch DTensor 1-D TP; DTensor 2-D TP x DP for every TP size that fits; DDP; FSDP2 (``fully_shard``). All start
from the same weights, train on the same global batch with SGD, and their losses before and after the timed
steps are printed side by side (they must agree: the same math).

Timing is ``axgrid/measure/harness.py``: warm-up excluded, every contender once per round in a shuffled order,
``--rounds`` rounds, time per step = the slowest rank's; ratios are taken within a round, then their median
and min-max over rounds is printed. Bytes per step are rank 0's (ledger convention: the all-reduced tensor, the
all-gather's output, the reduce-scatter's input): axgrid's from its ledger, PyTorch's from CommDebugMode.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import Optional, Sequence

import torch
import torch.distributed as dist

import axgrid
from axgrid.testing import RankPool
from axgrid.measure import harness

import peers                         # experiments/bench/peers/


def _barrier() -> None:
    dist.barrier()


def _slowest(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _total(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def rank_main(w: peers.Workload, a: argparse.Namespace) -> Optional[dict]:
    """Everything on one rank; rank 0 returns the report."""
    torch.set_num_threads(1)
    rank0 = dist.get_rank() == 0
    notes: list[str] = []
    log = notes.append
    world = dist.get_world_size()
    overlap = axgrid.OverlapConfig.parse(a.overlap)
    tp1d = f"1x{world}x1x1"
    # 1. the best grid: an interleaved quick sweep over every grid the workload fits; its --finalists fastest
    #    go on to the main run, where the fastest of them is "axgrid best" (as the fastest DTensor 2-D split
    #    is DTensor's best there: the same selection on both sides)
    sweep_table = None
    if a.grid:
        finalists = [a.grid]
    else:
        grids = peers.candidate_grids(w, world)
        cands = {g: peers.AxgridContender(w, g, overlap, a.timeout) for g in grids}
        res = harness.measure({g: c.step for g, c in cands.items()}, rounds=a.sweep_rounds, steps_per_round=1,
                              warmup=1, seed=a.seed + 1, barrier=_barrier).reduced(_slowest)
        finalists = sorted(grids, key=lambda g: res.spread(g).median)[: a.finalists]
        sweep_table = res.table(baseline=finalists[0])
        for c in cands.values():
            c.close()
    # 2. the contenders, all alive, the same number of steps each
    contenders = [peers.AxgridContender(w, g, overlap, a.timeout) for g in finalists]
    dp = f"1x1x1x{world}"
    for same in (tp1d, dp):            # the layouts of DTensor 1-D TP and of DDP, always measured
        if same not in {str(c.grid.shape) for c in contenders} and \
                w.grid_fits(axgrid.spec.layout.GridShape.parse(same, world)):
            contenders.append(peers.AxgridContender(w, same, overlap, a.timeout))
    contenders += peers.build_peers(w, set(a.skip), log)
    names = [c.name for c in contenders]
    before = {c.name: c.loss() for c in contenders}
    nbytes = {c.name: c.count_bytes() for c in contenders}          # one step each, untimed (also a warm-up)
    raw = harness.measure({c.name: c.step for c in contenders}, rounds=a.rounds, steps_per_round=a.steps,
                          warmup=a.warmup, seed=a.seed, barrier=_barrier, also={"cpu": time.process_time})
    res, cpu = raw.reduced(_slowest), raw.extra["cpu"].reduced(_total)
    after = {c.name: c.loss() for c in contenders}
    for c in contenders:
        c.close()
    if not rank0:
        return None
    return {"names": names, "res": res, "cpu": cpu, "before": before, "after": after, "bytes": nbytes, "notes": notes,
            "sweep": sweep_table, "tp1d": f"axgrid {tp1d}", "world": world, "steps_each": 1 + a.warmup + a.rounds * a.steps}


def report(world: int, w: peers.Workload, r: dict) -> str:
    res: harness.Result = r["res"]
    names = r["names"]
    ax = [n for n in names if n.startswith("axgrid")]
    others = [n for n in names if n not in ax]
    best = res.best(ax)
    out = [f"\n== {world} ranks, {w.describe()}"]
    if r["sweep"]:
        out += ["axgrid grid sweep (quick, interleaved):", r["sweep"], ""]
    cpu: harness.Result = r["cpu"]
    out.append(f"main run (axgrid best = {best}, the fastest axgrid grid here); wall time per step, the slowest "
               f"rank's:")
    out.append(res.table(baseline=best, width=26))
    out.append("\nthe same steps in CPU seconds, summed over all ranks (this job's work, whatever else runs on "
               "the machine):")
    out.append(cpu.table(baseline=best, width=26))
    out.append(f"\n{'contender':<26} {'bytes/step (rank 0)':>22} {'counted by':>14} {'loss before':>13} "
               f"{'loss after':>13}")
    for n in names:
        b, how = r["bytes"][n]
        out.append(f"{n:<26} {b:>22,} {how:>14} {r['before'][n]:>13.6f} {r['after'][n]:>13.6f}")
    ref = r["after"][best]
    worst = max(abs(v - ref) / max(abs(ref), 1e-12) for v in r["after"].values())
    out.append(f"(losses after {r['steps_each']} SGD steps each agree to a relative {worst:.1e}: the same math)")
    if others:
        best_peer = res.best(others)
        out.append(f"\nratios within a round, median [min-max] over {len(res.orders)} rounds:"
                   f"{'wall time':>26} {'CPU seconds':>26}")
        pairs = [(best, n, "   <- best peer" if n == best_peer else "") for n in others]
        tp = r["tp1d"]
        dt1 = next((n for n in others if n.startswith("DTensor 1D")), None)
        if tp in names and dt1:
            pairs.append((tp, dt1, "   <- same layout (1-D TP)"))
        if f"axgrid 1x1x1x{r['world']}" in names and "DDP" in names:
            pairs.append((f"axgrid 1x1x1x{r['world']}", "DDP", "   <- same layout (data parallel)"))
        for n in others:                               # DTensor 2-D TPt x DPd is axgrid's 1 x t x 1 x d
            m = re.fullmatch(r"DTensor 2D TP(\d+)xDP(\d+)", n)
            if m and f"axgrid 1x{m[1]}x1x{m[2]}" in names:
                pairs.append((f"axgrid 1x{m[1]}x1x{m[2]}", n, "   <- same layout (2-D)"))
        for x, y, tag in pairs:
            out.append(f"  {x:<24} / {y:<24} {res.ratio(x, y).fmt(1.0, 3):>26} {cpu.ratio(x, y).fmt(1.0, 3):>26}"
                       f"{tag}")
        cpu_peer = cpu.best(others)
        out.append(f"headline: {best} / the best peer = {res.ratio(best, best_peer).median:.3f} in wall time (best "
                   f"peer {best_peer}), {cpu.ratio(best, cpu_peer).median:.3f} in CPU seconds (best peer {cpu_peer})")
    for note in r["notes"]:
        out.append("note: " + note)
    return "\n".join(out)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=["mlp", "gpt", "both"], default="both")
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    peers.add_workload_args(ap)
    ap.add_argument("--grid", default=None, help="axgrid grid (default: the best of an interleaved quick sweep)")
    ap.add_argument("--overlap", default="none", help="axgrid overlap switches, e.g. 'none', 'all', 'oar,odp'")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1, help="timed steps per contender per round")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--sweep-rounds", type=int, default=2)
    ap.add_argument("--finalists", type=int, default=2, help="fastest grids of the sweep timed in the main run")
    ap.add_argument("--skip", nargs="*", default=[], choices=["dtensor1d", "dtensor2d", "ddp", "fsdp2"])
    ap.add_argument("--timeout", type=float, default=600.0)
    return ap.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    loads = [peers.workload_from_args(k, a) for k in ("mlp", "gpt") if a.workload in (k, "both")]
    print(f"bench_peers: torch {torch.__version__}, gloo, 1 thread per rank, {os.cpu_count()} CPUs", flush=True)
    for n in a.ranks:
        with RankPool(n, timeout_s=a.timeout) as pool:
            for w in loads:
                if a.grid and not w.grid_fits(axgrid.spec.layout.GridShape.parse(a.grid, n)):
                    raise SystemExit(f"--grid {a.grid} does not fit the {w.kind} workload on {n} ranks")
                r = pool.run(rank_main, w, a, deadline_s=3 * 3600)[0]
                print(report(n, w, r), flush=True)
    return 0


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "bench_peers")     # errors said once, as one line (axgrid.launch.errors)
