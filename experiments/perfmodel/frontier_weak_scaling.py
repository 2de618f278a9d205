"""AxoNN's Frontier weak-scaling series (SC24, arXiv 2502.08145) from perfmodel, beside the published one.

    python experiments/perfmodel/frontier_weak_scaling.py [--machine frontier]

GPT 5B on 512 MI250X GCDs to 320B on 32,768 (the model doubling with the GCDs), one sequence per GCD, bf16,
sequence 2048, each point on perfmodel's best 4D grid (``axgrid.perfmodel.weak_scaling``). Prints per point the
grid, the predicted TFLOP/s per GCD and the weak-scaling efficiency against the 512-GCD point, the published
efficiency and the TFLOP/s per GCD it implies where the paper's text gives them, and the exposed communication
by grid dimension (where the predicted falloff comes from).
"""
from __future__ import annotations

import argparse

from axgrid.perfmodel.weak_scaling import SOURCE, predict


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="frontier", help="machine file (default frontier)")
    a = ap.parse_args(argv)
    print(f"{'GCDs':>6} {'model':9} {'grid':12} {'TFLOP/s':>8} {'eff':>6} {'pub eff':>8} {'pub TF/s':>9}  "
          f"exposed communication (s of the step)")
    for p in predict(a.machine):
        r = p.row
        pub = "" if p.published_efficiency is None else f"{100 * p.published_efficiency:.1f}%"
        pubtf = "" if p.published_tflops is None else f"{p.published_tflops:.1f}"
        exposed = ", ".join(f"{k} {v:.2f}" for k, v in r.exposed_s.items() if v >= 0.005)
        print(f"{p.gcds:>6} {p.model:9} {r.grid_str:12} {p.tflops:8.1f} {100 * p.efficiency:5.1f}% {pub:>8} "
              f"{pubtf:>9}  step {r.time_s:.2f} s, compute {r.compute_s:.2f}; {exposed}")
    print(f"published: {SOURCE}; TFLOP/s implied = 41.1% of 191.5 (the 512-GCD run) x the efficiency")


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "frontier_weak_scaling")
