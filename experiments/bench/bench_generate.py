"""Generation on the grid: the key/value cache against re-running the whole sequence, and what the
vocabulary-parallel argmax moves against gathering the logits.

    axgrid launch -n 4 -- python experiments/bench/bench_generate.py --grid 1x2x2x1

Builds axgrid's GPT (``--size``, optionally ``--hidden``/``--layers``, vocabulary ``--vocab``) on the grid, decodes ``--new`` tokens greedily after
``--batch`` random prompts of ``--prompt`` tokens, with the cache and without (``use_cache=False``), checks the
tokens are equal, and prints (rank 0), measured in one run: seconds and new tokens/s of each (best of
``--repeat``), their ratio, and from the ledger the bytes gathered over y per step by the argmax (``[b, 2]``
value and index per rank) against the bytes an all-gather of the last position's logits (``[b, V/Gy]`` fp32 per
rank) would move.
"""
from __future__ import annotations

import argparse
import time

import torch

import axgrid
from axgrid.models import GPT, GPTConfig


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="1x2x2x1")
    ap.add_argument("--size", default="gpt-mini")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=None, help="override the size's hidden width")
    ap.add_argument("--layers", type=int, default=None, help="override the size's layer count")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    grid = axgrid.init(args.grid)
    try:
        sizes = {k: v for k, v in (("hidden", args.hidden), ("layers", args.layers)) if v is not None}
        cfg = GPTConfig.named(args.size, vocab=args.vocab, seq=max(args.prompt + args.new, 128), **sizes)
        model = GPT(cfg, grid)
        prompts = torch.randint(0, cfg.shape.vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
        axgrid.generate(model, prompts, grid, 2)              # warm-up (first calls allocate and build caches)
        seconds, outs, gathered = {}, {}, 0
        for cached in (True, False):
            best = float("inf")
            for _ in range(args.repeat):
                grid.ledger.reset()
                t0 = time.perf_counter()
                outs[cached] = axgrid.generate(model, prompts, grid, args.new, use_cache=cached)
                best = min(best, time.perf_counter() - t0)
                entry = grid.ledger.entries.get(("y", "all_gather"))
                gathered = entry.bytes if entry else 0
            seconds[cached] = best
        assert torch.equal(outs[True], outs[False]), "cached and uncached tokens differ"
        if grid.rank == 0:
            b = args.batch // grid.size("zd")
            logits_bytes = b * cfg.shape.vocab * 4                # an all-gather over y of [b, V/Gy] fp32: its output
            print(f"GPT {args.size} (layers {cfg.shape.layers}, hidden {cfg.shape.hidden}) vocab {cfg.shape.vocab} on {grid.shape}: {args.batch} prompts x {args.prompt} tokens, "
                  f"{args.new} new (greedy); best of {args.repeat}")
            for cached in (True, False):
                print(f"  {'cached  ' if cached else 'uncached'} {seconds[cached]:7.3f} s  "
                      f"{args.batch * args.new / seconds[cached]:8.1f} new tokens/s")
            print(f"  cache speed-up: {seconds[False] / seconds[True]:.2f}x")
            print(f"  gathered over y per step: {gathered / args.new:,.0f} bytes (argmax) vs {logits_bytes:,} "
                  f"(the logits): {logits_bytes / max(gathered / args.new, 1):.0f}x less")
    finally:
        grid.destroy()


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "bench_generate")     # errors said once, as one line (axgrid.launch.errors)
