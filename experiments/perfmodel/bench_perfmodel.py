"""Benchmark: rank every grid configuration of a 1-trillion-parameter GPT on 65,536 GPUs (goal: < 1 s).

    python experiments/perfmodel/bench_perfmodel.py [--model gpt-1t] [--gpus 65536] [--machine frontier] [--batch 16384]

Prints the number of configurations, the best one, and the wall time of ``perfmodel.rank`` (best of --repeat).
"""
from __future__ import annotations

import argparse
import time

from axgrid import perfmodel as pm


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-1t")
    ap.add_argument("--gpus", type=int, default=65536)
    ap.add_argument("--machine", default="frontier")
    ap.add_argument("--batch", type=int, default=16384)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    prob = pm.Problem(pm.get_model(a.model), a.batch, a.gpus)
    machine = pm.load_machine(a.machine)
    times = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        rk = pm.rank(prob, machine)
        times.append(time.perf_counter() - t0)
    best = rk.best
    print(f"{a.model} ({prob.model.params / 1e12:.2f}T params) on {a.gpus} {machine.name} GPUs, batch {a.batch}: "
          f"{len(rk.rows)} configurations ({len(rk.feasible)} feasible) ranked in {min(times) * 1e3:.1f} ms "
          f"(best of {a.repeat}; all: {', '.join(f'{t * 1e3:.1f}' for t in times)} ms)")
    print(f"best grid {best.grid_str}: {best.time_s:.2f} s/batch, {best.tflops_per_gpu:.1f} TFLOP/s/GPU "
          f"({best.pct_peak:.1f}% of peak), {best.memory_bytes / 2**30:.1f} GiB/GPU, {best.microbatches} micro-batches")


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "bench_perfmodel")     # errors said once, as one line (axgrid.launch.errors)
