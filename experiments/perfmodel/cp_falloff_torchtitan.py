"""perfmodel's throughput falloff under context parallelism from 32k to 262k tokens against torchtitan's published
one: Llama 3.1 8B on 8 H100s, one sequence per CP group (FSDP 8/CP × CP, full activation checkpointing), CP 1, 2,
4, 8 at 32,768, 65,536, 131,072 and 262,144 tokens (torchtitan, benchmarks/llama3_h100_202412_torchtitan.md Table
2, github pytorch/torchtitan at 31a17bf, torch 1963fc8, torchtitan 9dec370: float8 + torch.compile on 96 GB H100s,
so only the ratios between sequence lengths are compared, never the rates).

    python experiments/perfmodel/cp_falloff_torchtitan.py

perfmodel prices the same problem (batch 8/CP sequences, recompute on, bf16, dgx-h100) on the grid 1x1x8x1 (z
shards the weights as FSDP does; the CP group lies inside z) with each exchange: "all_gather" (what axgrid's
Hugging Face plans run: the masked math-path attention, perfmodel.context_parallel) and "ring" (the GPT's other
exchange, priced for the same shapes), and a third series, "fused": the same tokens per GPU attending to the whole
sequence with the serial (flash) attention's price and no exchange, what a fused-kernel CP that hides its exchange
would cost (torchtitan's ring runs flash or cuDNN attention per step). It prints tokens/s/GPU and each series' ratio
to its 32k row.
"""
from __future__ import annotations

from dataclasses import replace
import argparse
from typing import Optional, Sequence

from axgrid.launch.errors import run
from axgrid.perfmodel import Options, Problem, load_machine, price_grid
from axgrid.spec import PUBLIC_MODELS

#: (sequence length, CP, tokens/s/GPU): torchtitan's Table 2 (FSDP 8/CP, CP, local batch 1, float8 + compile)
TORCHTITAN = [(32768, 1, 3890), (65536, 2, 2540), (131072, 4, 1071), (262144, 8, 548)]
GRID = (1, 1, 8, 1)


def perfmodel_tps(seq: int, cp: int, exchange: str) -> tuple[float, str]:
    """(tokens/s/GPU, "" or why it is infeasible) of Llama 3.1 8B at ``seq`` on 8 dgx-h100 GPUs, CP ``cp``."""
    spec = replace(PUBLIC_MODELS["llama-3.1-8b"], seq=seq)
    batch = 8 // cp
    prob = Problem(spec, batch, 8, "bf16", Options(recompute=True, cp=cp, cp_exchange=exchange, zero=0,
                                                   microbatches=1))
    row = price_grid(prob, load_machine("dgx-h100"), GRID)
    tps = batch * seq / row.time_s / 8 if row.time_s and row.time_s != float("inf") else 0.0
    if not row.feasible:
        # priced all the same (the time does not depend on the memory): say what does not fit
        tps = batch * seq / (row.compute_s + sum(row.exposed_s.values())) / 8
    return tps, row.reason


def fused_tps(seq: int) -> float:
    """tokens/s/GPU of 8 sequences of ``seq`` on 1x1x8x1 without CP (one sequence per rank, the flash price),
    memory aside: the proxy for a fused-kernel CP at the same tokens per GPU."""
    spec = replace(PUBLIC_MODELS["llama-3.1-8b"], seq=seq)
    prob = Problem(spec, 8, 8, "bf16", Options(recompute=True, zero=0, microbatches=1))
    row = price_grid(prob, load_machine("dgx-h100"), GRID)
    return 8 * seq / (row.compute_s + sum(row.exposed_s.values())) / 8


def main(argv: Optional[Sequence[str]] = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)     # no options: -h, and a bad one said
    series = {"torchtitan": [t for _, _, t in TORCHTITAN]}
    notes = []
    for exchange in ("all_gather", "ring"):
        vals = []
        for seq, cp, _ in TORCHTITAN:
            tps, why = perfmodel_tps(seq, cp, exchange)
            vals.append(tps)
            if why:
                notes.append(f"perfmodel {exchange} at {seq} tokens, CP {cp}: does not fit ({why})")
        series[f"perfmodel {exchange}"] = vals
    series["perfmodel fused"] = [fused_tps(seq) for seq, _, _ in TORCHTITAN]
    print("| tokens | CP | " + " | ".join(f"{k} TPS/GPU | ratio" for k in series) + " |")
    print("|---:|---:|" + "---:|---:|" * len(series))
    for i, (seq, cp, _) in enumerate(TORCHTITAN):
        cells = " | ".join(f"{v[i]:,.0f} | {v[i] / v[0]:.3f}" for v in series.values())
        print(f"| {seq:,} | {cp} | {cells} |")
    for n in notes:
        print(n)


if __name__ == "__main__":
    run(main, "cp_falloff_torchtitan")
