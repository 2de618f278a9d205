"""The dry run beside the real thing: every rank of a launched job runs the dry run's training step
(``axgrid.dryrun.step.measure_step``: the same model, batch, micro-batches, recompute, overlap and zero) on its real
process group and measures it as the dry run does (``axgrid.metrics.memtrack``, the ledger); rank 0 then runs
``python -m axgrid.dryrun`` for the first and the last rank of the same configuration and prints, per rank, whether
the ledgers are equal, the two peaks and every category that differs, then the dry run's verdict against perfmodel.
Exit 0 when the ledgers are equal and the peaks within 5%.

    axgrid launch -n 3 -- python experiments/checks/dryrun_check.py --model models/smollm2-135m \\
        --grid 1x3x1x1 --batch 4 --seq 256 --microbatches 2

Runs in fp32 (gloo's bf16 sums add fp32 copies a GPU does not make). ``--model``: a named size or a Hugging Face
config.json (or its folder), as ``python -m axgrid.dryrun`` takes it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist

PEAK_TOLERANCE = 0.05


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--grid", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--overlap", default="all")
    ap.add_argument("--zero", type=int, default=0)
    a = ap.parse_args(argv)
    import axgrid
    from axgrid.dryrun import resolve
    from axgrid.dryrun.step import measure_step, runtime_config
    torch.set_num_threads(1)
    cfg = resolve(a.model, None, a.batch, grid=a.grid, machine="local-4", dtype="fp32", recompute=a.recompute,
                  overlap=a.overlap, microbatches=a.microbatches, zero=a.zero, seq=a.seq)
    grid = axgrid.init(cfg.grid, config=runtime_config(cfg))
    m = measure_step(cfg, grid, lambda dtype: torch.autocast("cpu", dtype=dtype))
    got: list = [None] * grid.world_size
    dist.all_gather_object(got, m)
    rank, last = grid.rank, grid.world_size - 1
    grid.destroy()
    if rank != 0:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "dry.json")
        cmd = [sys.executable, "-m", "axgrid.dryrun", "--model", a.model, "--grid", cfg.grid, "--batch", str(a.batch),
               "--microbatches", str(a.microbatches), "--dtype", "fp32", "--overlap", a.overlap, "--zero",
               str(a.zero), "--machine", "local-4", "--rank", "0", "--rank", str(last), "--json", out,
               "--recompute" if a.recompute else "--no-recompute"] + (["--seq", str(a.seq)] if a.seq else [])
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if not os.path.exists(out):
            print(run.stdout[-3000:], run.stderr[-3000:])
            return 1
        with open(out) as f:
            doc = json.load(f)
        dry = {r["rank"]: r for r in doc["ranks"]}
    ok = True
    for r in sorted(dry):
        d, g = dry[r], got[r]
        ledger = {(e["dim"], e["op"]): (e["calls"], e["bytes"]) for e in d["comm"] if e["calls"]}
        same = ledger == g.comm
        ratio = d["peak_bytes"] / g.peak - 1
        differ = {k: (d["memory"][k], g.memory[k]) for k in g.memory if d["memory"][k] != g.memory[k]}
        ok &= same and abs(ratio) <= PEAK_TOLERANCE
        print(f"dryrun_check: {cfg.model.name} on {cfg.grid}, rank {r}: ledger {'equal' if same else 'DIFFERS'}; "
              f"peak dry run {d['peak_bytes']:,} B, gloo {g.peak:,} B ({ratio:+.2%}); categories "
              + (f"differing (dry run, gloo): {differ}" if differ else "all equal"))
    verdict = "agree" if doc["agree"] else f"DIFFER: {'; '.join(doc['disagreements'])}"
    print(f"dryrun_check: the dry run against perfmodel (what it models): {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "dryrun_check")     # errors said once, as one line (axgrid.launch.errors)
