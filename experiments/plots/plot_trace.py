"""Draw a Chrome trace written by axgrid (``RuntimeConfig(trace=True)``, ``grid.runtime.tracer.write``) as a PNG timeline:
one row per rank and track (compute, comm in flight, blocked in wait), so overlap can be seen without a browser.

    python experiments/plots/plot_trace.py runs/trace/merged.json runs/trace/timeline.png [--last-ms 200]
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--last-ms", type=float, default=None, help="show only the last N milliseconds")
    args = ap.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = json.load(open(args.trace))["traceEvents"]
    t0 = min(e["ts"] for e in events)
    t1 = max(e["ts"] + e["dur"] for e in events)
    if args.last_ms:
        t0 = max(t0, t1 - args.last_ms * 1e3)
    tracks = ["compute", "comm", "wait"]
    colors = {"compute": "tab:blue", "comm": "tab:orange", "wait": "tab:red"}
    ranks = sorted({e["pid"] for e in events})
    fig, ax = plt.subplots(figsize=(12, 0.6 + 0.45 * len(ranks) * len(tracks)))
    labels = []
    for i, (r, tr) in enumerate((r, tr) for r in ranks for tr in tracks):
        spans = [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in events
                 if e["pid"] == r and e["cat"] == tr and e["ts"] + e["dur"] >= t0]
        ax.broken_barh(spans, (i - 0.4, 0.8), color=colors[tr])
        labels.append(f"rank {r} {tr}")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title("compute (blue), collectives in flight (orange), blocked in wait (red)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(args.out)
    return 0


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "plot_trace")     # errors said once, as one line (axgrid.launch.errors)
