"""Drop-in vs the built-in paired plan on the same Hugging Face Llama, and torch.compile vs eager.

    axgrid launch -n 4 -- python experiments/bench/bench_hf_plans.py --grid 2x2x1x1
    axgrid launch -n 4 -- python experiments/bench/bench_hf_plans.py --grid 2x2x1x1 --compile   # + compiled runs
    axgrid launch -n 4 -- python experiments/bench/bench_hf_plans.py --grid 2x1x2x1 --tied --hidden 576 \
        --heads 9 --kv-heads 3 --ffn 1536 --vocab 49152                 # SmolLM2-135M's shapes, 2 layers

Both runs start from the same random-init ``LlamaForCausalLM`` (no download) and train on the same batches with
AdamW: **drop-in** (``parallelize(model, grid, plan={})``: every Linear takes and returns replicated
activations, so each one gathers its output) and **paired** (``parallelize(model, grid)``: the built-in plan,
residual stream sharded, q/k/v -> o and gate/up -> down with no redistribution, vocab-parallel loss).

``--tied``: tied embeddings (drop-in keeps the tied head dense on every rank; the plan stores it once, sharded,
:mod:`axgrid.tensor_parallel.tied_embedding`).

Printed (rank 0), measured in one run, every step through ``axgrid.metrics.StepMeter``: bytes per step from the
ledger (the step after warm-up; all collectives of forward, backward and the data-parallel gradient mean) split by
grid dimension, time per step (the slowest rank's, mean of ``--steps`` after ``--warmup``), parameter MiB on rank
0, and the ratios. With ``--compile``: the same model under ``torch.compile``
(``--backend``, default inductor): compile time (the first step minus an eager step), step time compiled vs
eager, and the graph breaks per rank (``torch._dynamo`` counters).
"""
from __future__ import annotations

import argparse

import torch

import axgrid
from axgrid.metrics import StepMeter, summarize
from axgrid.train import train_step


def build(args: argparse.Namespace) -> torch.nn.Module:
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                                   num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                   num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq,
                                   tie_word_embeddings=args.tied)
    torch.manual_seed(args.seed)
    return transformers.LlamaForCausalLM(cfg)


def batch_of(step: int, args: argparse.Namespace, grid: axgrid.Grid) -> torch.Tensor:
    """This data-parallel rank's ``[batch, seq]`` token ids of ``step``."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 131 + grid.index("d"))
    return torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)


def time_training(model: torch.nn.Module, grid: axgrid.Grid, args: argparse.Namespace,
                  compiled: bool = False) -> dict:
    """Train ``model`` through the first, warm-up, ledger and timed steps: bytes, step time, peak memory."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd = torch.compile(model, backend=args.backend) if compiled else model

    def step(s: int) -> float:
        ids = batch_of(s, args, grid)
        return float(train_step(model, opt, lambda _: fwd(input_ids=ids, labels=ids).loss, grid).loss)

    if compiled:
        import torch._dynamo as dynamo
        dynamo.reset()
        dynamo.utils.counters.clear()
    meter = StepMeter(grid, flops_per_step=None, tokens_per_step=args.batch * args.seq * grid.size("d"),
                      dtype="fp32")
    rows = []
    for s in range(args.warmup + 1 + args.steps):      # the first step (compilation), warm-up, the ledger step, timed
        meter.begin()
        loss = step(s)
        rows.append(meter.end(s, loss=loss))
    meter.close()
    timed = summarize(rows[args.warmup + 1:], skip=0)
    by_dim = rows[args.warmup]["comm_bytes"]
    out = {"bytes": sum(by_dim.values()), "by_dim": by_dim, "step_s": timed["step_s"], "first_s": rows[0]["step_s"],
           "loss": rows[-1]["loss"], "peak_mem_bytes": timed["peak_mem_bytes"],
           "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
    if compiled:
        import torch._dynamo as dynamo
        out["breaks"] = sum(dynamo.utils.counters["graph_break"].values())
        out["break_reasons"] = dict(dynamo.utils.counters["graph_break"].most_common(5))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", default="2x2x1x1")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=688)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4, help="sequences per data-parallel rank")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tied", action="store_true", help="tie the embeddings (tie_word_embeddings=True)")
    ap.add_argument("--compile", action="store_true", help="also time the paired model under torch.compile")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, aot_eager, eager)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    grid = axgrid.init(args.grid, timeout_s=900)
    try:
        if args.warmup < 1:
            raise SystemExit(f"--warmup={args.warmup}: use at least 1 (the step before the ledger step)")
        results = {}
        for name, plan in (("drop-in", {}), ("paired", None)):
            model = build(args)
            axgrid.parallelize(model, grid, plan=plan)
            results[name] = time_training(model, grid, args)
        if args.compile:
            model = build(args)
            axgrid.parallelize(model, grid)
            results["paired, compiled"] = time_training(model, grid, args, compiled=True)
        if grid.rank == 0:
            report(results, args, grid)
    finally:
        grid.destroy()


def report(results: dict, args: argparse.Namespace, grid: axgrid.Grid) -> None:
    print(f"Llama {args.layers} layers, hidden {args.hidden}, heads {args.heads}/{args.kv_heads} kv, ffn {args.ffn}, "
          f"vocab {args.vocab}{' (tied)' if args.tied else ''}, {args.batch}x{args.seq} tokens per d-rank, grid "
          f"{grid.shape}, rank 0")
    print(f"{'run':<18} {'bytes/step':>12} {'x':>10} {'y':>10} {'z':>10} {'d':>10} {'s/step':>8} {'loss':>8} "
          f"{'peak MiB':>9} {'param MiB':>9}")
    for name, r in results.items():
        d = r["by_dim"]
        print(f"{name:<18} {r['bytes']:>12,} " + " ".join(f"{d.get(k, 0):>10,}" for k in "xyzd")
              + f" {r['step_s']:>8.4f} {r['loss']:>8.4f} {r['peak_mem_bytes'] / 2**20:>9.0f}"
              + f" {r['param_bytes'] / 2**20:>9.1f}")
    a, b = results["drop-in"], results["paired"]
    print(f"paired / drop-in: bytes {b['bytes'] / a['bytes']:.3f}, time per step {b['step_s'] / a['step_s']:.3f}, "
          f"parameters {b['param_bytes'] / a['param_bytes']:.3f}")
    if "paired, compiled" in results:
        c = results["paired, compiled"]
        print(f"compiled ({args.backend}): compile time ~{c['first_s'] - b['first_s']:.1f} s (first step "
              f"{c['first_s']:.1f} s vs eager {b['first_s']:.2f} s), step time compiled / eager "
              f"{c['step_s'] / b['step_s']:.3f}, graph breaks on rank 0: {c['breaks']}")
        for reason, n in c["break_reasons"].items():
            print(f"  {n} x {reason[:160]!r}")


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "bench_hf_plans")     # errors said once, as one line (axgrid.launch.errors)
