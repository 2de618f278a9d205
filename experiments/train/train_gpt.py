"""Train a GPT on the 4D grid and log loss, time, tokens/s, TFLOP/s, memory, communication and energy per step.

    axgrid launch -n 8 -- python experiments/train/train_gpt.py --model gpt-tiny --grid 2x2x2x1 --data text --steps 30
    mpirun -n 64 python experiments/train/train_gpt.py --model gpt-20b --grid 4x4x2x2 --batch 64 --microbatches 4 \\
        --recompute --overlap oar,ors,oag --log run.jsonl          # (srun / torchrun work the same way)

Batch: ``--batch B`` sequences per optimizer step (global), split into ``--microbatches M`` accumulated
micro-batches; each micro-batch's ``B/M`` sequences are split over the data-parallel ranks (``B/(M·Gd)`` each) and
then, inside the model, over z by whole sequences (``B/(M·Gd·Gz)`` per rank: must be a whole number >= 1).
Every rank builds the same global batch from ``(seed, step)`` and takes its slice, so no data is communicated
and a resumed run sees the same batches.

Data: ``--data-path [W] PREFIX ...`` trains on a corpus preprocessed into Megatron's indexed format (``python -m
axgrid.data preprocess``; a blend with weights, ``--split 949,50,1`` by documents; docs/data.md): each rank reads
only the sequences it computes, and ``--eval-interval N --eval-iters K`` logs the validation loss and perplexity
every N steps. Without it, ``--data text`` reads ``--text-file`` (default: the public-domain KJV selections shipped
in axgrid/data/text/) as bytes -- the tokenizer is byte-level, vocabulary 256 -- and samples random windows;
``--data synthetic`` (the default) draws uniform random token ids (loss stays near ln V: use it for speed, not
learning).

Precision: bf16 autocast on GPU (default), fp32 on CPU (default). Optimiser: AdamW (``axgrid.adamw``: fused where
the device has the kernel, as the dry run prices it), linear warm-up then cosine decay to ``--min-lr``, global
gradient-norm clipping. Goldfish loss: ``--goldfish-k K [--goldfish-h 13]
[--goldfish-mode hash|static]`` (the loss is averaged over the kept targets of the whole step).

FLOPs per step (axgrid.spec.flops; V = vocabulary, L layers, h hidden, B·S tokens):
    with --recompute:     96·B·S·L·h²·(1 + S/(6h) + V/(16·L·h))
    without recompute:    72·B·S·L·h²·(1 + S/(6h) + V/(12·L·h))
TFLOP/s per device = FLOPs per step / time per step / number of ranks / 1e12.

Metrics (``axgrid.metrics``, the same record every driver writes): ``--log run.jsonl`` gets a ``config`` row
(model, grid, device, the peak MFU is taken against, energy source), one ``step`` row per step (loss, lr,
grad_norm, step_s, tokens_per_s, tflops, mfu, peak_mem_bytes, comm_bytes / comm_s / comm_exposed_s per grid
dimension, energy_j, power_w, tokens_per_j), an ``eval`` row per evaluation (valid_loss, valid_ppl) and a
``summary`` row; ``--tensorboard DIR`` writes the same as
TensorBoard scalars; a progress bar on rank 0 when stderr is a terminal; ``--comm-timing`` times every
collective; ``--peak-tflops`` / ``--peak-machine local-4`` give MFU a peak where the device table has none (CPU).
``main(argv)`` returns the summary dict (every rank), so sweeps and validation scripts can call it in-process.

Memory: ``--zero 1`` shards AdamW's state over the data-parallel ranks (reduce-scatter of the gradients, each rank
steps its 1/Gd share, all-gather of the parameters), ``--zero 2`` also the gradients (docs/training.md); Gd > 1.

Checkpoints: ``--save DIR --save-every K --resume DIR`` (any grid and any ``--zero``: loading reshards; with
``--data-path`` the checkpoint holds the data position, so the resumed run sees the samples an uninterrupted run
would). The run's settings
(:func:`run_config`: model, seed, data, schedule, batch) are saved with each checkpoint; ``--resume`` refuses a
checkpoint saved with other settings, naming them, unless ``--allow-config-change steps[,...]`` accepts the change.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Optional, Sequence

import torch

import axgrid
from axgrid.driver import (RunCheckpoints, RunData, StepSettings, add_context_parallel_argument, add_data_arguments,
                           add_own_data_arguments, add_run_arguments, add_step_arguments, check_batch_split,
                           check_context_parallel, check_corpus_tokenizer,
                           check_data_arguments, check_output_paths, check_own_data_arguments, check_run_arguments,
                           check_step_arguments, check_zero, compute_dtype, data_settings, own_batches,
                           parse_step_args, run_outputs, run_step, unrecorded_note)
from axgrid.launch.env import LaunchError, detect_launch, grid_shape_for
from axgrid.launch.errors import run
from axgrid.metrics import Metrics, add_arguments as add_metrics_arguments
from axgrid.models import GPT, GPTConfig
from axgrid.spec import NAMED_SIZES, GridError, GridShape


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-tiny", help=f"one of {', '.join(NAMED_SIZES)}")
    p.add_argument("--layers", type=int, default=None, help="override the named size's layers")
    p.add_argument("--hidden", type=int, default=None, help="override the named size's hidden size")
    p.add_argument("--heads", type=int, default=None, help="override the named size's heads")
    p.add_argument("--seq", type=int, default=None, help="override the named size's sequence length")
    add_context_parallel_argument(p)
    p.add_argument("--cp-exchange", choices=("all_gather", "ring"), default="all_gather",
                   help="how attention under --cp exchanges keys and values (docs/design.md#context-parallelism)")
    p.add_argument("--vocab", type=int, default=None, help="override the named size's vocabulary")
    p.add_argument("--steps", type=int, default=20)
    add_step_arguments(p)
    p.add_argument("--overlap", default="none", help="oar,ors,oag,odp | all | none")
    add_own_data_arguments(p)
    p.add_argument("--tune-gemm", choices=("off", "on-first-use", "cache-only"), default="off")
    p.add_argument("--gemm-cache", default=None, help="GEMM tuner decision file (default: the tuner's own)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and of the data order")
    add_data_arguments(p)
    add_run_arguments(p)
    add_metrics_arguments(p)
    return parse_step_args(p, argv)


def build_config(args: argparse.Namespace) -> GPTConfig:
    over = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "vocab") if getattr(args, k) is not None}
    return GPTConfig.named(args.model, recompute=args.recompute, seed=args.seed, cp_exchange=args.cp_exchange,
                           **over)


def run_config(args: argparse.Namespace, cfg: GPTConfig) -> dict[str, Any]:
    """What a resumed run must share with the run that saved: the model, seed, data, schedule and batch (not
    the grid, overlap, dtype or timeout: loading reshards, and those do not change what is trained)."""
    model = {**{k: getattr(cfg.shape, k) for k in ("layers", "hidden", "heads", "seq", "vocab", "ffn", "bias")},
             **{k: getattr(cfg, k) for k in ("eps", "seed", "emb_std")}}
    corpus = data_settings(args)
    return {"model": model, "seed": args.seed, "data": args.data,
            "text_file": os.path.abspath(args.text_file) if args.data == "text" else None,
            "corpus": corpus.record() if corpus is not None else None,
            "steps": args.steps, "schedule": {"lr": args.lr, "min_lr": args.min_lr, "warmup": args.warmup},
            "optimizer": {"weight_decay": args.weight_decay, "beta2": args.beta2, "clip": args.clip},
            "batch": args.batch, "microbatches": args.microbatches,
            "goldfish": {"k": args.goldfish_k, "h": args.goldfish_h, "mode": args.goldfish_mode}}


def check_args(args: argparse.Namespace, cfg: GPTConfig, shape: Optional[GridShape]) -> None:
    """Every problem with the arguments, raised identically on every rank before any collective."""
    if args.steps < 1 or args.batch < 1 or args.microbatches < 1:
        raise SystemExit(f"--steps {args.steps}, --batch {args.batch}, --microbatches {args.microbatches}: "
                         f"all must be >= 1")
    check_step_arguments(args, args.steps)
    check_context_parallel(args.cp, cfg.shape.seq, shape)
    if shape is not None:
        check_batch_split(args.batch, args.microbatches, shape.gd, shape.gz, str(shape), args.cp)
        check_zero(args.zero, shape)
    elif args.batch % args.microbatches:
        raise SystemExit(f"--batch {args.batch} is not divisible by --microbatches {args.microbatches}")
    check_own_data_arguments(args, cfg.shape.vocab, cfg.shape.name)
    check_data_arguments(args)
    args.unrecorded = check_corpus_tokenizer(args, cfg.shape.vocab)     # a corpus of more ids than the model has
    try:
        axgrid.OverlapConfig.parse(args.overlap)
    except ValueError as e:
        raise SystemExit(f"--overlap {args.overlap}: {e}") from None
    check_run_arguments(args)
    if args.goldfish_k == 1 or args.goldfish_k < 0:
        raise SystemExit(f"--goldfish-k {args.goldfish_k}: use 0 (off) or K >= 2")
    check_output_paths(run_outputs(args))      # last: bad input creates no folder


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Run the training; returns the summary (mean step time after warm-up, tokens/s, TFLOP/s, losses)."""
    args = parse_args(argv)
    try:
        cfg = build_config(args)
        pre_shape = grid_shape_for(args.grid, detect_launch(use_mpi=False)) if args.grid else None
    except (ValueError, GridError, LaunchError) as e:
        raise SystemExit(f"train_gpt: {e}") from None
    check_args(args, cfg, pre_shape)
    dtype = compute_dtype(args.dtype)
    config = axgrid.RuntimeConfig(timeout_s=args.timeout, overlap=axgrid.OverlapConfig.parse(args.overlap),
                                  gemm_tuning=args.tune_gemm, gemm_cache=args.gemm_cache, seed=args.seed,
                                  record_timing=args.comm_timing, zero=args.zero)
    grid = axgrid.init(args.grid or "1x1x1", order=args.order, config=config, cp=args.cp)
    try:
        return _train(args, cfg, grid, dtype)
    finally:
        grid.destroy()


def _train(args: argparse.Namespace, cfg: GPTConfig, grid: axgrid.Grid, dtype: str) -> dict[str, Any]:
    check_args(args, cfg, grid.shape)
    rank0 = grid.rank == 0
    model = GPT(cfg, grid)
    grid.watch(model)                     # the d buckets now: with ODP the first backward reduces over d too
    opt = axgrid.adamw(model.optimizer_groups(args.weight_decay), lr=args.lr, betas=(0.9, args.beta2))
    opt = axgrid.shard_optimizer(opt, model, grid)   # --zero 1|2: this d-rank's share of the state
    settings = StepSettings.from_args(args, args.steps, dtype)
    ckpt = RunCheckpoints(args, grid, run_config(args, cfg), "train_gpt")
    start = ckpt.resume(model, opt)
    data = RunData.open(args, grid, settings, seq=cfg.shape.seq, seed=args.seed, vocab=cfg.shape.vocab, start=start,
                        resumed=ckpt.extra, fallback=lambda: own_batches(args, cfg.shape.seq, cfg.shape.vocab))
    formula = ("96*B*S*L*h^2*(1 + S/(6h) + V/(16*L*h))" if cfg.recompute
               else "72*B*S*L*h^2*(1 + S/(6h) + V/(12*L*h))")
    m = cfg.shape
    config = {"model": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "seq": m.seq,
              "vocab": m.vocab, "parameters": m.params, "order": grid.order, "backend": grid.backend,
              "batch": args.batch, "microbatches": args.microbatches, "recompute": cfg.recompute, "cp": args.cp,
              "cp_exchange": args.cp_exchange,
              "overlap": args.overlap, "zero": args.zero, "data": args.data, "corpus": data.describe() or None,
              "goldfish_k": args.goldfish_k, "optimizer": f"AdamW ({axgrid.adamw_kind(opt)})",
              "goldfish_mode": args.goldfish_mode, "tune_gemm": args.tune_gemm, "flop_formula": formula}
    metrics = Metrics.from_args(grid, args, flops_per_step=cfg.flops_per_iteration(args.batch),
                                tokens_per_step=args.batch * cfg.shape.seq, dtype=dtype, config=config,
                                progress=None if args.no_progress else args.steps, initial=start,
                                append=bool(args.resume))
    if rank0:
        print(f"train_gpt: {m.name} ({m.params:,} parameters) on grid {grid.shape} ({grid.world_size} "
              f"ranks, {grid.backend}, {dtype}), batch {args.batch} x {cfg.shape.seq} tokens in {args.microbatches} "
              f"micro-batch(es), data {args.data}{': ' + data.describe() if data.corpus else ''}; energy: "
              f"{metrics.meter.energy_source}", flush=True)
    if rank0 and args.unrecorded:
        print(f"train_gpt: {unrecorded_note(args.unrecorded)}", flush=True)
    for step in range(start, args.steps):
        inputs, targets, _ = data.batch(step)      # the global batch (of a corpus, only this rank's rows are read)
        run_step(model, opt, grid, settings, step, inputs, targets, metrics)
        data.after_step(step + 1, model, grid, metrics)
        if ckpt.step_done(step + 1, model, opt, last=step + 1 == args.steps, extra=data.extra(step + 1)):
            break
    ckpt.close()
    losses = [r["loss"] for r in metrics.rows]
    summary = metrics.close(model=cfg.shape.name, grid=str(grid.shape), world=grid.world_size, dtype=dtype,
                            first_loss=losses[0] if losses else None, final_loss=losses[-1] if losses else None,
                            losses=losses)
    if rank0 and not losses:
        print(f"train_gpt: nothing to run: the run is already at step {args.steps} (--steps)", flush=True)
    elif rank0:
        mfu = f", MFU {summary['mfu']:.1%}" if summary["mfu"] is not None else ""
        if summary.get("valid_loss") is not None:
            mfu += f"; validation loss {summary['valid_loss']:.4f}, perplexity {summary['valid_ppl']:.2f}"
        print(f"train_gpt: loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f} in {len(losses)} "
              f"steps; {summary['step_s']:.3f} s/step, {summary['tokens_per_s']:.0f} tokens/s, "
              f"{summary['tflops']:.4f} TFLOP/s per device{mfu}, peak memory "
              f"{summary['peak_mem_bytes'] / 2**20:.0f} MiB", flush=True)
    return summary


if __name__ == "__main__":
    run(main, "train_gpt")     # errors said once, as one line (axgrid.launch.errors)
