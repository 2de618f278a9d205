"""Fit ``kernel_latency`` and ``host_device_exponent`` of a machine file on vTrain's single-node runs (and nothing
else): price the 1,440 runs with each candidate pair and print the metrics; the pair with the lowest MAPE is the
machine file's.

    python experiments/perfmodel/fit_kernel_latency.py [--machine dgx-a100] [--from-us 50] [--to-us 75] [--step-us 1]
        [--exponents 0,2,3,4,6]        # 0: the plain maximum of the host's and the GPU's time

vTrain's multi-node runs are a held-out test: this script never reads them.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Optional, Sequence

import numpy as np

from axgrid.perfmodel import load_machine
from axgrid.perfmodel.suites import price_vtrain, suite_metrics


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="dgx-a100")
    ap.add_argument("--from-us", type=float, default=50.0)
    ap.add_argument("--to-us", type=float, default=75.0)
    ap.add_argument("--step-us", type=float, default=1.0)
    ap.add_argument("--exponents", default="0,2,3,4,6")
    a = ap.parse_args(argv)
    base = load_machine(a.machine)
    best = None
    for e in (float(x) for x in a.exponents.split(",")):
        for us in np.arange(a.from_us, a.to_us + a.step_us / 2, a.step_us):
            res = price_vtrain(machine=replace(base, kernel_latency=us * 1e-6, host_device_exponent=e))
            k = suite_metrics(res.predicted, res.measured, res.groups)
            print(f"exponent {e:g}  {us:5.1f} µs  MAPE {k['mape']:5.2f}%  ρ {k['spearman']:.3f}  regret "
                  f"{k['regret_mean']:.3f} / {k['regret_worst']:.2f}")
            if best is None or k["mape"] < best[2]:
                best = (e, us, k["mape"])
    print(f"lowest MAPE: exponent {best[0]:g}, {best[1]:g} µs ({best[2]:.2f}%)")


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "fit_kernel_latency")     # errors said once, as one line (axgrid.launch.errors)
