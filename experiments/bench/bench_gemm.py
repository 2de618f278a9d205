"""Default vs tuned GEMM time for the per-rank shapes of GPT layers on a few grids.

CPU (default: shapes scaled down so the run takes well under 2 minutes):
    nice -n 10 python experiments/bench/bench_gemm.py
GPU, bf16, full size, TFLOP/s against a peak:
    python experiments/bench/bench_gemm.py --device cuda --dtype bf16 --scale 1 --tokens 4096 --peak-tflops 989

Each distinct signature is tuned on a fresh cache (unless --cache is given), then default and winner
are re-timed together in an independent measurement (not the tuning one, to avoid selection bias).
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

import torch

from axgrid.device import cuda as device_cuda, of
from axgrid.kernels import GemmSignature, GemmTuner, layer_gemms
from axgrid.kernels import candidates as cands
from axgrid.spec import NAMED_SIZES
from axgrid.kernels.timing import measure
from axgrid.kernels.tuner import synthetic_operands

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "GH200": 989.0, "A100": 312.0, "MI250X": 191.5, "MI300X": 1307.0}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    gpu = device_cuda.count() > 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if gpu else "cpu")
    p.add_argument("--dtype", default=None, help="default: bf16 on GPU, fp32 on CPU")
    p.add_argument("--models", default="gpt-5b,gpt-20b", help=f"comma list from {', '.join(NAMED_SIZES)}")
    p.add_argument("--grids", default="4x2x1x1,2x4x1x1,8x8x1x1,2x2x2x1", help="comma list of GXxGYxGZxGD")
    p.add_argument("--tokens", type=int, default=None, help="tokens per micro-batch (default 4096 GPU, 256 CPU)")
    p.add_argument("--scale", type=int, default=None, help="divide hidden size by this (default 1 GPU, 4 CPU)")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak for the dtype (GPU; guessed if known)")
    p.add_argument("--margin", type=float, default=0.03)
    p.add_argument("--max-tune-seconds", type=float, default=None, help="default 5 GPU, 1 CPU")
    p.add_argument("--warmup", type=int, default=None, help="default 5 GPU, 2 CPU")
    p.add_argument("--repeats", type=int, default=None, help="default 20 GPU, 7 CPU")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--cache", default=None, help="cache file (default: a fresh temporary file)")
    a = p.parse_args(argv)
    cpu = torch.device(a.device).type == "cpu"
    for name, on_cpu, on_gpu in (("dtype", "fp32", "bf16"), ("tokens", 256, 4096), ("scale", 4, 1),
                                 ("max_tune_seconds", 1.0, 5.0), ("warmup", 2, 5), ("repeats", 7, 20)):
        if getattr(a, name) is None:
            setattr(a, name, on_cpu if cpu else on_gpu)
    return a


def _peak(args: argparse.Namespace) -> float | None:
    if args.peak_tflops or torch.device(args.device).type != "cuda":
        return args.peak_tflops
    name = of(args.device).name()
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cache = args.cache or os.path.join(tempfile.mkdtemp(prefix="bench_gemm."), "gemm.json")
    tuner = GemmTuner("on-first-use", cache_path=cache, margin=args.margin, max_tune_seconds=args.max_tune_seconds,
                      warmup=args.warmup, repeats=args.repeats)
    peak = _peak(args)
    t_start, load0 = time.perf_counter(), _load()
    rows, results = [], {}
    for model in args.models.split(","):
        named = NAMED_SIZES[model]
        layers, hidden, heads = named.layers, named.hidden, named.heads
        sizes = (layers, hidden // args.scale, heads)
        for grid in args.grids.split(","):
            for g in layer_gemms(sizes, grid, args.tokens):
                rows.append((model, grid, g))
                sig = GemmSignature.make(g.m, g.n, g.k, args.dtype, device, g.role)
                if sig.key in results:
                    continue
                winner = tuner.tune(g.m, g.n, g.k, args.dtype, device, g.role, force=args.cache is None)["winner"]
                if winner == cands.DEFAULT:
                    results[sig.key] = (winner, None, None)
                    continue
                a, b = synthetic_operands(sig, device)
                fns = {name: (lambda c=cands.Candidate.parse(name): cands.run(c, a, b)) for name in (cands.DEFAULT, winner)}
                with torch.no_grad():  # 3x the tuning effort: the figure reported should be the steadier one
                    med = measure(fns, device, args.warmup, 3 * args.repeats, 3 * args.max_tune_seconds).median_s
                results[sig.key] = (winner, med[cands.DEFAULT], med[winner])

    entries = tuner.entries()
    load = f" loadavg={load0:.2f}->{_load():.2f}" if hasattr(os, "getloadavg") else ""
    print(f"device={device} ({tuner.cache.path}) dtype={args.dtype} tokens={args.tokens} hidden/{args.scale} "
          f"threads={args.threads} margin={args.margin}{load}")
    head = f"{'model':8} {'grid':8} {'layer':9} {'role':11} {'m':>6} {'n':>6} {'k':>6} {'winner':15} " \
           f"{'default ms':>10} {'tuned ms':>9} {'speedup':>7}"
    print(head + (f" {'TFLOP/s':>8} {'%peak':>6}" if device.type == "cuda" else f" {'GFLOP/s':>8}"))
    speedups, shown = [], set()
    for model, grid, g in rows:
        sig = GemmSignature.make(g.m, g.n, g.k, args.dtype, device, g.role)
        winner, t_def, t_win = results[sig.key]
        if t_def is None:  # default kept: identical code path, speedup 1 by construction
            t_def = t_win = entries[sig.key]["times_s"][cands.DEFAULT]
            mark = "="
        else:
            mark = ""
        sp = t_def / t_win
        if sig.key not in shown:
            speedups.append(sp)
            shown.add(sig.key)
        rate = sig.flops / t_win
        line = (f"{model:8} {grid:8} {g.layer:9} {g.role:11} {g.m:6d} {g.n:6d} {g.k:6d} {winner:15} "
                f"{t_def * 1e3:10.3f} {t_win * 1e3:9.3f} {sp:6.3f}{mark or ' '}")
        if device.type == "cuda":
            line += f" {rate / 1e12:8.1f} {100 * rate / (peak * 1e12):5.1f}%" if peak else f" {rate / 1e12:8.1f}      -"
        else:
            line += f" {rate / 1e9:8.1f}"
        print(line)
    geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    changed = [s for s in speedups if s != 1.0]
    print(f"\n{len(speedups)} distinct signatures, {len(changed)} with a non-default winner; "
          f"geometric-mean speedup (all) = {geo:.3f}x"
          + (f", over changed = {math.exp(sum(map(math.log, changed)) / len(changed)):.3f}x" if changed else "")
          + f"; wall {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "bench_gemm")     # errors said once, as one line (axgrid.launch.errors)
