"""Pre-train a Hugging Face causal LM from its config (Llama, Mistral, Qwen2, Qwen3, Gemma 3, Phi-3, Mixtral,
Qwen2/3-MoE) on the 4D grid.

    axgrid launch -n 8 -- python experiments/train/pretrain.py --config path/to/config.json --grid 2x2x1x2 \\
        --data-path corpus_text_document --seq 1024 --batch 16 --microbatches 2 --steps 1000 --warmup 100 \\
        --recompute --log run.jsonl --save ckpt --save-every 200 --export pretrained/
    mpirun -n 64 python experiments/train/pretrain.py --config llama-3.1-8b/ ...   # (srun / torchrun the same)

Model: ``--config`` is a Hugging Face ``config.json`` (or a folder holding one; its weights, if any, are not read).
The model is built with no dense copy and parallelized by its family's plan (``axgrid.parallelize``: residual stream
sharded over x, heads and MLP units over y, sequences over z), in fp32; each rank fills its own parts with the
initial weights of ``--seed`` (:mod:`axgrid.plans.initial_weights`: transformers' initialisation, N(0,
``initializer_range``²) matrices, norms 1, as a hash of the seed, the name and the element's index), so the same
seed starts the same model on every grid and on one process. ``--recompute``: activation checkpointing of the
decoder layers.

Data, step, checkpoints and metrics are train_gpt's (``axgrid.driver``): ``--data-path [W] PREFIX ...`` a corpus in
Megatron's indexed format (``python -m axgrid.data preprocess``, with the model's tokenizer; ``--split``,
``--eval-interval``, ``--eval-iters``: validation loss and perplexity; docs/data.md), or ``--data text|synthetic``;
``--batch`` sequences of ``--seq`` tokens per step in ``--microbatches`` micro-batches, split over d and z (``--cp N``:
context parallelism, each sequence cut into ``2·N`` chunks over ``N`` z-ranks, ``N`` dividing Gz; ``--ep N``: a
mixture of experts' (Mixtral, Qwen2/3-MoE) experts spread over ``N`` d-ranks, ``N`` dividing Gd and the experts;
a checkpoint resumes under another ``--ep``; the loss is the model's own, with its auxiliary
load-balancing loss per micro-batch when the config's ``output_router_logits`` is on); AdamW
(decay on matrices), warm-up then cosine decay, clipping, Goldfish, bf16 autocast on GPU; ``--zero 1|2``;
``--save DIR --save-every K --resume DIR`` (any grid; the data position is saved; other settings are refused unless
``--allow-config-change``); ``--log``/``--tensorboard`` rows of :mod:`axgrid.metrics`. ``--export DIR`` writes the
trained model as a Hugging Face folder (``axgrid.export_pretrained``; with the tokenizer when ``--config`` is a folder
holding one), which ``finetune.py --checkpoint DIR`` and transformers load.

FLOPs per step (``B·S`` tokens, ``P`` parameters in the decoder's and head's matrices, ``L`` layers, attention
width ``a``): ``(6 + 2·r)·P·B·S + (6 + 2·r)·2·L·S·a·B·S``, ``r = 1`` under ``--recompute``, as finetune.py.
``main(argv)`` returns the summary (losses, step time, tokens/s, TFLOP/s) on every rank.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Optional, Sequence

import axgrid
from axgrid.data import load_tokenizer
from axgrid.data.tokenizer_record import record_of
from axgrid.driver import (RunCheckpoints, RunData, StepSettings, add_context_parallel_argument, add_data_arguments,
                           add_expert_parallel_argument, check_expert_parallel,
                           add_own_data_arguments, add_run_arguments, add_step_arguments, check_batch_split,
                           check_context_parallel, check_corpus_tokenizer,
                           check_data_arguments, check_output_paths, check_own_data_arguments, check_run_arguments,
                           check_step_arguments, check_zero, compute_dtype, data_settings, own_batches,
                           parse_step_args, run_outputs, run_step, unrecorded_note)
from axgrid.launch.env import LaunchError, detect_launch, grid_shape_for
from axgrid.launch.errors import run
from axgrid.metrics import Metrics, add_arguments as add_metrics_arguments
from axgrid.plans.causal_lm import causal_lm_from_config, dense_parameters, read_hf_config
from axgrid.spec import GridError, TransformerShape
from axgrid.train import decay_groups


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="Hugging Face config.json, or a folder holding one")
    p.add_argument("--seq", type=int, default=128, help="tokens per training sequence")
    add_context_parallel_argument(p)
    add_expert_parallel_argument(p)
    p.add_argument("--steps", type=int, default=20)
    add_step_arguments(p)
    add_own_data_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and of the data order")
    add_data_arguments(p)
    add_run_arguments(p)
    p.add_argument("--export", default=None, help="write the trained model as a Hugging Face folder here")
    add_metrics_arguments(p)
    return parse_step_args(p, argv)


def read_config(args: argparse.Namespace) -> Any:
    """``--config``'s transformers config (SystemExit with one line when it cannot be read)."""
    try:
        return read_hf_config(args.config)
    except ValueError as e:
        raise SystemExit(f"--config {e}") from None


def run_config(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """What a resumed run must share with the run that saved: the model's config, seed, data, schedule and batch
    (not the grid, dtype or timeout: loading reshards)."""
    corpus = data_settings(args)
    model = {k: v for k, v in config.to_diff_dict().items() if k not in ("transformers_version", "use_cache")}
    return {"model": model, "seed": args.seed, "seq": args.seq, "data": args.data,
            "text_file": os.path.abspath(args.text_file) if args.data == "text" else None,
            "corpus": corpus.record() if corpus is not None else None, "steps": args.steps,
            "schedule": {"lr": args.lr, "min_lr": args.min_lr, "warmup": args.warmup},
            "optimizer": {"weight_decay": args.weight_decay, "beta2": args.beta2, "clip": args.clip},
            "batch": args.batch, "microbatches": args.microbatches, "recompute": args.recompute,
            "goldfish": {"k": args.goldfish_k, "h": args.goldfish_h, "mode": args.goldfish_mode}}


def check_args(args: argparse.Namespace, config: Any) -> None:
    """Every problem visible without the grid, raised identically on every rank before any collective."""
    if args.steps < 1 or args.batch < 1 or args.microbatches < 1 or args.seq < 1:
        raise SystemExit(f"--steps {args.steps}, --batch {args.batch}, --microbatches {args.microbatches}, --seq "
                         f"{args.seq}: all must be >= 1")
    limit = getattr(config, "max_position_embeddings", None)
    if limit and args.seq > limit:
        raise SystemExit(f"--seq {args.seq} is longer than the model's max_position_embeddings {limit} (--config "
                         f"{args.config}): use --seq {limit} or less, or raise it in the config")
    check_step_arguments(args, args.steps)
    try:
        shape = grid_shape_for(args.grid or "1x1x1", detect_launch(use_mpi=False))
    except (GridError, LaunchError) as e:
        raise SystemExit(f"pretrain: {e}") from None
    check_context_parallel(args.cp, args.seq, shape)
    check_batch_split(args.batch, args.microbatches, shape.gd, shape.gz, str(shape), args.cp)
    check_zero(args.zero, shape)
    check_expert_parallel(args.ep, shape, config, f"--config {args.config}")
    vocab = config.vocab_size
    check_own_data_arguments(args, vocab, f"--config {args.config}")
    check_data_arguments(args)
    tokenizer = load_tokenizer(args.config) if os.path.isdir(args.config) else None
    args.unrecorded = check_corpus_tokenizer(
        args, vocab, record_of(tokenizer, os.path.abspath(args.config)) if tokenizer is not None else None,
        f"--config {args.config}")
    check_run_arguments(args)
    check_output_paths({**run_outputs(args), "--export": args.export})   # last: bad input creates no folder


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Pre-train; returns the summary (losses, mean step time, tokens/s, TFLOP/s) on every rank."""
    args = parse_args(argv)
    config = read_config(args)
    check_args(args, config)
    dtype = compute_dtype(args.dtype)
    runtime = axgrid.RuntimeConfig(timeout_s=args.timeout, seed=args.seed, record_timing=args.comm_timing,
                                   zero=args.zero)
    grid = axgrid.init(args.grid or "1x1x1", order=args.order, config=runtime, cp=args.cp, ep=args.ep)
    try:
        return _pretrain(args, config, grid, dtype)
    finally:
        grid.destroy()


def _pretrain(args: argparse.Namespace, config: Any, grid: axgrid.Grid, dtype: str) -> dict[str, Any]:
    settings = StepSettings.from_args(args, args.steps, dtype)
    settings.check(grid)
    rank0 = grid.rank == 0
    try:
        model = causal_lm_from_config(args.config, grid, recompute=args.recompute, seed=args.seed)
    except ValueError as e:               # a model that does not fit the grid: the same line on every rank
        raise SystemExit(f"--config {args.config}: {e}") from None
    grid.watch(model)                     # the d buckets now: with ODP the first backward reduces over d too
    opt = axgrid.adamw(decay_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, args.beta2))
    opt = axgrid.shard_optimizer(opt, model, grid)   # --zero 1|2: this d-rank's share of the state
    ckpt = RunCheckpoints(args, grid, run_config(args, config), "pretrain")
    start = ckpt.resume(model, opt)
    vocab = config.vocab_size
    data = RunData.open(args, grid, settings, seq=args.seq, seed=args.seed, vocab=vocab, start=start,
                        resumed=ckpt.extra, fallback=lambda: own_batches(args, args.seq, vocab))
    name = type(model).__name__
    params = dense_parameters(model, args.ep)
    record = {"model": name, "config": os.path.abspath(args.config), "parameters": params, "seed": args.seed,
              "seq": args.seq, "cp": args.cp, "ep": args.ep, "batch": args.batch, "microbatches": args.microbatches,
              "recompute": args.recompute, "zero": args.zero, "data": args.data, "corpus": data.describe() or None,
              "optimizer": f"AdamW ({axgrid.adamw_kind(opt)})", "goldfish_k": args.goldfish_k,
              "goldfish_h": args.goldfish_h, "goldfish_mode": args.goldfish_mode,
              "flop_formula": "(6 + 2r)*T*(P_active + 2*L*K*a): TransformerShape.flops_per_iteration"}
    # the shape's count: a mixture of experts' active experts (top-k and the router), sliding windows' keys
    flops = TransformerShape.from_hf_config(config, args.seq).flops_per_iteration(args.batch, args.recompute)
    metrics = Metrics.from_args(grid, args, flops_per_step=flops,
                                tokens_per_step=args.batch * args.seq, dtype=dtype, config=record,
                                progress=None if args.no_progress else args.steps, initial=start,
                                append=bool(args.resume))
    if rank0:
        print(f"pretrain: {name} ({params:,} parameters) from {args.config} on grid {grid.shape} ({grid.world_size} "
              f"ranks, {grid.backend}, {dtype}), batch {args.batch} x {args.seq} tokens in {args.microbatches} "
              f"micro-batch(es), data {args.data}{': ' + data.describe() if data.corpus else ''}", flush=True)
    if rank0 and args.unrecorded:
        print(f"pretrain: {unrecorded_note(args.unrecorded)}", flush=True)
    for step in range(start, args.steps):
        inputs, targets, _ = data.batch(step)      # the global batch (of a corpus, only this rank's rows are read)
        run_step(model, opt, grid, settings, step, inputs, targets, metrics)
        data.after_step(step + 1, model, grid, metrics)
        if ckpt.step_done(step + 1, model, opt, last=step + 1 == args.steps, extra=data.extra(step + 1)):
            break
    ckpt.close()
    exported = args.export if (args.export and not ckpt.stopped) else None
    if exported:
        tokenizer = load_tokenizer(args.config) if os.path.isdir(args.config) else None
        axgrid.export_pretrained(model, args.export, grid, tokenizer=tokenizer)
    losses = [r["loss"] for r in metrics.rows]
    summary = metrics.close(model=name, grid=str(grid.shape), world=grid.world_size, dtype=dtype, start_step=start,
                            losses=losses, first_loss=losses[0] if losses else None,
                            final_loss=losses[-1] if losses else None, exported=exported)
    if rank0 and not losses:
        print(f"pretrain: nothing to run: the run is already at step {args.steps} (--steps)", flush=True)
    elif rank0:
        valid = (f"; validation loss {summary['valid_loss']:.4f}, perplexity {summary['valid_ppl']:.2f}"
                 if summary.get("valid_loss") is not None else "")
        print(f"pretrain: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps{valid}; "
              f"{summary['step_s']:.3f} s/step, {summary['tokens_per_s']:.0f} tokens/s, {summary['tflops']:.4f} "
              f"TFLOP/s per device" + (f"; exported to {exported}" if exported else ""), flush=True)
    return summary


if __name__ == "__main__":
    run(main, "pretrain")     # errors said once, as one line (axgrid.launch.errors)
