"""Measure this machine on real ranks for the performance model; writes the JSON ``perfmodel`` reads.

    # collectives + GEMMs -> samples that `perfmodel calibrate` fits into a machine file
    axgrid launch -n 4 -- python experiments/measure_runtime.py collectives --out runs/calibration.json
    python -m axgrid.perfmodel calibrate --samples runs/calibration.json --out perfmodel/machines/local.toml

    # seconds per training step of the configurations `perfmodel validate` compares with its predictions
    axgrid launch -n 4 -- python experiments/measure_runtime.py steps --model gpt-tiny --gpus 4 --machine local-4 \\
        --batch 8 --dtype fp32 --top 4 --sample 4 --out runs/steps.json
    python -m axgrid.perfmodel validate --model gpt-tiny --gpus 4 --machine local-4 --batch 8 --dtype fp32 \\
        --measured runs/steps.json

``collectives``: every collective the grid posts (all-reduce, all-gather, reduce-scatter) over each (group
size, stride) a grid of this many ranks can have, all groups of a dimension busy at once, each rep started
together (barrier), the slowest rank's time per rep, the median over reps; and torch GEMMs ``[m,k]·[k,n]`` on
every rank at once, one thread per rank, timed as the throughput of a window (each rank's fair share of the
cores, as in training). JSON: {"comm": [{"op", "group_size", "stride", "bytes" (the ledger's: AR tensor / AG
output / RS input), "seconds", "concurrent": 1}], "gemm": [{"m", "n", "k", "seconds", "dtype"}], "nranks"}.

``steps``: the configurations ``perfmodel validate`` would pick (its ranking's top ``--top`` plus ``--sample``
drawn at random, seeded) trained with the project's GPT (``axgrid.models.gpt.GPT``) and ``axgrid.train.train_step``
under the problem's overlaps, recompute and bucket size; each configuration runs ``--warmup`` untimed then
``--steps`` timed steps, in ``--rounds`` interleaved passes, the fastest pass kept; each step is timed by
``axgrid.metrics.StepMeter`` (the slowest rank's), a pass's figure is the mean over its timed steps.
JSON: {"problem": the problem's sizes and options, "configs": [{"grid", "microbatches", "seconds",
"predicted_s", "tflops" (per rank), "peak_mem_bytes" (largest over ranks)}], "workload", "steps", "warmup", "rounds",
"wall_s"}.

Ranks use gloo on the CPU, one thread each. Rank 0 writes the file. Also callable in-process on every rank of an
already-initialised default group: ``main(argv)`` (tests run it on an ``axgrid.testing.RankPool``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import axgrid  # noqa: E402
from axgrid import perfmodel as pm  # noqa: E402
from axgrid.models.gpt import GPT, GPTConfig  # noqa: E402
from axgrid.metrics import StepMeter, summarize  # noqa: E402
from axgrid.train import train_step  # noqa: E402
from axgrid.perfmodel import calibrate as pm_calibrate  # noqa: E402
from axgrid.perfmodel import cli as pm_cli  # noqa: E402
from axgrid.perfmodel import validate as pm_validate  # noqa: E402

OPS = ("all_reduce", "all_gather", "reduce_scatter")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
WORKLOAD = "axgrid.models.gpt.GPT + axgrid.train.train_step"


# ------------------------------------------------------------------------------------------ collectives + GEMMs


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
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=timeout_s, record_timing=True))
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


def _gather(value: Any) -> list[Any]:
    """``value`` of every rank, on every rank (rank order)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
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


# ------------------------------------------------------------------------------------------ step timing


def rank_step_metrics(model_spec: dict[str, Any], grid_spec: str, batch: int, dtype: str, microbatches: int,
                      overlap: str, recompute: bool, bucket_bytes: int, steps: int, warmup: int,
                      timeout_s: float) -> dict[str, Any]:
    """On one rank: build the grid and the GPT, train ``warmup + steps`` steps of ``batch`` random sequences in
    ``microbatches`` micro-batches (``train_step``: all but the last under ``grid.no_sync()``), each timed by
    ``axgrid.metrics.StepMeter`` (the slowest rank's seconds, the same on every rank); return the summary of the
    timed steps (``axgrid.metrics.summarize``: ``step_s``, ``tflops``, ``peak_mem_bytes``...). Low precision runs as
    train_gpt runs it: fp32 parameters under autocast."""
    cfg = axgrid.RuntimeConfig(timeout_s=timeout_s, overlap=axgrid.OverlapConfig.parse(overlap), seed=0,
                               bucket_bytes=bucket_bytes)
    grid = axgrid.init(grid_spec, config=cfg)
    try:
        gz, gd = grid.size("z"), grid.size("d")
        per_rank = batch // microbatches // gd            # sequences of this data-parallel rank per micro-batch
        if batch % (microbatches * gd) or per_rank % gz:
            raise ValueError(f"batch {batch} in {microbatches} micro-batches does not split into whole sequences "
                             f"over Gd={gd} and Gz={gz} (grid {grid_spec})")
        gpt = GPTConfig(recompute=recompute, **model_spec)
        model = GPT(gpt, grid)
        grid.watch(model)                                 # ODP covers every parameter, as in train_gpt
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)
        gen = torch.Generator().manual_seed(1000 + grid.index("d"))
        ids = [torch.randint(0, model_spec["vocab"], (per_rank, model_spec["seq"] + 1), generator=gen)
               for _ in range(microbatches)]
        low = DTYPES[dtype] if dtype != "fp32" else None

        def loss_of(i: int) -> torch.Tensor:
            with torch.autocast("cpu", dtype=low or torch.float32, enabled=low is not None):
                return model(ids[i][:, :-1], targets=ids[i][:, 1:])

        meter = StepMeter(grid, flops_per_step=gpt.flops_per_iteration(batch), tokens_per_step=batch * gpt.seq,
                          dtype=dtype)
        rows = []
        for step in range(warmup + steps):
            meter.begin()
            train_step(model, opt, loss_of, grid, microbatches)
            rows.append(meter.end(step))
        meter.close()
        return summarize(rows, skip=warmup)
    finally:
        grid.destroy()


def measure_steps(a: argparse.Namespace) -> dict[str, Any]:
    """Seconds per step of the configurations ``perfmodel validate`` picks for this problem (module docstring)."""
    problem, machine = pm_cli.problem_from_args(a)
    if problem.gpus != dist.get_world_size():
        raise ValueError(f"--gpus {problem.gpus} but this job has {dist.get_world_size()} ranks; run it under "
                         f"`axgrid launch -n {problem.gpus}`")
    rk = pm.rank(problem, machine)
    rows = pm_validate.select_configs(rk, a.top, a.sample, a.seed)
    if not rows:
        raise ValueError(f"no feasible configuration of {problem.model.name} on {problem.gpus} ranks to time")
    spec = problem.model
    model_spec = {"layers": spec.layers, "hidden": spec.hidden, "heads": spec.heads, "seq": spec.seq,
                  "vocab": spec.vocab, "bias": spec.bias}
    opts = problem.options
    rank0 = dist.get_rank() == 0
    if rank0:
        print(f"timing {len(rows)} of {len(rk.feasible)} feasible configurations x {a.rounds} rounds ({a.warmup} "
              f"warm-up + {a.steps} timed steps each); workload: {WORKLOAD}; overlap {opts.overlap_spec()}, "
              f"recompute {opts.recompute}, buckets {opts.bucket_bytes / 2**20:g} MiB", flush=True)
    t_start = time.perf_counter()
    best = [float("inf")] * len(rows)
    figures: list[dict[str, Any]] = [{} for _ in rows]
    for _ in range(a.rounds):
        for i, r in enumerate(rows):
            got = rank_step_metrics(model_spec, r.grid_str, problem.batch, problem.dtype, int(r.microbatches),
                                    opts.overlap_spec(), opts.recompute, opts.bucket_bytes, a.steps, a.warmup,
                                    a.timeout)
            if got["step_s"] < best[i]:
                best[i], figures[i] = got["step_s"], got
            if rank0:
                print(f"  {r.grid_str}: {got['step_s'] * 1e3:.1f} ms/step (predicted {r.time_s * 1e3:.1f}), "
                      f"{got['tflops'] * 1e3:.2f} GFLOP/s per rank, peak {got['peak_mem_bytes'] / 2**20:.0f} MiB",
                      flush=True)
    return {"problem": pm_validate.problem_meta(problem), "workload": WORKLOAD, "steps": a.steps,
            "warmup": a.warmup, "rounds": a.rounds, "wall_s": time.perf_counter() - t_start,
            "configs": [{"grid": r.grid_str, "microbatches": int(r.microbatches), "seconds": s,
                         "predicted_s": float(r.time_s), "tflops": f["tflops"], "peak_mem_bytes": f["peak_mem_bytes"]}
                        for r, s, f in zip(rows, best, figures)]}


# ------------------------------------------------------------------------------------------ command line


def _ints(text: str) -> list[int]:
    try:
        return [int(float(v)) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"expected a comma-separated list of integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="measure_runtime.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collectives", help="collective and GEMM samples for `perfmodel calibrate --samples`")
    c.add_argument("--sizes", default="1024,8192,65536,524288,4194304",
                   help="collective buffer sizes in bytes, comma-separated")
    c.add_argument("--ops", default=",".join(OPS), help="collectives to time, comma-separated")
    c.add_argument("--gemm-cubes", default="32,64,128,256,512", help="m=n=k of square GEMMs to time")
    c.add_argument("--model", help="also time this named model's GEMM shapes on the grids of this many ranks")
    c.add_argument("--batch", type=int, default=8, help="global batch for --model's GEMM shapes")
    c.add_argument("--gemm-dtype", default="fp32", choices=list(DTYPES))
    c.add_argument("--gemm-min-time", type=float, default=0.05, help="seconds of each GEMM's timing window")
    c.add_argument("--reps", type=int, default=5, help="timed repetitions per collective")
    c.add_argument("--warmup", type=int, default=2, help="untimed repetitions per collective")
    s = sub.add_parser("steps", help="seconds per step for `perfmodel validate --measured`")
    pm_cli.add_problem_args(s)
    s.add_argument("--top", type=int, default=8, help="the ranking's best configurations to time")
    s.add_argument("--sample", type=int, default=8, help="more configurations drawn at random from the rest")
    s.add_argument("--seed", type=int, default=0, help="seed of the random draw")
    s.add_argument("--steps", type=int, default=3, help="timed steps per configuration")
    s.add_argument("--warmup", type=int, default=1, help="untimed steps per configuration")
    s.add_argument("--rounds", type=int, default=2, help="interleaved passes over the configurations; best kept")
    for p in (c, s):
        p.add_argument("--out", required=True, help="JSON file to write (rank 0)")
        p.add_argument("--timeout", type=float, default=120.0, help="seconds before a stuck collective fails")
    return ap


def _check(a: argparse.Namespace) -> None:
    """Refuse bad options (the same on every rank, before any collective); fills a.sizes, a.ops, a.shapes."""
    if not a.timeout > 0:
        raise ValueError(f"--timeout must be > 0, got {a.timeout}")
    if a.cmd == "collectives":
        a.sizes, a.ops = _ints(a.sizes), [o.strip() for o in a.ops.split(",") if o.strip()]
        if not a.sizes or min(a.sizes) < 4:
            raise ValueError(f"--sizes must be integers >= 4 bytes, got {a.sizes}")
        bad = [o for o in a.ops if o not in OPS]
        if bad or not a.ops:
            raise ValueError(f"--ops {bad or a.ops}: choose from {', '.join(OPS)}")
        if a.reps < 1 or a.warmup < 0 or not a.gemm_min_time > 0:
            raise ValueError(f"need --reps >= 1, --warmup >= 0, --gemm-min-time > 0 (got {a.reps}, {a.warmup}, "
                             f"{a.gemm_min_time})")
        shapes = {(v, v, v) for v in _ints(a.gemm_cubes)}
        if a.model:
            shapes |= set(pm_calibrate.model_gemm_shapes(pm.get_model(a.model), a.batch, dist.get_world_size()))
        if any(min(shp) < 1 for shp in shapes):
            raise ValueError(f"--gemm-cubes must be positive, got {a.gemm_cubes!r}")
        a.shapes = sorted(shapes, key=lambda t: (t[0] * t[1] * t[2], t))
    elif a.steps < 1 or a.warmup < 0 or a.rounds < 1 or a.top < 0 or a.sample < 0:
        raise ValueError(f"need --steps >= 1, --warmup >= 0, --rounds >= 1, --top/--sample >= 0 (got {a.steps}, "
                         f"{a.warmup}, {a.rounds}, {a.top}, {a.sample})")


def _init_world(timeout_s: float) -> bool:
    """Join the job's default gloo group unless one exists (in-process callers); True when this call made it."""
    if dist.is_initialized():
        return False
    from axgrid.launch.env import detect_launch, init_distributed
    init_distributed(detect_launch(), "gloo", timeout_s)
    return True


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Measure, write ``--out`` on rank 0, return the document (every rank)."""
    a = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    owns = _init_world(a.timeout)
    try:
        try:
            _check(a)
            doc = measure_collectives(a) if a.cmd == "collectives" else measure_steps(a)
        except (ValueError, pm.PerfModelError) as e:
            raise SystemExit(f"measure_runtime {a.cmd}: {e}") from None
        doc["produced_by"] = "experiments/measure_runtime.py " + " ".join(argv if argv is not None else sys.argv[1:])
        if dist.get_rank() == 0:
            out = Path(a.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(out.suffix + ".tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, out)
            print(f"wrote {out}", flush=True)
        return doc
    finally:
        if owns:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
