"""Context parallelism on CPU ranks: one long sequence's training step under a per-rank memory budget, its memory
per rank against the context-parallel size, and the share of the context-parallel transfers hidden behind compute.

    axgrid launch -n 1 -- python experiments/bench/bench_context_parallel.py --cp 1 --budget-mib 40
    axgrid launch -n 2 -- python experiments/bench/bench_context_parallel.py --cp 2 --budget-mib 40
    axgrid launch -n 4 -- python experiments/bench/bench_context_parallel.py --cp 4 --budget-mib 40

The GPT (``--layers/--hidden/--heads/--vocab``, fp32) on grid ``1x1xCPx1`` with ``axgrid.init(..., cp=CP)``: the
z-ranks are one context-parallel group, so one sequence of ``--seq`` tokens is split into ``2·CP`` chunks, two per
rank (and the weights over z, as AxoNN shards them). One warm-up step (AdamW's state exists from then on), then a
measured step of two micro-batches of one sequence each. Memory: the peak of live tensor bytes on each rank
(:class:`axgrid.metrics.memtrack.LiveBytes`, parameters, gradients and optimizer state included), the largest
rank's. The budget: a rank whose live bytes would pass ``--budget-mib`` stops at that allocation with a one-line
error naming it (the step does not fit); 0: no budget. Beside it, perfmodel's memory of the same step
(``memory_per_gpu`` with ``S/CP`` tokens per rank, Gz = CP and ``Options(cp=CP, cp_exchange=...)``: the stored
bytes, the activations with context parallelism's attention (``perfmodel.context_parallel``) and the backward's
transients, on ``CPU_GLOO``). Transfers: the ledger's seconds of dimension ``c`` from post
to completion and the part of them a rank waited (``RuntimeConfig.record_timing``); hidden share = 1 − waited /
seconds. One JSON line on rank 0 (``--out FILE`` appends it there too).
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any, Optional

import torch

from axgrid.metrics.memtrack import BudgetedLiveBytes, BudgetExceeded


def measure(cp: int, seq: int, layers: int, hidden: int, heads: int, vocab: int, exchange: str,
            budget: int, timeout: float) -> dict[str, Any]:
    """The measured step's figures (see the module docstring), the same dict on every rank."""
    import axgrid
    from axgrid.metrics import memtrack
    from axgrid.models import GPT, GPTConfig
    from axgrid.perfmodel import Options
    from axgrid.perfmodel.memory import CPU_GLOO, memory_per_gpu
    from axgrid.spec import TransformerShape
    from axgrid.train import train_step
    torch.set_num_threads(1)
    grid = axgrid.init(f"1x1x{cp}x1", cp=cp, config=axgrid.RuntimeConfig(timeout_s=timeout, seed=0,
                                                                          record_timing=True))
    try:
        spec = TransformerShape("cp-bench", layers, hidden, heads, seq=seq, vocab=vocab)
        model = GPT(GPTConfig(spec, cp_exchange=exchange), grid)
        grid.watch(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        gen = torch.Generator().manual_seed(0)
        data = [torch.randint(0, vocab, (1, seq + 1), generator=gen) for _ in range(2)]

        def loss_of(i: int) -> torch.Tensor:
            return model(data[i][:, :-1], data[i][:, 1:], normalizer=float(2 * seq))

        warm = train_step(model, opt, loss_of, grid, microbatches=2, accumulate="sum")
        live = BudgetedLiveBytes(memtrack.optimizer_tensors(opt), budget)
        live.track(model.parameters())
        live.track(p.grad for p in model.parameters())
        before = grid.ledger.snapshot()
        error = None
        t0 = time.perf_counter()
        try:
            with live:
                out = train_step(model, opt, loss_of, grid, microbatches=2, accumulate="sum")
        except BudgetExceeded as e:
            error, out = str(e), None
        step_s = time.perf_counter() - t0
        seconds = waited = 0.0
        nbytes = 0
        for key, e in grid.ledger.entries.items():
            if key[0] == "c":
                b = before.get(key)
                seconds += e.seconds - (b.seconds if b else 0.0)
                waited += e.wait_seconds - (b.wait_seconds if b else 0.0)
                nbytes += e.bytes - (b.bytes if b else 0)
        if grid.world_size > 1 and error is None:        # the largest rank's peak; the mean rank's transfer times
            v = grid.comm.all_gather(torch.tensor([float(live.peak), seconds, waited]), "z").view(-1, 3)
            peak, seconds, waited = int(v[:, 0].max()), float(v[:, 1].mean()), float(v[:, 2].mean())
        else:
            peak = live.peak
        mem = memory_per_gpu(spec, 1, 1, cp, 1, seq // cp, 4, True, Options(recompute=False, cp=cp, cp_exchange=exchange),
                             device=CPU_GLOO)
        return {"cp": cp, "seq": seq, "layers": layers, "hidden": hidden, "heads": heads, "vocab": vocab,
                "exchange": exchange, "budget_bytes": budget, "fits": error is None, "error": error,
                "peak_bytes": peak if error is None else None, "expected_bytes": int(mem.total),
                "expected_activation_bytes": int(mem.activations), "expected_static_bytes": int(mem.static),
                "loss_warm": float(warm.loss), "loss": float(out.loss) if out is not None else None,
                "step_s": step_s, "c_bytes": nbytes, "c_seconds": seconds, "c_waited_s": waited,
                "c_hidden_share": (1.0 - waited / seconds) if seconds > 0 else None, "rank": grid.rank}
    finally:
        grid.destroy()


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cp", type=int, default=1, help="context-parallel size = ranks (grid 1x1xCPx1)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--exchange", choices=("ring", "all_gather"), default="ring")
    ap.add_argument("--budget-mib", type=float, default=0.0, help="live tensor bytes a rank may hold (0: no budget)")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--out", default=None, help="append the JSON line to this file too")
    a = ap.parse_args(argv)
    if a.cp < 1 or a.seq % (2 * a.cp):
        raise SystemExit(f"--seq {a.seq} with --cp {a.cp}: the sequence must cut into 2·cp = {2 * a.cp} chunks")
    row = measure(a.cp, a.seq, a.layers, a.hidden, a.heads, a.vocab, a.exchange, int(a.budget_mib * 2**20),
                  a.timeout)
    if row.pop("rank") == 0:
        line = json.dumps(row)
        print(line, flush=True)
        if a.out:
            with open(a.out, "a", encoding="utf-8") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "bench_context_parallel")     # errors said once, as one line (axgrid.launch.errors)
