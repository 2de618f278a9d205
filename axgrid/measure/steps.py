"""Seconds per training step of the configurations ``perfmodel validate`` would pick (its ranking's top ``--top``
plus ``--sample`` drawn at random, seeded), trained with the project's GPT (``axgrid.models.gpt.GPT``) and
``axgrid.train.train_step`` under the problem's overlaps, recompute and bucket size; each configuration runs
``--warmup`` untimed then ``--steps`` timed steps, in ``--rounds`` interleaved passes, the fastest pass kept; each
step is timed by ``axgrid.metrics.StepMeter`` (the slowest rank's), a pass's figure is the mean over its timed
steps. JSON: {"problem": the problem's sizes and options, "configs": [{"grid", "microbatches", "seconds",
"predicted_s", "tflops" (per rank), "peak_mem_bytes" (largest over ranks)}], "workload", "steps", "warmup",
"rounds", "wall_s"}.
"""
from __future__ import annotations

import time
import argparse
from typing import Any

import torch
import torch.distributed as dist

from ..core.config import OverlapConfig, RuntimeConfig
from ..core.runtime import init
from .. import perfmodel as pm
from ..metrics import StepMeter, summarize
from ..models.gpt import GPT, GPTConfig
from ..spec import TransformerShape
from ..perfmodel import cli as pm_cli
from ..perfmodel import validate as pm_validate
from ..train import train_step
from .collectives import DTYPES

WORKLOAD = "axgrid.models.gpt.GPT + axgrid.train.train_step"


def rank_step_metrics(shape: TransformerShape, grid_spec: str, batch: int, dtype: str, microbatches: int,
                      overlap: str, recompute: bool, bucket_bytes: int, steps: int, warmup: int,
                      timeout_s: float) -> dict[str, Any]:
    """On one rank: build the grid and the GPT, train ``warmup + steps`` steps of ``batch`` random sequences in
    ``microbatches`` micro-batches (``train_step``: all but the last under ``grid.no_sync()``), each timed by
    ``axgrid.metrics.StepMeter`` (the slowest rank's seconds, the same on every rank); return the summary of the
    timed steps (``axgrid.metrics.summarize``: ``step_s``, ``tflops``, ``peak_mem_bytes``...). Low precision runs as
    train_gpt runs it: fp32 parameters under autocast."""
    cfg = RuntimeConfig(timeout_s=timeout_s, overlap=OverlapConfig.parse(overlap), seed=0,
                               bucket_bytes=bucket_bytes)
    grid = init(grid_spec, config=cfg)
    try:
        gz, gd = grid.size("z"), grid.size("d")
        per_rank = batch // microbatches // gd            # sequences of this data-parallel rank per micro-batch
        if batch % (microbatches * gd) or per_rank % gz:
            raise ValueError(f"batch {batch} in {microbatches} micro-batches does not split into whole sequences "
                             f"over Gd={gd} and Gz={gz} (grid {grid_spec})")
        gpt = GPTConfig(shape, recompute=recompute)
        model = GPT(gpt, grid)
        grid.watch(model)                                 # ODP covers every parameter, as in train_gpt
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)
        gen = torch.Generator().manual_seed(1000 + grid.index("d"))
        ids = [torch.randint(0, shape.vocab, (per_rank, shape.seq + 1), generator=gen)
               for _ in range(microbatches)]
        low = DTYPES[dtype] if dtype != "fp32" else None

        def loss_of(i: int) -> torch.Tensor:
            with torch.autocast("cpu", dtype=low or torch.float32, enabled=low is not None):
                return model(ids[i][:, :-1], targets=ids[i][:, 1:])

        meter = StepMeter(grid, flops_per_step=gpt.flops_per_iteration(batch), tokens_per_step=batch * shape.seq,
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
            got = rank_step_metrics(problem.model, r.grid_str, problem.batch, problem.dtype, int(r.microbatches),
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
