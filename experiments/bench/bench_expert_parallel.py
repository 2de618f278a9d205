"""Expert parallelism on CPU ranks: a mixture of experts that does not fit one rank's memory budget replicated
(every rank holding every expert, ep 1) and trains with its experts spread over the ranks (ep 4).

    axgrid launch -n 4 -- python experiments/bench/bench_expert_parallel.py --ep 1 --budget-mib 8
    axgrid launch -n 4 -- python experiments/bench/bench_expert_parallel.py --ep 4 --budget-mib 8

A Mixtral config (``--layers``, ``--hidden``, ``--experts`` of ``--ffn`` units each, top-``--top-k``, vocabulary
``--vocab``, fp32) built with no dense copy on grid ``1x1x1x4`` with ``axgrid.init(..., ep=EP)``
(:func:`axgrid.plans.causal_lm.causal_lm_from_config`, the initial weights of seed 0): each rank holds ``E/EP``
experts of each layer. Every step is one sequence of ``--seq`` tokens per d-rank (random ids), the model's loss,
backward, ``sync_gradients`` and torch's AdamW. The budget: from the first step on, every live tensor on a rank
(parameters, gradients, AdamW's two moments, activations) counts (:class:`axgrid.metrics.memtrack.BudgetedLiveBytes`);
a rank whose live bytes would pass ``--budget-mib`` stops at that allocation with a one-line error naming it (the
step does not fit). With AdamW the experts cost 16 bytes per weight (weight, gradient, two moments), so the
replicated model passes a budget that its ``1/EP`` share fits. One JSON line on rank 0: per rank the parameter bytes
(all; the experts'), the peak of live bytes (the largest rank's), whether it fits, the losses of the ``--steps``
steps (``--out FILE`` appends it there too).
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Optional

import torch

from axgrid.metrics.memtrack import BudgetedLiveBytes, BudgetExceeded


def mixtral_config(layers: int, hidden: int, experts: int, ffn: int, top_k: int, vocab: int, seq: int) -> dict:
    """The fields of the benchmark's Mixtral ``config.json`` (4 heads, 2 key/value heads, no router jitter)."""
    return {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": vocab,
            "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_local_experts": experts, "num_experts_per_tok": top_k,
            "max_position_embeddings": seq, "router_jitter_noise": 0.0, "tie_word_embeddings": False}


def measure(ep: int, layers: int, hidden: int, experts: int, ffn: int, top_k: int, vocab: int, seq: int, steps: int,
            budget: int, timeout: float) -> dict[str, Any]:
    """The run's figures (see the module docstring), the same dict on every rank."""
    import axgrid
    from axgrid.metrics import memtrack
    from axgrid.plans.causal_lm import causal_lm_from_config
    torch.set_num_threads(1)
    grid = axgrid.init("1x1x1x4", ep=ep, config=axgrid.RuntimeConfig(timeout_s=timeout, seed=0))
    try:
        model = causal_lm_from_config(mixtral_config(layers, hidden, experts, ffn, top_k, vocab, seq), grid)
        params = list(model.parameters())
        opt = torch.optim.AdamW(params, lr=3e-3, foreach=False)
        gen = torch.Generator().manual_seed(grid.index("d"))
        live = BudgetedLiveBytes((), budget)
        losses: list[float] = []
        error = None
        try:
            for step in range(steps):
                ids = torch.randint(0, vocab, (1, seq), generator=gen)
                with live:
                    live.track(params)
                    live.track(p.grad for p in params)
                    live.track(memtrack.optimizer_tensors(opt))
                    loss = model(input_ids=ids, labels=ids).loss
                    loss.backward()
                    axgrid.sync_gradients(model, grid)
                    opt.step()
                    opt.zero_grad(set_to_none=False)
                    live.track(memtrack.optimizer_tensors(opt))    # AdamW's moments, made by its first step
                    live.track(p.grad for p in params)
                losses.append(float(loss.detach()))
        except BudgetExceeded as e:
            error = str(e)
        fits = torch.tensor([0.0 if error else 1.0, float(live.peak)])
        if error is None:          # the ranks that fit agree on the largest peak (a rank that stopped posts nothing)
            v = grid.comm.all_gather(fits, "d").view(-1, 2)
            peak = int(v[:, 1].max())
        else:
            peak = None
        return {"ep": ep, "layers": layers, "hidden": hidden, "experts": experts, "ffn": ffn, "top_k": top_k,
                "vocab": vocab, "seq": seq, "budget_bytes": budget, "fits": error is None, "error": error,
                "param_bytes": sum(p.numel() * p.element_size() for p in params),
                "expert_param_bytes": sum(p.numel() * p.element_size() for p in params
                                          if getattr(p, "axgrid_expert", False)),
                "peak_bytes": peak, "losses": losses, "rank": grid.rank}
    finally:
        grid.destroy()


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ep", type=int, default=1, help="expert-parallel size (1, 2 or 4; grid 1x1x1x4)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=256, help="each expert's intermediate size")
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget-mib", type=float, default=0.0, help="live tensor bytes a rank may hold (0: no budget)")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--out", default=None, help="append the JSON line to this file too")
    a = ap.parse_args(argv)
    if a.ep not in (1, 2, 4) or a.experts % a.ep or not 1 <= a.top_k <= a.experts:
        raise SystemExit(f"--ep {a.ep}, --experts {a.experts}, --top-k {a.top_k}: ep must be 1, 2 or 4 (grid "
                         f"1x1x1x4) and divide the experts, top-k in 1..experts")
    row = measure(a.ep, a.layers, a.hidden, a.experts, a.ffn, a.top_k, a.vocab, a.seq, a.steps,
                  int(a.budget_mib * 2**20), a.timeout)
    if row.pop("rank") == 0:
        line = json.dumps(row)
        print(line, flush=True)
        if a.out:
            with open(a.out, "a", encoding="utf-8") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "bench_expert_parallel")
