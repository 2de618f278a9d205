"""One comparison across runs from their metrics logs (``axgrid.metrics`` JSON lines: train_gpt ``--log``, or
any driver that writes the same record): a table as Markdown and CSV, and PNG plots.

    python experiments/plots/report.py runs/a.jsonl runs/b.jsonl ... --out experiments/results/report

Writes to ``--out``: ``report.md`` and ``report.csv`` (one row per log: machine, device, grid, model, batch,
tokens/s, TFLOP/s per device, MFU, peak memory, J/token, the last validation loss and perplexity (``eval`` rows of a
run with ``--eval-interval``; n/a without), and the step time split below), ``throughput.png``
(tokens/s and J/token per configuration) and ``step_split.png`` (time per step: compute and the exposed
communication of each grid dimension, stacked; a run without ``--comm-timing`` has no split and is drawn whole).
A run's figures are recomputed from its step rows with :func:`axgrid.metrics.summarize` (the first ``--skip``
steps are warm-up), so a log cut short by a failure still reports. "Compute" is the step time minus the exposed
(blocked) communication of rank 0: everything that is not waiting for a collective.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
from typing import Any, Optional, Sequence

from axgrid.metrics import summarize

COLUMNS = ("run", "machine", "device", "grid", "world", "model", "batch", "dtype", "step_s", "tokens_per_s",
           "tflops", "mfu", "peak_mem_gib", "j_per_token", "valid_loss", "valid_ppl", "compute_s", "exposed_x_s", "exposed_y_s", "exposed_z_s",
           "exposed_d_s", "exposed_other_s", "energy_source")
#: one column per grid dimension; groups of several letters (the tensor-parallel block "xyz", "xy": the gradient
#: norm, the loss) go to "other"
DIM_COLORS = {"x": "#4c72b0", "y": "#dd8452", "z": "#55a868", "d": "#c44e52", "other": "#8172b2"}


def read_log(path: str, evals: Optional[list[dict[str, Any]]] = None
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The first config row and every step row of a JSON-lines metrics log (its eval rows appended to ``evals``)."""
    config: Optional[dict[str, Any]] = None
    steps: list[dict[str, Any]] = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not a JSON line ({e}); pass the --log files of axgrid runs") from None
            if row.get("event") == "config" and config is None:
                config = row
            elif row.get("event") == "step":
                steps.append(row)
            elif row.get("event") == "eval" and evals is not None:
                evals.append(row)
    if config is None or not steps:
        raise SystemExit(f"{path}: no config row or no step rows: not an axgrid metrics log (train_gpt --log)")
    return config, steps


def run_row(path: str, skip: int) -> dict[str, Any]:
    """The report's row of one log."""
    evals: list[dict[str, Any]] = []
    config, steps = read_log(path, evals)
    s = summarize(steps, skip)
    exposed = s["comm_exposed_s"]
    row = {"run": os.path.splitext(os.path.basename(path))[0], "machine": config.get("machine", config.get("host")),
           "device": config.get("device"), "grid": config.get("grid"), "world": config.get("world"),
           "model": config.get("model"), "batch": config.get("batch"), "dtype": config.get("dtype"),
           "step_s": s["step_s"], "tokens_per_s": s["tokens_per_s"], "tflops": s["tflops"], "mfu": s["mfu"],
           "peak_mem_gib": s["peak_mem_bytes"] / 2**30,
           "j_per_token": 1.0 / s["tokens_per_j"] if s["tokens_per_j"] else None,
           "valid_loss": evals[-1].get("valid_loss") if evals else None,
           "valid_ppl": evals[-1].get("valid_ppl") if evals else None,
           "compute_s": s["step_s"] - sum(exposed.values()) if exposed is not None else None,
           "energy_source": s["energy_source"]}
    for d in DIM_COLORS:
        row[f"exposed_{d}_s"] = None if exposed is None else \
            (exposed.get(d, 0.0) if d != "other" else sum(v for k, v in exposed.items() if k not in DIM_COLORS))
    return row


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The table as Markdown (the energy source below it, once per distinct source)."""
    cols = [("run", "run"), ("machine", "machine"), ("device", "device"), ("grid", "grid"), ("model", "model"),
            ("batch", "batch"), ("tokens_per_s", "tokens/s"), ("tflops", "TFLOP/s/device"), ("mfu", "MFU"),
            ("peak_mem_gib", "peak mem GiB"), ("j_per_token", "J/token"), ("valid_loss", "valid loss"),
            ("valid_ppl", "valid ppl"), ("step_s", "s/step"),
            ("compute_s", "compute s")] + [(f"exposed_{d}_s", f"exposed {d} s") for d in DIM_COLORS]
    out = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_fmt(r[k]) for k, _ in cols) + " |" for r in rows]
    sources = sorted({r["energy_source"] for r in rows})
    out += ["", *[f"Energy: {s}" for s in sources]]
    return "\n".join(out) + "\n"


def label(r: dict[str, Any]) -> str:
    return f"{r['model']} {r['grid']} b{r['batch']}"


def plot(rows: Sequence[dict[str, Any]], out: str) -> list[str]:
    """throughput.png and step_split.png under ``out``; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [label(r) for r in rows]
    pos = list(range(len(rows)))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    a1.bar(pos, [r["tokens_per_s"] or 0 for r in rows], color="#4c72b0")
    a1.set_ylabel("tokens/s")
    a1.set_title("throughput")
    jpt = [r["j_per_token"] for r in rows]
    a2.bar(pos, [j or 0 for j in jpt], color="#55a868")
    if all(j is None for j in jpt):
        a2.set_yticks([])
        a2.text(0.5, 0.5, "no energy source in these runs", ha="center", va="center", transform=a2.transAxes)
    for i, j in enumerate(jpt):
        if j is None and not all(v is None for v in jpt):
            a2.text(i, 0, "n/a", ha="center", va="bottom", fontsize=7)
    a2.set_ylabel("J/token")
    a2.set_title("energy per token")
    for a in (a1, a2):
        a.set_xticks(pos, names, fontsize=7, rotation=30, ha="right")
    fig.tight_layout()
    paths = [os.path.join(out, "throughput.png"), os.path.join(out, "step_split.png")]
    fig.savefig(paths[0], dpi=80)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    seen: set[str] = set()

    def bar(i: int, ms: float, bottom: float, name: str, **style: Any) -> None:
        ax.bar(i, ms, bottom=bottom, label=None if name in seen else name, **style)
        seen.add(name)

    for i, r in enumerate(rows):
        if r["compute_s"] is None:
            bar(i, r["step_s"] * 1e3, 0.0, "not split (no --comm-timing)", color="#cccccc", hatch="//")
            continue
        bottom = max(r["compute_s"], 0.0) * 1e3
        bar(i, bottom, 0.0, "compute", color="#8c8c8c")
        for d, c in DIM_COLORS.items():
            h = r[f"exposed_{d}_s"] * 1e3
            if h > 0:
                bar(i, h, bottom, f"exposed {d}", color=c)
                bottom += h
    ax.set_xticks(pos, names, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("ms per step")
    ax.set_title("time per step: compute and exposed communication")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=80)
    plt.close(fig)
    return paths


def main(argv: Optional[Sequence[str]] = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", help="metrics logs (JSON lines)")
    ap.add_argument("--out", required=True, help="directory for report.md, report.csv and the PNGs")
    ap.add_argument("--skip", type=int, default=1, help="warm-up steps of each run left out")
    a = ap.parse_args(list(argv) if argv is not None else None)
    rows = [run_row(p, a.skip) for p in a.logs]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(markdown(rows))
    with open(os.path.join(a.out, "report.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    for p in plot(rows, a.out):
        print(f"report: wrote {p}")
    print(markdown(rows), end="")
    return rows


if __name__ == "__main__":
    main()
