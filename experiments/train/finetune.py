"""Fine-tune a Hugging Face LLaMA-family checkpoint (Llama, Mistral, Qwen2) on the grid, then export it.

    axgrid launch -n 4 -- python experiments/train/finetune.py --checkpoint PATH --grid 1x2x1x2 --seq 128 --batch 8 \\
        --microbatches 2 --steps 200 --lr 1e-4 --warmup 20 --recompute --log ft.jsonl --save ckpt --save-every 50 \\
        --export finetuned/                        # (mpirun / srun / torchrun work the same way: axgrid.init)

Model: ``--checkpoint`` is a folder written by ``save_pretrained``; ``axgrid.from_pretrained`` reads it onto
the grid in fp32, each rank only its own parts (the built-in LLaMA-family plan: residual stream sharded,
attention on local heads, vocabulary-parallel head and loss). ``--recompute`` turns on the model's
activation checkpointing of its decoder layers (``activation_checkpointing_enable``, non-reentrant).

Data: ``--text-file`` (default: the shipped KJV selections) tokenized with the checkpoint's tokenizer when the
folder has one (``AutoTokenizer``); otherwise byte-level (ids = UTF-8 bytes, which needs a vocabulary of at
least 256), said in the log's ``config`` record and on stdout. Each step's global batch is ``--batch`` random
windows of ``--seq + 1`` tokens drawn from ``(seed, step)`` (the same on every rank; each takes its slice), so a
resumed run sees the same batches. ``--data-path [W] PREFIX ...`` (``--split``, ``--eval-interval``, ``--eval-iters``)
trains on a corpus preprocessed with the checkpoint's tokenizer instead, as train_gpt does (docs/data.md).

Step (:func:`axgrid.driver.run_step`, shared with train_gpt and the memorization study): ``--batch`` sequences in ``--microbatches``
accumulated micro-batches, each split over d and (inside the model) over z by whole sequences; bf16 autocast
with ``--dtype bf16`` (default on GPU), fp32 otherwise; AdamW (decay on matrices only), linear warm-up then
cosine decay to ``--min-lr``, global gradient-norm clipping ``--clip``. Goldfish loss ``--goldfish-k K
[--goldfish-h 13] [--goldfish-mode hash|static]``: dropped targets become ``-100`` labels and the loss is the
mean over the kept targets of the whole step (:func:`axgrid.memorization.goldfish.step_mask`), as in train_gpt.

FLOPs per step (``B·S`` tokens, ``P`` parameters in the decoder's and head's matrices, ``L`` layers, attention
width ``a = heads·head_dim``): ``(6 + 2·r)·P·B·S + (6 + 2·r)·2·L·S·a·B·S``, ``r = 1`` under ``--recompute``
(the recomputed forward); TFLOP/s per device = FLOPs per step / step time / ranks / 1e12.

Logs: :mod:`axgrid.metrics` rows (``--log`` JSON lines, ``--tensorboard``; rank 0): a ``config`` row (tokenizer,
FLOP formula, ...), a ``step`` row per step (loss, lr, grad norm, step time, tokens/s, TFLOP/s, MFU, peak memory,
communication, energy; kept fraction under Goldfish) and a ``summary``. Checkpoints:
``--save DIR --save-every K`` (and at the end, and on SIGTERM/SIGUSR1 through ``SaveOnSignal``), ``--resume DIR``
on any grid and any ``--zero`` (loading reshards; a checkpoint saved with other settings is refused, naming them, unless
``--allow-config-change`` lists them). ``--export DIR``
writes the fine-tuned model as a Hugging Face folder (``axgrid.export_pretrained``, plus the tokenizer).
``main(argv)`` returns the summary on every rank.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

import axgrid
from axgrid.data import DEFAULT_TEXT, ByteTokenizer, TokenWindows, encode, load_tokenizer
from axgrid.driver import (RunCheckpoints, RunData, StepSettings, add_data_arguments, add_run_arguments,
                           add_step_arguments, check_data_arguments, check_run_arguments, check_zero,
                           compute_dtype, data_settings, parse_step_args, run_step)
from axgrid.metrics import Metrics, add_arguments as add_metrics_arguments
from axgrid.plans.causal_lm import dense_parameters, load_causal_lm
from axgrid.launch.env import LaunchError, detect_launch
from axgrid.spec import GridError, GridShape, llama_flops
from axgrid.train import decay_groups


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="Hugging Face model folder (save_pretrained)")
    p.add_argument("--text-file", default=str(DEFAULT_TEXT), help="UTF-8 text to fine-tune on")
    p.add_argument("--seq", type=int, default=128, help="tokens per training sequence")
    p.add_argument("--steps", type=int, default=100)
    add_step_arguments(p)
    p.set_defaults(lr=1e-4, weight_decay=0.0)          # a fine-tuning learning rate, no weight decay
    p.add_argument("--seed", type=int, default=0, help="seed of the data order")
    add_data_arguments(p)
    add_run_arguments(p)
    p.add_argument("--export", default=None, help="write the fine-tuned model as a Hugging Face folder here")
    add_metrics_arguments(p)
    return parse_step_args(p, argv)


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """What a resumed run must share with the run that saved (not the grid, dtype or timeout: loading reshards)."""
    corpus = data_settings(args)
    return {"checkpoint": os.path.abspath(args.checkpoint), "text_file": os.path.abspath(args.text_file),
            "corpus": corpus.record() if corpus is not None else None,
            "seed": args.seed, "seq": args.seq, "steps": args.steps, "batch": args.batch,
            "microbatches": args.microbatches, "recompute": args.recompute,
            "schedule": {"lr": args.lr, "min_lr": args.min_lr, "warmup": args.warmup},
            "optimizer": {"weight_decay": args.weight_decay, "beta2": args.beta2, "clip": args.clip},
            "goldfish": {"k": args.goldfish_k, "h": args.goldfish_h, "mode": args.goldfish_mode}}


def check_args(args: argparse.Namespace) -> None:
    """Problems visible without the grid, raised identically on every rank before any collective."""
    if not os.path.isdir(args.checkpoint):
        raise SystemExit(f"--checkpoint {args.checkpoint} is not a folder: pass a Hugging Face model folder written "
                         f"by save_pretrained")
    if not args.data_path and not os.path.isfile(args.text_file):
        raise SystemExit(f"--text-file {args.text_file} does not exist or is not a file: pass a UTF-8 text file")
    if args.seq < 1:
        raise SystemExit(f"--seq {args.seq}: tokens per sequence must be >= 1")
    check_run_arguments(args)
    check_data_arguments(args)
    try:
        shape = GridShape.parse(args.grid or "1x1x1", detect_launch(use_mpi=False).world_size)
    except (GridError, LaunchError) as e:
        raise SystemExit(f"finetune: {e}") from None
    check_zero(args.zero, shape)


def data_of(args: argparse.Namespace, tokenizer: Optional[Any], vocab: int) -> TokenWindows:
    """The run's training windows (raises SystemExit, identically on every rank, when the text cannot be used)."""
    if tokenizer is None and vocab < ByteTokenizer.vocab_size:
        raise SystemExit(f"--checkpoint {args.checkpoint} has no tokenizer and a vocabulary of {vocab} < 256, so the "
                         f"byte-level fallback cannot encode the text; save a tokenizer with the checkpoint")
    tokens = encode(Path(args.text_file).read_text(encoding="utf-8"), tokenizer)
    if int(tokens.max()) >= vocab:
        raise SystemExit(f"--text-file {args.text_file} encodes to id {int(tokens.max())} >= the model's vocabulary "
                         f"{vocab}: the tokenizer does not belong to this checkpoint")
    try:
        return TokenWindows(tokens, args.seq, args.seed, args.text_file)
    except ValueError as e:
        raise SystemExit(f"--text-file: {e}; use a longer text or a smaller --seq") from None


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Fine-tune; returns the summary (losses, mean step time, tokens/s, TFLOP/s) on every rank."""
    args = parse_args(argv)
    check_args(args)
    dtype = compute_dtype(args.dtype)
    config = axgrid.RuntimeConfig(timeout_s=args.timeout, seed=args.seed, record_timing=args.comm_timing,
                                  zero=args.zero)
    grid = axgrid.init(args.grid or "1x1x1", order=args.order, config=config)
    try:
        return _finetune(args, grid, dtype)
    finally:
        grid.destroy()


def _finetune(args: argparse.Namespace, grid: axgrid.Grid, dtype: str) -> dict[str, Any]:
    settings = StepSettings.from_args(args, args.steps, dtype)
    settings.check(grid)
    rank0 = grid.rank == 0
    tokenizer = load_tokenizer(args.checkpoint)
    model = load_causal_lm(args.checkpoint, grid, args.recompute)
    grid.watch(model)                     # the d buckets now: with ODP the first backward reduces over d too
    mcfg = model.config
    opt = torch.optim.AdamW(decay_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, args.beta2), eps=1e-8)
    opt = axgrid.shard_optimizer(opt, model, grid)   # --zero 1|2: this d-rank's share of the state
    ckpt = RunCheckpoints(args, grid, run_config(args), "finetune")
    start = ckpt.resume(model, opt)
    data = RunData.open(args, grid, settings, seq=args.seq, seed=args.seed, vocab=mcfg.vocab_size, start=start,
                        resumed=ckpt.extra, fallback=lambda: data_of(args, tokenizer, mcfg.vocab_size))
    text_tokens = int(data.batches.tokens.numel()) if data.corpus is None else None
    flops = llama_flops(mcfg, args.batch, args.seq, args.recompute)
    tok_name = type(tokenizer).__name__ if tokenizer is not None else "byte-level fallback (no tokenizer in checkpoint)"
    config = {"model": type(model).__name__, "checkpoint": args.checkpoint, "parameters": dense_parameters(model),
              "tokenizer": tok_name, "text_tokens": text_tokens, "corpus": data.describe() or None,
              "seq": args.seq, "batch": args.batch,
              "microbatches": args.microbatches, "recompute": args.recompute, "goldfish_k": args.goldfish_k,
              "goldfish_h": args.goldfish_h, "goldfish_mode": args.goldfish_mode,
              "flop_formula": "(6 + 2r)*P*B*S + (6 + 2r)*2*L*S*a*B*S"}
    metrics = Metrics.from_args(grid, args, flops_per_step=flops, tokens_per_step=args.batch * args.seq, dtype=dtype,
                                config=config, progress=None if args.no_progress else args.steps, initial=start,
                                append=bool(args.resume))
    if rank0:
        print(f"finetune: {type(model).__name__} from {args.checkpoint} on grid {grid.shape} ({grid.world_size} "
              f"ranks, {dtype}); tokenizer: {tok_name}; "
              f"{data.describe() if data.corpus else f'{text_tokens:,} tokens of text'}; batch {args.batch} x "
              f"{args.seq} in {args.microbatches} micro-batch(es)", flush=True)
    for step in range(start, args.steps):
        inputs, targets = data.batch(step)
        run_step(model, opt, grid, settings, step, inputs, targets, metrics)
        data.after_step(step + 1, model, grid, metrics)
        if ckpt.step_done(step + 1, model, opt, last=step + 1 == args.steps, extra=data.extra(step + 1)):
            break
    ckpt.close()
    exported = args.export if (args.export and not ckpt.stopped) else None
    if exported:
        axgrid.export_pretrained(model, args.export, grid, tokenizer=tokenizer)
    losses = [r["loss"] for r in metrics.rows]
    summary = metrics.close(start_step=start, losses=losses, exported=exported)
    if rank0 and losses:
        print(f"finetune: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps; {summary['step_s']:.3f} "
              f"s/step, {summary['tokens_per_s']:.0f} tokens/s, {summary['tflops']:.4f} TFLOP/s per device"
              + (f"; exported to {args.export}" if summary["exported"] else ""), flush=True)
    return summary


if __name__ == "__main__":
    main()
