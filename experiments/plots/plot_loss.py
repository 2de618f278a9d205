"""Draw a metrics log's loss curve as a PNG: the training loss of every step, its mean over the last ``--window``
steps, and the held-out loss of its ``eval`` rows (train_gpt, finetune, or any driver's ``--log``).

    python experiments/plots/plot_loss.py runs/sft.jsonl runs/sft_loss.png --title "SmolLM2-135M, SFT on 4 ranks"
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Optional, Sequence


def read_rows(path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``step`` and ``eval`` rows of the JSON-lines log ``path``; SystemExit when it holds no step row."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise SystemExit(f"{path}:{n}: not a JSON line; pass a metrics log written with --log") from None
    steps = [r for r in rows if isinstance(r, dict) and r.get("event") == "step"]
    if not steps:
        raise SystemExit(f"{path} holds no step rows; pass a metrics log written with --log")
    return steps, [r for r in rows if isinstance(r, dict) and r.get("event") == "eval"]


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("out")
    ap.add_argument("--window", type=int, default=5, help="steps in the running mean")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    steps, evals = read_rows(args.log)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    x, y = [r["step"] + 1 for r in steps], [r["loss"] for r in steps]
    w = max(1, args.window)
    mean = [sum(y[max(0, i - w + 1): i + 1]) / len(y[max(0, i - w + 1): i + 1]) for i in range(len(y))]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(x, y, ".", color="tab:gray", label="training loss of each step")
    ax.plot(x, mean, "-", color="tab:blue", label=f"mean of the last {w} steps")
    if evals:
        ax.plot([e["step"] for e in evals], [e["valid_loss"] for e in evals], "o--", color="tab:red",
                label="held-out loss")
    ax.set(xlabel="optimizer steps done", ylabel="cross entropy (nats/token)", title=args.title or args.log)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    plt.close(fig)
    return args.out


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "plot_loss")     # errors said once, as one line (axgrid.launch.errors)
