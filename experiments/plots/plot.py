"""Plots of sweep CSVs (experiments/train/sweep.py): weak scaling and grid sweeps, as small PNGs.

    python experiments/plots/plot.py experiments/results/grid_gpt-tiny_4.csv [more.csv ...] --out-dir experiments/results

- weak-scaling rows (mode "weak"): ``weak_scaling.png`` -- time per batch vs GPUs and TFLOP/s per GPU vs GPUs,
  each point labelled with its model and grid;
- grid-sweep rows (mode "grid"): ``grid_<model>_<gpus>.png`` per model and GPU count -- time per batch per grid
  (fastest first; the perf model's prediction as a marker when the CSV has it) and the bytes per optimizer
  step per grid dimension (stacked).
Rows whose status is not "ok" are left out (and counted in the title).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from collections import defaultdict
from typing import Any, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DIM_COLORS = {"x": "#4c72b0", "y": "#dd8452", "z": "#55a868", "d": "#c44e52", "other": "#8c8c8c"}


def read_rows(paths: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for p in paths:
        with open(p, newline="") as f:
            rows += list(csv.DictReader(f))
    return rows


def _num(v: Any) -> Optional[float]:
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return None


def plot_weak(rows: list[dict[str, Any]], out: str) -> Optional[str]:
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: int(r["gpus"]))
    if not ok:
        return None
    g = [int(r["gpus"]) for r in ok]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=90)
    a1.plot(g, [float(r["time_per_batch_s"]) for r in ok], "o-", color="#4c72b0")
    a2.plot(g, [float(r["tflops_per_device"]) for r in ok], "o-", color="#55a868", label="per GPU")
    for r, x in zip(ok, g):
        a1.annotate(f"{r['model']}\n{r['grid']}", (x, float(r["time_per_batch_s"])), fontsize=7,
                    textcoords="offset points", xytext=(4, 4))
    for ax, yl in ((a1, "time per batch (s)"), (a2, "TFLOP/s per GPU")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(g, [str(x) for x in g])
        ax.set_xlabel("GPUs (ranks)")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
    a1.set_ylim(bottom=0)
    a2.set_ylim(bottom=0)
    skipped = len(rows) - len(ok)
    fig.suptitle("weak scaling (model grows with GPUs)" + (f"; {skipped} run(s) not ok" if skipped else ""),
                 fontsize=10)
    fig.tight_layout()
    path = os.path.join(out, "weak_scaling.png")
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_grid(rows: list[dict[str, Any]], out: str, model: str, gpus: int) -> Optional[str]:
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: float(r["time_per_batch_s"]))
    if not ok:
        return None
    grids = [r["grid"] for r in ok]
    xs = range(len(ok))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=90)
    t = [float(r["time_per_batch_s"]) for r in ok]
    a1.bar(xs, t, color="#4c72b0", label="measured")
    pred = [_num(r.get("predicted_s")) for r in ok]
    if any(p is not None for p in pred):
        a1.plot([x for x, p in zip(xs, pred) if p is not None], [p for p in pred if p is not None], "D",
                color="#c44e52", markersize=5, label="perf model")
        a1.legend(fontsize=8)
    a1.set_ylabel("time per batch (s)")
    bottom = [0.0] * len(ok)
    for d in ("x", "y", "z", "d", "other"):
        vals = [(_num(r.get(f"bytes_{d}")) or 0.0) / 2**20 for r in ok]
        if any(vals):
            a2.bar(xs, vals, bottom=bottom, color=DIM_COLORS[d], label=d)
            bottom = [b + v for b, v in zip(bottom, vals)]
    a2.set_ylabel("MiB per step (rank 0 ledger)")
    a2.legend(fontsize=8, title="dim", title_fontsize=8)
    for ax in (a1, a2):
        ax.set_xticks(list(xs), grids, rotation=45, ha="right", fontsize=8)
        ax.set_xlabel("grid Gx x Gy x Gz x Gd")
        ax.grid(axis="y", alpha=0.3)
    skipped = len(rows) - len(ok)
    fig.suptitle(f"grid sweep: {model} on {gpus} ranks, fastest first"
                 + (f" ({skipped} grid(s) skipped or failed)" if skipped else ""), fontsize=10)
    fig.tight_layout()
    path = os.path.join(out, f"grid_{model}_{gpus}.png")
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="CSV files written by experiments/train/sweep.py")
    ap.add_argument("--out-dir", default="experiments/results")
    a = ap.parse_args(argv)
    rows = read_rows(a.csv)
    os.makedirs(a.out_dir, exist_ok=True)
    written = []
    weak = [r for r in rows if r["mode"] == "weak"]
    if weak:
        written.append(plot_weak(weak, a.out_dir))
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["mode"] == "grid":
            groups[(r["model"], int(r["gpus"]))].append(r)
    for (model, gpus), rs in sorted(groups.items()):
        written.append(plot_grid(rs, a.out_dir, model, gpus))
    for p in written:
        if p:
            print(f"wrote {p}")
    if not any(written):
        print("plot: no successful runs in the CSV(s); nothing plotted", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "plot")     # errors said once, as one line (axgrid.launch.errors)
