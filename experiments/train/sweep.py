"""Sweeps of ``experiments/train/train_gpt.py`` collected into one CSV: weak scaling, and every grid for a fixed model.

    # every grid of gpt-tiny on 4 local ranks (each run started by `axgrid launch -n 4 -- python train_gpt.py ...`)
    python experiments/train/sweep.py grid --model gpt-tiny --gpus 4 --steps 6 --out experiments/results/grid.csv
    # only the perf model's top 5 (python -m axgrid.perfmodel rank ... --csv) for a machine, printed as srun commands
    python experiments/train/sweep.py grid --model gpt-20b --gpus 256 --batch 512 --top-k 5 --machine perlmutter --dry-run
    # weak scaling: the model grows with the GPU count (tiny CPU table, or the AxoNN GPT table on a machine)
    python experiments/train/sweep.py weak --table cpu --gpus 1,2,4,8 --out experiments/results/weak.csv
    python experiments/train/sweep.py weak --table gpu --gpus 64,128,256,512 --machine frontier --dry-run

Launchers (``--launcher``): ``axgrid`` (default; ``axgrid launch -n N --`` per run), ``srun`` (prints or runs ``srun -n N ...`` per run, for use inside an allocation). ``--dry-run`` prints the
commands and writes nothing.

CSV columns (one row per run, appended as runs finish): mode, model, parameters, gpus, grid, batch, seq, steps,
time_per_batch_s (mean after the warm-up step), tflops_per_device, tflops_total, tokens_per_s, bytes_x, bytes_y,
bytes_z, bytes_d, bytes_other (ledger bytes per optimizer step per grid dimension on rank 0; "other" is the
xy / xyz groups of norms and loss logging), final_loss, predicted_s (perf model, when --machine is given),
status ("ok", "skipped: ...", "failed: ...").

Weak-scaling tables (parameters grow ~linearly with GPUs at a fixed global batch, so work per GPU stays level):
  cpu: 1 -> 2 layers, hidden 32, 4 heads; 2 -> hidden 48; 4 -> hidden 64 (gpt-tiny); 8 -> hidden 96, 8 heads;
       16 -> hidden 128, 8 heads (seq 64, vocab 256, ffn 4h).
  gpu: 64 -> gpt-5b, 128 -> gpt-10b, 256 -> gpt-20b, 512 -> gpt-40b, 1024 -> gpt-80b, 2048 -> gpt-160b,
       4096 -> gpt-320b, 8192 -> gpt-640b (the AxoNN papers' GPT sizes; the GPU count per size is our
       choice: parameters double as GPUs double).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from axgrid.spec.layout import GridShape, all_shapes

ROOT = Path(__file__).resolve().parents[2]
TRAIN = Path(__file__).resolve().parent / "train_gpt.py"

COLUMNS = ["mode", "model", "parameters", "gpus", "grid", "batch", "seq", "steps", "time_per_batch_s",
           "tflops_per_device", "tflops_total", "tokens_per_s", "bytes_x", "bytes_y", "bytes_z", "bytes_d",
           "bytes_other", "final_loss", "predicted_s", "status"]


@dataclass(frozen=True)
class ModelSize:
    """What train_gpt needs to build the model: a named size plus overrides."""

    label: str
    base: str                      # a key of axgrid.spec.NAMED_SIZES
    layers: Optional[int] = None
    hidden: Optional[int] = None
    heads: Optional[int] = None

    def dims(self) -> tuple[int, int, int, int, int]:
        """layers, hidden, heads, seq, vocab."""
        from axgrid.spec import NAMED_SIZES
        s = NAMED_SIZES[self.base]
        return (self.layers or s.layers, self.hidden or s.hidden, self.heads or s.heads, s.seq, s.vocab)

    def train_args(self) -> list[str]:
        out = ["--model", self.base]
        for flag, v in (("--layers", self.layers), ("--hidden", self.hidden), ("--heads", self.heads)):
            if v is not None:
                out += [flag, str(v)]
        return out

    def parameters(self) -> int:
        from axgrid.spec import TransformerShape
        over = {k: v for k, v in (("layers", self.layers), ("hidden", self.hidden), ("heads", self.heads)) if v}
        return TransformerShape.named(self.base, **over).params


WEAK_TABLES: dict[str, dict[int, ModelSize]] = {
    "cpu": {1: ModelSize("tiny-h32", "gpt-tiny", hidden=32), 2: ModelSize("tiny-h48", "gpt-tiny", hidden=48),
            4: ModelSize("gpt-tiny", "gpt-tiny"), 8: ModelSize("tiny-h96", "gpt-tiny", hidden=96, heads=8),
            16: ModelSize("tiny-h128", "gpt-tiny", hidden=128, heads=8)},
    "gpu": {64: ModelSize("gpt-5b", "gpt-5b"), 128: ModelSize("gpt-10b", "gpt-10b"),
            256: ModelSize("gpt-20b", "gpt-20b"), 512: ModelSize("gpt-40b", "gpt-40b"),
            1024: ModelSize("gpt-80b", "gpt-80b"), 2048: ModelSize("gpt-160b", "gpt-160b"),
            4096: ModelSize("gpt-320b", "gpt-320b"), 8192: ModelSize("gpt-640b", "gpt-640b")},
}


# ---------------------------------------------------------------------------------------------------------
# which grids
# ---------------------------------------------------------------------------------------------------------
def grid_problem(size: ModelSize, shape: GridShape, batch: int, microbatches: int) -> Optional[str]:
    """Why ``size`` cannot run on ``shape`` (None when it can): the same rules train_gpt checks."""
    layers, h, heads, _, vocab = size.dims()
    ffn = 4 * h
    for what, value, g, dim in (("hidden", h, shape.gx, "x"), ("hidden", h, shape.gy, "y"),
                                ("heads", heads, shape.gy, "y"), ("ffn", ffn, shape.gx, "x"),
                                ("ffn", ffn, shape.gy, "y"), ("vocab", vocab, shape.gy, "y")):
        if value % g:
            return f"{what}={value} not divisible by G{dim}={g}"
    if batch % microbatches or (batch // microbatches) % (shape.gd * shape.gz):
        return f"micro-batch of {batch // max(1, microbatches)} sequences not divisible by Gd*Gz={shape.gd * shape.gz}"
    return None


def perfmodel_ranking(size: ModelSize, gpus: int, batch: int, machine: str, dtype: str,
                      recompute: bool) -> list[dict[str, str]]:
    """``python -m axgrid.perfmodel rank ... --csv`` rows (feasible first, best first); [] when it fails."""
    layers, h, heads, seq, vocab = size.dims()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank.csv")
        cmd = [sys.executable, "-m", "axgrid.perfmodel", "rank", "--layers", str(layers), "--hidden", str(h), "--heads",
               str(heads), "--seq", str(seq), "--vocab", str(vocab), "--gpus", str(gpus), "--machine", machine,
               "--batch", str(batch), "--dtype", dtype, "--top", "1", "--csv", out,
               *([] if recompute else ["--no-recompute"])]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if res.returncode != 0 or not os.path.exists(out):
            print(f"sweep: perfmodel rank failed ({res.stderr.strip()[-300:]}); no ranking", file=sys.stderr)
            return []
        with open(out) as f:
            rows = list(csv.DictReader(f))
    return [r for r in rows if r["feasible"] == "True" and r.get("layout", "4D") == "4D"]   # the runtime runs 4D only


# ---------------------------------------------------------------------------------------------------------
# running one configuration
# ---------------------------------------------------------------------------------------------------------
def train_argv(size: ModelSize, shape: GridShape, a: argparse.Namespace, log: str, microbatches: int) -> list[str]:
    return [*size.train_args(), "--grid", str(shape), "--batch", str(a.batch), "--microbatches",
            str(microbatches), "--steps", str(a.steps), "--data", a.data, "--log", log, "--no-progress",
            "--timing-skip", "1", *(["--overlap", a.overlap] if a.overlap != "none" else []),
            *(["--recompute"] if a.recompute else []), *shlex.split(a.train_args or "")]


class Runner:
    """Starts runs with the chosen launcher and returns train_gpt's summary record."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a

    def command(self, gpus: int, argv: list[str]) -> list[str]:
        a = self.a
        if a.launcher == "srun":
            py = a.python or "python"
            per_node = a.gpus_per_node
            nodes = max(1, math.ceil(gpus / per_node))
            return ["srun", "-N", str(nodes), "-n", str(gpus), f"--ntasks-per-node={min(gpus, per_node)}",
                    f"--gpus-per-node={min(gpus, per_node)}", "--cpu-bind=closest", py,
                    str(TRAIN.relative_to(ROOT)), *argv]
        py = a.python or sys.executable
        return [py, "-m", "axgrid.cli", "launch", "-n", str(gpus), "--timeout", str(a.run_timeout), "--", py,
                str(TRAIN), *argv]

    def run(self, gpus: int, argv: list[str], log: str) -> dict[str, Any]:
        cmd = self.command(gpus, argv)
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if res.returncode != 0:
            tail = [ln for ln in (res.stdout + res.stderr).strip().splitlines() if ln.strip()][-1:]
            raise RuntimeError(f"exit code {res.returncode}: {tail[0] if tail else ''}")
        with open(log) as f:
            summaries = [json.loads(ln) for ln in f if '"summary"' in ln]
        if not summaries:
            raise RuntimeError(f"no summary record in {log}")
        return summaries[-1]


def row_of(mode: str, size: ModelSize, gpus: int, shape: GridShape, a: argparse.Namespace,
           summary: Optional[dict[str, Any]], status: str, predicted: Optional[float]) -> dict[str, Any]:
    _, _, _, seq, _ = size.dims()
    row: dict[str, Any] = {"mode": mode, "model": size.label, "parameters": size.parameters(), "gpus": gpus,
                           "grid": str(shape), "batch": a.batch, "seq": seq, "steps": a.steps, "status": status,
                           "predicted_s": predicted}
    if summary:
        comm = summary.get("comm_bytes") or {}             # train_gpt's summary: axgrid.metrics.summarize
        row.update(time_per_batch_s=summary["step_s"], tflops_per_device=summary["tflops"],
                   tflops_total=summary["tflops"] * gpus, tokens_per_s=summary["tokens_per_s"],
                   final_loss=summary["final_loss"],
                   **{f"bytes_{d}": int(comm.get(d, 0)) for d in "xyzd"},
                   bytes_other=int(sum(v for k, v in comm.items() if k not in ("x", "y", "z", "d"))))
    return row


def sweep(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Run (or print) every configuration of the sweep; append each row to ``a.out``."""
    plan: list[tuple[ModelSize, int, GridShape, Optional[float], Optional[str], int]] = []
    mb_of: dict[tuple[int, str], int] = {}   # (gpus, grid) -> micro-batches the perf model chose
    if a.mode == "grid":
        size = ModelSize(a.model, a.model)
        for gpus in a.gpus:
            shapes = sorted(all_shapes(gpus), key=lambda s: s.as_tuple())
            predicted: dict[str, float] = {}
            if a.machine:
                ranking = perfmodel_ranking(size, gpus, a.batch, a.machine, a.dtype, a.recompute)
                predicted = {r["grid"]: float(r["time_s"]) for r in ranking}
                mb_of.update({(gpus, r["grid"]): int(r["microbatches"]) for r in ranking})
                if a.top_k:
                    order = [r["grid"] for r in ranking][: a.top_k]
                    shapes = [GridShape.parse(g) for g in order]
            for s in shapes:
                mb = a.microbatches or mb_of.get((gpus, str(s)), 1)
                plan.append((size, gpus, s, predicted.get(str(s)), grid_problem(size, s, a.batch, mb), mb))
    else:
        table = WEAK_TABLES[a.table]
        for gpus in a.gpus:
            if gpus not in table:
                raise SystemExit(f"--table {a.table} has no model for {gpus} GPUs; it has {sorted(table)}")
            size = table[gpus]
            chosen: list[tuple[GridShape, Optional[float]]] = []
            if a.grid_policy == "perfmodel" and a.machine:
                ranking = perfmodel_ranking(size, gpus, a.batch, a.machine, a.dtype, a.recompute)
                if ranking:
                    chosen = [(GridShape.parse(ranking[0]["grid"]), float(ranking[0]["time_s"]))]
                    mb_of[(gpus, ranking[0]["grid"])] = int(ranking[0]["microbatches"])
            if not chosen:
                ok = [s for s in all_shapes(gpus) if grid_problem(size, s, a.batch, a.microbatches or 1) is None]
                if a.grid_policy == "dp" or not ok:
                    chosen = [(GridShape(1, 1, 1, gpus), None)]
                else:   # no ranking: the largest tensor-parallel block, x before y before z (a plain heuristic)
                    best = max(ok, key=lambda s: (s.gx * s.gy * s.gz, s.gx, s.gy))
                    chosen = [(best, None)]
            for s, pred in chosen:
                mb = a.microbatches or mb_of.get((gpus, str(s)), 1)
                plan.append((size, gpus, s, pred, grid_problem(size, s, a.batch, mb), mb))

    runner = Runner(a)
    rows: list[dict[str, Any]] = []
    if not a.dry_run and a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        new = not os.path.exists(a.out) or not a.append
        f = open(a.out, "w" if new else "a", newline="")
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
    else:
        f, writer = None, None
    try:
        for size, gpus, shape, pred, problem, mb in plan:
            with tempfile.TemporaryDirectory() as tmp:
                log = os.path.join(a.log_dir or ("runs/sweep" if a.dry_run else tmp), f"{size.label}_{gpus}_{shape}.jsonl")
                argv = train_argv(size, shape, a, log, mb)
                if a.dry_run:
                    note = f"   # skipped: {problem}" if problem else ""
                    print(" ".join(shlex.quote(c) for c in runner.command(gpus, argv)) + note)
                    continue
                if problem:
                    row = row_of(a.mode, size, gpus, shape, a, None, f"skipped: {problem}", pred)
                else:
                    t0 = time.perf_counter()
                    try:
                        summary = runner.run(gpus, argv, log)
                        row = row_of(a.mode, size, gpus, shape, a, summary, "ok", pred)
                    except RuntimeError as e:
                        row = row_of(a.mode, size, gpus, shape, a, None, f"failed: {e}"[:300], pred)
                    print(f"sweep: {size.label} on {gpus} ranks, grid {shape}: {row['status']}"
                          + (f", {row['time_per_batch_s']:.3f} s/batch, {row['tokens_per_s']:.0f} tokens/s"
                             if row["status"] == "ok" else "") + f" [{time.perf_counter() - t0:.0f} s wall]",
                          flush=True)
                rows.append(row)
                if writer is not None:
                    writer.writerow(row)
                    f.flush()
    finally:
        if f is not None:
            f.close()
    return rows


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("grid", "weak"), help="grid: every grid of one model; weak: weak scaling")
    ap.add_argument("--model", default="gpt-tiny", help="grid mode: the named model size")
    ap.add_argument("--table", choices=sorted(WEAK_TABLES), default="cpu", help="weak mode: size table")
    ap.add_argument("--gpus", default="4", help="comma-separated rank counts, e.g. 1,2,4,8")
    ap.add_argument("--batch", type=int, default=8, help="global batch in sequences")
    ap.add_argument("--microbatches", type=int, default=0,
                    help="gradient-accumulation micro-batches (default: the perf model's choice, else 1)")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per run (the first is warm-up)")
    ap.add_argument("--data", choices=("synthetic", "text"), default="synthetic")
    ap.add_argument("--overlap", default="none")
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--train-args", default="", help="more train_gpt.py arguments, as one string")
    ap.add_argument("--machine", default=None, help="perf-model machine (name or .toml): predicted times, top-k")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="dtype for the perf model")
    ap.add_argument("--top-k", type=int, default=0, help="grid mode: run only the perf model's top K grids")
    ap.add_argument("--grid-policy", choices=("perfmodel", "largest-tp", "dp"), default="perfmodel",
                    help="weak mode: the grid of each run (perfmodel needs --machine; else largest-tp)")
    ap.add_argument("--launcher", choices=("axgrid", "srun"), default="axgrid")
    ap.add_argument("--gpus-per-node", type=int, default=4, help="srun: tasks (GPUs) per node")
    ap.add_argument("--python", default=None, help="interpreter for the ranks (default: this one)")
    ap.add_argument("--run-timeout", type=float, default=900.0, help="seconds before one run is ended")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--out", default="experiments/results/sweep.csv", help="the CSV (one row per run)")
    ap.add_argument("--append", action="store_true", help="append to --out instead of replacing it")
    ap.add_argument("--log-dir", default=None, help="keep every run's JSON-lines log here")
    a = ap.parse_args(argv)
    try:
        a.gpus = [int(g) for g in str(a.gpus).split(",") if g.strip()]
    except ValueError:
        raise SystemExit(f"--gpus {a.gpus!r}: give comma-separated integers, e.g. 1,2,4,8") from None
    if a.log_dir:
        os.makedirs(a.log_dir, exist_ok=True)
    return a


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    rows = sweep(a)
    if a.dry_run:
        return 0
    ok = [r for r in rows if r["status"] == "ok"]
    print(f"sweep: {len(ok)} of {len(rows)} runs ok; CSV {a.out}")
    if ok:
        best = min(ok, key=lambda r: r["time_per_batch_s"])
        print(f"sweep: fastest {best['model']} on {best['gpus']} ranks: grid {best['grid']}, "
              f"{best['time_per_batch_s']:.3f} s/batch")
    return 0 if ok or not rows else 1


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "sweep")     # errors said once, as one line (axgrid.launch.errors)
