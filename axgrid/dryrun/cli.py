"""``python -m axgrid.dryrun`` (also ``axgrid dryrun``): one real training step of the runtime per rank, as rank r
of a job of any size, on this machine, beside perfmodel's prediction. Exit 0 when they agree and the peak fits the
machine (the fraction of its memory perfmodel plans with, ``perfmodel.Options.memory_usable``), 1 when they do not (each difference named) and on bad input (one line, before anything is allocated).

    python -m axgrid.dryrun --model gpt-320b --gpus 32768 --machine frontier --batch 4096
    python -m axgrid.dryrun --model gpt-80b --grid 4x2x16x8 --machine perlmutter --batch 1024 --json out.json
    python -m axgrid.dryrun --config path/to/config.json --grid 4x4x8x64 --seq 8192 --batch 1024   # a HF config
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Optional, Sequence

from .config import DryRunError, is_config_path, predict, resolve, role_ranks


def build_parser(prog: str = "python -m axgrid.dryrun") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a named GPT size (gpt-tiny ... gpt-1t, gpt-405b), a public model "
                       "(llama-3.1-8b, qwen3-8b, gemma-3-27b, phi-3-mini, ...: built from its published config), or a "
                       "Hugging Face config.json (or its folder), as --config")
    which.add_argument("--config", metavar="CONFIG_JSON", help="a Hugging Face config.json (or its folder) of a "
                       "Llama, Mistral, Qwen2, Qwen3, Gemma 3 or Phi-3 model, built and parallelized by its plan")
    ap.add_argument("--seq", type=int, help="sequence length, for a config.json (default 2048)")
    ap.add_argument("--gpus", type=int, help="GPUs of the job (or give --grid)")
    ap.add_argument("--grid", help="GXxGYxGZxGD (default: perfmodel's best for the model, GPUs, machine, batch)")
    ap.add_argument("--machine", default="frontier", help="a machine of perfmodel's library (python -m "
                    "axgrid.perfmodel machines) or a .toml: its memory and the default grid (default frontier)")
    ap.add_argument("--batch", type=int, required=True, help="global batch in sequences per step")
    ap.add_argument("--microbatches", type=int, help="micro-batches per step (default: the fewest that fit, as "
                    "perfmodel chooses)")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16: autocast, fp32 weights")
    ap.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=True,
                    help="activation recompute per block (default on)")
    ap.add_argument("--overlap", default="all", help="the runtime's overlaps: all (default), none, or a comma "
                    "list of oar, ors, oag, odp, keep")
    ap.add_argument("--zero", type=int, choices=(0, 1, 2), help="ZeRO over d: 0, 1 (optimizer state), 2 (and "
                    "gradients); default: the mode perfmodel picks for the grid")
    ap.add_argument("--lora-r", type=int, default=0, help="LoRA adapters of this rank (axgrid.lora, alpha 2r), the "
                    "base frozen; 0 (default): full training")
    ap.add_argument("--lora-targets", help="comma-separated FC layers to adapt (default: every layer of the block; "
                    "the GPT's qkv,proj,up,down,head, a Llama's q_proj,...,down_proj,lm_head)")
    ap.add_argument("--cp", type=int, default=1, help="context parallelism: each sequence split over N z-ranks "
                    "(axgrid.init(..., cp=N); N divides Gz; default 1: none); a --grid of perfmodel's rank rows "
                    "carries it as GXxGYxGZxGD+cpN")
    ap.add_argument("--cp-exchange", choices=("all_gather", "ring"), default="all_gather",
                    help="how attention exchanges keys and values under --cp (the GPT's; a Hugging Face plan "
                         "all-gathers)")
    ap.add_argument("--ep", type=int, help="expert parallelism of a mixture of experts: its experts over N d-ranks "
                    "(axgrid.init(..., ep=N); N divides Gd and the experts; default: perfmodel's for the grid it "
                    "picks, 1 with --grid); a --grid of perfmodel's rank rows carries it as GXxGYxGZxGD/epN")
    ap.add_argument("--rank", type=int, action="append", dest="ranks",
                    help="dry-run this rank (repeatable; default: ranks covering every distinct role)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    return ap


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m axgrid.dryrun") -> int:
    a = build_parser(prog).parse_args(argv)
    if a.config is not None and not is_config_path(a.config):
        raise DryRunError(f"--config {a.config}: give the path of a Hugging Face config.json (or its folder); a named "
                          f"size goes to --model")
    from axgrid.perfmodel import PerfModelError
    from axgrid.perfmodel.cli import split_cp
    try:
        grid, cp = split_cp(a.grid) if a.grid else (None, 1)
        grid, ep = split_ep(grid) if grid else (None, None)
    except PerfModelError as e:
        raise DryRunError(f"--grid: {e}") from None
    if cp > 1 and a.cp > 1 and cp != a.cp:
        raise DryRunError(f"--grid {a.grid} names cp={cp} and --cp {a.cp}: give one")
    if ep is not None and a.ep is not None and ep != a.ep:
        raise DryRunError(f"--grid {a.grid} names ep={ep} and --ep {a.ep}: give one")
    cfg = resolve(a.config if a.config is not None else a.model, a.gpus, a.batch, grid=grid, machine=a.machine,
                  dtype=a.dtype, recompute=a.recompute, overlap=a.overlap, microbatches=a.microbatches, zero=a.zero, seq=a.seq, lora_r=a.lora_r,
                  lora_targets=tuple(t.strip() for t in a.lora_targets.split(",") if t.strip())
                  if a.lora_targets else None, cp=max(cp, a.cp), cp_exchange=a.cp_exchange,
                  ep=a.ep if ep is None else ep)
    ranks = a.ranks or role_ranks(cfg)
    bad = [r for r in ranks if not 0 <= r < cfg.gpus]
    if bad:
        raise DryRunError(f"--rank {bad[0]} is outside the grid {cfg.grid} (ranks 0..{cfg.gpus - 1})")
    if a.json:
        folder = os.path.dirname(os.path.abspath(a.json))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise DryRunError(f"--json {a.json}: no writable folder {folder}")
    import torch

    from axgrid import perfmodel as pm

    from .report import disagreements, human, rank_json, table
    from .step import measure_rank
    torch.set_num_threads(1)
    prediction = predict(cfg)
    machine = pm.load_machine(cfg.machine)
    lora = f", LoRA r={cfg.lora_r} on {','.join(cfg.lora_layers)}" if cfg.lora_r else ""
    print(f"dry run: {cfg.model.name} on {cfg.grid}{f'+cp{cfg.cp} ({cfg.cp_exchange})' if cfg.cp > 1 else ''}{f'/ep{cfg.ep}' if cfg.ep > 1 else ''} ({cfg.gpus} GPUs of {machine.name}), batch {cfg.batch} in "
          f"{cfg.microbatches} micro-batch(es), {cfg.dtype}, recompute {'on' if cfg.recompute else 'off'}, overlap "
          f"{cfg.overlap}, zero {cfg.zero}{lora}; ranks {', '.join(map(str, ranks))}", flush=True)
    measures, problems = [], []
    for r in ranks:
        m = measure_rank(cfg, r)
        measures.append(m)
        print(table(cfg, m, prediction), flush=True)
        problems += disagreements(m, prediction, cfg.zero)
    peak = max(m.peak for m in measures)
    usable = int(cfg.options().memory_usable * machine.memory_bytes)     # as perfmodel plans (allocator, workspace)
    room = (f"{machine.name}'s usable {human(usable)} ({cfg.options().memory_usable:.0%} of "
            f"{human(machine.memory_bytes)}, as perfmodel plans)")
    fits = peak <= usable
    if a.json:
        doc = {"config": cfg.as_json(), "ranks": [rank_json(m, prediction) for m in measures],
               "agree": not problems, "disagreements": problems, "fits": fits,
               "machine_memory_bytes": machine.memory_bytes, "usable_memory_bytes": usable}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {a.json}")
    if not fits:
        problems.append(f"the measured peak {human(peak)} does not fit {room} per GPU; "
                        f"{_best_fitting(cfg, pm, machine)}")
    for p in problems:
        print(f"DIFFERS: {p}" if not p.startswith("the measured peak") else f"DOES NOT FIT: {p}")
    if not problems and prediction.peak is None:
        print(f"agree: every collective's bytes and calls equal perfmodel's, the modelled categories to the byte; "
              f"{prediction.not_modelled}; the measured peak fits {room}")
    elif not problems:
        print(f"agree: every collective's bytes and calls equal perfmodel's, the modelled categories to the byte (the "
              f"buckets within perfmodel's bound), "
              f"the peak within 5%; the peak fits {room}")
    return 1 if problems else 0


def split_ep(grid: str) -> tuple[str, "int | None"]:
    """``"1x1x1x64/ep8"`` (a rank row's grid with expert parallelism) -> ("1x1x1x64", 8); a grid without -> (grid,
    None)."""
    from axgrid.perfmodel import PerfModelError
    if "/ep" not in grid:
        return grid, None
    head, _, tail = grid.partition("/ep")
    if not tail.isdigit() or int(tail) < 1:
        raise PerfModelError(f"{grid!r}: the expert-parallel size after /ep must be a positive integer, e.g. "
                             f"1x1x1x64/ep8")
    return head, int(tail)


def _best_fitting(cfg, pm, machine) -> str:
    """perfmodel's best grid that fits, for the same model and batch on as many GPUs."""
    from dataclasses import replace

    from .report import human
    if cfg.hf and cfg.lora_r:
        return ("perfmodel prices LoRA's memory on the GPT block only: try a grid with a larger Gz or Gd, more "
                "micro-batches, or --zero 1 or 2")
    prob = replace(cfg.problem(), options=replace(cfg.options(), microbatches=None, zero=None))
    try:
        row = pm.rank(prob, machine, tp_pp_dp=False).feasible[0]
    except pm.NoFeasibleConfig as e:
        return f"perfmodel finds no grid that fits: {e}"
    return (f"perfmodel's best grid that fits is {row.grid_str}{f' zero {row.zero}' if row.zero else ''} with "
            f"{row.microbatches} micro-batch(es) "
            f"({human(row.memory_bytes)} predicted)")
