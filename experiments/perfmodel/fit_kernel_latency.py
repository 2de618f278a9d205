"""Fit ``kernel_latency`` of a machine file on vTrain's single-node runs (and nothing else): price the 1,440 runs
with each candidate latency and print the metrics; the one with the lowest MAPE is the machine file's figure.

    python experiments/perfmodel/fit_kernel_latency.py [--machine dgx-a100] [--from-us 50] [--to-us 75] [--step-us 1]

vTrain's multi-node runs are a held-out test: this script never reads them.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from axgrid.perfmodel import load_machine
from axgrid.perfmodel.suites import price_vtrain, suite_metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="dgx-a100")
    ap.add_argument("--from-us", type=float, default=50.0)
    ap.add_argument("--to-us", type=float, default=75.0)
    ap.add_argument("--step-us", type=float, default=1.0)
    a = ap.parse_args()
    base = load_machine(a.machine)
    best = None
    for us in np.arange(a.from_us, a.to_us + a.step_us / 2, a.step_us):
        res = price_vtrain(machine=replace(base, kernel_latency=us * 1e-6))
        k = suite_metrics(res.predicted, res.measured, res.groups)
        print(f"{us:5.1f} µs  MAPE {k['mape']:5.2f}%  ρ {k['spearman']:.3f}  regret {k['regret_mean']:.3f} / "
              f"{k['regret_worst']:.2f}")
        if best is None or k["mape"] < best[1]:
            best = (us, k["mape"])
    print(f"lowest MAPE: {best[0]:g} µs ({best[1]:.2f}%)")


if __name__ == "__main__":
    main()
