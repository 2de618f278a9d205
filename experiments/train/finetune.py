"""Fine-tune a Hugging Face LLaMA-family checkpoint (Llama, Mistral, Qwen2) on the grid, then export it.

    axgrid launch -n 4 -- python experiments/train/finetune.py --checkpoint PATH --grid 1x2x1x2 --seq 128 --batch 8 \\
        --microbatches 2 --steps 200 --lr 1e-4 --warmup 20 --recompute --log ft.jsonl --save ckpt --save-every 50 \\
        --export finetuned/                        # (mpirun / srun / torchrun work the same way: axgrid.init)

Model: ``--checkpoint`` is a folder written by ``save_pretrained``; ``axgrid.from_pretrained`` reads it onto
the grid in fp32, each rank only its own parts (the built-in LLaMA-family plan: residual stream sharded,
attention on local heads, vocabulary-parallel head and loss). ``--recompute`` turns on the model's
activation checkpointing of its decoder layers (``activation_checkpointing_enable``, non-reentrant).

Data, plain text: ``--text-file`` (default: the shipped KJV selections) tokenized with the checkpoint's tokenizer
when the folder has one (``AutoTokenizer``); otherwise byte-level (ids = UTF-8 bytes, which needs a vocabulary of
at least 256), said in the log's ``config`` record and on stdout. Each step's global batch is ``--batch`` random
windows of ``--seq + 1`` tokens of the text before its held-out end, drawn from ``(seed, step)`` (the same on
every rank; each takes its slice), so a resumed run sees the same batches. ``--data-path [W] PREFIX ...``
(``--split``, ``--eval-interval``, ``--eval-iters``) trains on a corpus preprocessed with the checkpoint's tokenizer
instead, as train_gpt does (docs/data.md).

Data, conversations (instruction fine-tuning): ``--chat-file`` (JSON lines of ``{"messages": [...]}`` or
``{"prompt", "response"}``; :mod:`axgrid.data.chat`), rendered with the checkpoint's chat template, packed
(``--chat-layout pack``, default) or padded (``pad``) into rows of ``--seq + 1`` tokens; the loss covers the
assistant's tokens only, normalised over the step's global count of them (with Goldfish, of those it keeps).
A malformed line ends the run before the grid starts, naming the file, the line and what is wrong.

Held-out evaluation: the last ``--heldout-frac`` of the text (of the conversations) is never trained on; at most
``--heldout-rows`` rows of it (the assistant tokens of conversations) are scored before the first step and after
the last (:meth:`axgrid.driver.RunData.evaluate`): ``eval`` rows in the log (``valid_loss``, ``valid_ppl``,
``valid_tokens``) and, in the summary, ``valid_loss_before``/``valid_ppl_before`` beside the last evaluation's
``valid_loss``/``valid_ppl``. With a corpus the validation split is scored instead, also every ``--eval-interval``
steps. ``--sample-prompt TEXT`` also answers TEXT (a user turn, greedy, ``axgrid.generate``, ``--sample-tokens``)
before and after, into the summary (``answer_before``, ``answer_after``) and stdout.

Step (:func:`axgrid.driver.run_step`, shared with train_gpt and the memorization study): ``--batch`` sequences
in ``--microbatches`` accumulated micro-batches, each split over d and (inside the model) over z by whole sequences
(``--cp N``: context parallelism, each sequence cut into ``2·N`` chunks over ``N`` z-ranks; ``--sample-prompt``, a
generation, is refused under it); bf16 autocast
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
LoRA (docs/lora.md): ``--lora-r R [--lora-alpha A] [--lora-targets q_proj,v_proj,...] [--lora-dropout P]`` freezes
the base and trains adapters on the targeted projections (:func:`axgrid.lora`; the optimizer, buckets and checkpoints
hold the adapters only); ``--export DIR`` then writes the adapter in PEFT's format to ``DIR/adapter`` and the merged
model to ``DIR``. The FLOP count stays the full fine-tuning formula (the frozen base skips its weight-gradient GEMMs).
``main(argv)`` returns the summary on every rank.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

import axgrid
from axgrid.checkpoint import list_checkpoints
from axgrid.data import DEFAULT_TEXT, ByteTokenizer, encode, load_tokenizer
from axgrid.data.chat import LAYOUTS, ChatFormatError, check_chat_tokenizer, load_chat, read_chat_file
from axgrid.data.sources import ChatSource, TextSource
from axgrid.data.tokenizer_record import record_of
from axgrid.driver import (RunCheckpoints, RunData, StepSettings, add_context_parallel_argument, add_data_arguments,
                           add_run_arguments, add_step_arguments, check_context_parallel, check_corpus_tokenizer,
                           check_data_arguments, check_output_paths, check_run_arguments, check_step_arguments,
                           check_zero, compute_dtype, data_settings, parse_step_args, run_outputs, run_step,
                           unrecorded_note)
from axgrid.launch.errors import run
from axgrid.metrics import Metrics, add_arguments as add_metrics_arguments
from axgrid.plans.causal_lm import dense_parameters, load_causal_lm
from axgrid.launch.env import LaunchError, detect_launch, grid_shape_for
from axgrid.spec import GridError, GridShape, llama_flops
from axgrid.train import decay_groups


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="Hugging Face model folder (save_pretrained)")
    p.add_argument("--text-file", default=None, help="UTF-8 text to fine-tune on (default: the shipped KJV text)")
    p.add_argument("--chat-file", default=None, help="JSON lines of conversations: instruction fine-tuning")
    p.add_argument("--chat-layout", choices=LAYOUTS, default="pack", help="conversations packed into rows, or one "
                                                                          "per row padded")
    p.add_argument("--heldout-frac", type=float, default=0.1, help="last fraction of the text or conversations held "
                                                                   "out and scored before and after (0: none)")
    p.add_argument("--heldout-rows", type=int, default=32, help="at most this many held-out rows are scored")
    p.add_argument("--sample-prompt", default=None, help="answer this user turn before and after fine-tuning")
    p.add_argument("--sample-tokens", type=int, default=48, help="tokens of the --sample-prompt answer")
    p.add_argument("--seq", type=int, default=128, help="tokens per training sequence")
    add_context_parallel_argument(p)
    p.add_argument("--steps", type=int, default=100)
    add_step_arguments(p)
    p.set_defaults(lr=1e-4, weight_decay=0.0)          # a fine-tuning learning rate, no weight decay
    p.add_argument("--seed", type=int, default=0, help="seed of the data order")
    add_data_arguments(p)
    add_run_arguments(p)
    p.add_argument("--export", default=None, help="write the fine-tuned model as a Hugging Face folder here")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA adapters of this rank on --lora-targets, the base "
                                                         "frozen (0: full fine-tuning)")
    p.add_argument("--lora-alpha", type=float, default=None, help="LoRA scale alpha/r (default: 2·r)")
    p.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                   help="comma-separated module names the adapters go on (PEFT's target_modules)")
    p.add_argument("--lora-dropout", type=float, default=0.0, help="dropout on the adapters' input")
    add_metrics_arguments(p)
    return parse_step_args(p, argv)


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """What a resumed run must share with the run that saved (not the grid, dtype or timeout: loading reshards)."""
    corpus = data_settings(args)
    own = ({"chat_file": os.path.abspath(args.chat_file), "chat_layout": args.chat_layout} if args.chat_file
           else {"text_file": os.path.abspath(args.text_file)})
    return {"checkpoint": os.path.abspath(args.checkpoint), **own, "heldout_frac": args.heldout_frac,
            "corpus": corpus.record() if corpus is not None else None,
            "seed": args.seed, "seq": args.seq, "steps": args.steps, "batch": args.batch,
            "microbatches": args.microbatches, "recompute": args.recompute,
            "schedule": {"lr": args.lr, "min_lr": args.min_lr, "warmup": args.warmup},
            "optimizer": {"weight_decay": args.weight_decay, "beta2": args.beta2, "clip": args.clip},
            "goldfish": {"k": args.goldfish_k, "h": args.goldfish_h, "mode": args.goldfish_mode},
            "lora": lora_config(args).__dict__ if args.lora_r else None}


def lora_flops_change(model: torch.nn.Module, r: int, tokens: int, recompute: bool) -> float:
    """What LoRA changes in the step's FLOPs (``perfmodel.lora.layer_flops_change``, the count perfmodel uses) over
    the model's parallel Linears: the adapted ones (``lora`` set), the head not recomputed."""
    from axgrid.perfmodel.lora import layer_flops_change
    from axgrid.spec import FCLayer
    head = model.get_output_embeddings()
    layers = [(FCLayer(m.out_features, m.in_features, m.transpose, False, name, recompute=m is not head), 1,
               m.lora is not None) for name, m in model.named_modules() if isinstance(m, axgrid.nn.Linear)]
    return layer_flops_change(layers, r, tokens, recompute)


def lora_config(args: argparse.Namespace) -> "axgrid.LoraConfig":
    """The run's LoRA settings (``--lora-*``), checked (one line naming a bad value)."""
    targets = tuple(t.strip() for t in args.lora_targets.split(",") if t.strip())
    alpha = 2.0 * args.lora_r if args.lora_alpha is None else args.lora_alpha
    cfg = axgrid.LoraConfig(r=args.lora_r, alpha=alpha, targets=targets, dropout=args.lora_dropout)
    try:
        cfg.check()
    except ValueError as e:
        raise SystemExit(f"--lora-*: {e}") from None
    return cfg


def check_args(args: argparse.Namespace) -> None:
    """Problems visible without the grid, raised identically on every rank before any collective (a chat file is
    read and checked line by line here: ``args.conversations``)."""
    if not os.path.isdir(args.checkpoint):
        raise SystemExit(f"--checkpoint {args.checkpoint} is not a folder: pass a Hugging Face model folder written "
                         f"by save_pretrained")
    saved = list_checkpoints(args.checkpoint) or os.path.isfile(os.path.join(args.checkpoint, "manifest.json"))
    if saved and not os.path.isfile(os.path.join(args.checkpoint, "config.json")):
        raise SystemExit(f"--checkpoint {args.checkpoint} is an axgrid checkpoint folder (written by --save), not a "
                         f"Hugging Face model folder: continue that run with --resume {args.checkpoint} and the "
                         f"--checkpoint it was started from, or start from a folder written by save_pretrained or "
                         f"--export")
    if args.chat_file and args.text_file:
        raise SystemExit(f"--chat-file {args.chat_file} and --text-file {args.text_file}: pass one of them")
    if args.text_file is None and args.chat_file is None:
        args.text_file = str(DEFAULT_TEXT)
    if not args.data_path and args.text_file is not None and not os.path.isfile(args.text_file):
        raise SystemExit(f"--text-file {args.text_file} does not exist or is not a file: pass a UTF-8 text file")
    if args.chat_file is not None and not os.path.isfile(args.chat_file):
        raise SystemExit(f"--chat-file {args.chat_file} does not exist or is not a file: pass a JSON-lines file")
    if args.seq < 1:
        raise SystemExit(f"--seq {args.seq}: tokens per sequence must be >= 1")
    if not 0 <= args.heldout_frac < 1 or args.heldout_rows < 1 or args.sample_tokens < 1:
        raise SystemExit(f"--heldout-frac {args.heldout_frac}, --heldout-rows {args.heldout_rows}, --sample-tokens "
                         f"{args.sample_tokens}: the fraction must be in [0, 1), the counts >= 1")
    if args.steps < 1:
        raise SystemExit(f"--steps {args.steps}: must be >= 1")
    check_step_arguments(args, args.steps)
    if args.cp > 1 and args.sample_prompt is not None:
        raise SystemExit(f"--sample-prompt with --cp {args.cp}: generation (a KV cache) under context parallelism is "
                         f"not supported; drop --sample-prompt, or --export the model and generate on a grid "
                         f"without --cp")
    if args.lora_r < 0:
        raise SystemExit(f"--lora-r {args.lora_r}: the adapters' rank must be >= 1 (0: full fine-tuning)")
    if args.lora_r:
        lora_config(args)
    check_run_arguments(args)
    check_data_arguments(args)
    if args.data_path and args.chat_file:
        raise SystemExit(f"--data-path and --chat-file {args.chat_file}: pass one of them")
    args.unrecorded = []
    if args.data_path:                # the corpus' tokenizer is the checkpoint's (PREFIX.tokenizer.json)
        tokenizer = load_tokenizer(args.checkpoint)
        try:
            with open(os.path.join(args.checkpoint, "config.json"), encoding="utf-8") as f:
                vocab = int(json.load(f).get("vocab_size") or 0) or len(tokenizer or ())
        except (OSError, ValueError) as e:
            raise SystemExit(f"--checkpoint {args.checkpoint}: no readable config.json ({e}); pass a folder written "
                             f"by save_pretrained") from None
        args.unrecorded = check_corpus_tokenizer(
            args, vocab, record_of(tokenizer, os.path.abspath(args.checkpoint)) if tokenizer is not None else None,
            f"--checkpoint {args.checkpoint}")
    try:
        shape = grid_shape_for(args.grid or "1x1x1", detect_launch(use_mpi=False))
    except (GridError, LaunchError) as e:
        raise SystemExit(f"finetune: {e}") from None
    check_zero(args.zero, shape)
    check_context_parallel(args.cp, args.seq, shape)
    args.conversations = None
    if args.chat_file:
        try:
            args.conversations = read_chat_file(args.chat_file)
        except ChatFormatError as e:
            raise SystemExit(f"--chat-file {e}") from None
    check_output_paths({**run_outputs(args), "--export": args.export})   # last: bad input creates no folder


def data_of(args: argparse.Namespace, tokenizer: Optional[Any], vocab: int) -> TextSource | ChatSource:
    """The run's own training batches and held-out rows (SystemExit, identically on every rank, when the text or
    the conversations cannot be used with this checkpoint)."""
    if tokenizer is None and vocab < ByteTokenizer.vocab_size:
        raise SystemExit(f"--checkpoint {args.checkpoint} has no tokenizer and a vocabulary of {vocab} < 256, so the "
                         f"byte-level fallback cannot encode the text; save a tokenizer with the checkpoint")
    try:
        if args.chat_file:
            check_chat_tokenizer(tokenizer, args.checkpoint)
            chat = load_chat(args.chat_file, tokenizer, args.seq, args.chat_layout, args.heldout_frac, args.seed,
                             conversations=args.conversations)
            data: TextSource | ChatSource = ChatSource(chat, args.heldout_rows)
        else:
            tokens = encode(Path(args.text_file).read_text(encoding="utf-8"), tokenizer)
            data = TextSource(tokens, args.seq, args.seed, args.heldout_frac, args.heldout_rows, args.text_file)
    except ChatFormatError as e:
        raise SystemExit(f"--chat-file {e}") from None
    except ValueError as e:
        raise SystemExit(f"--text-file {e}; use a longer text, a smaller --seq or another --heldout-frac") from None
    if data.max_id >= vocab:
        source = f"--chat-file {args.chat_file}" if args.chat_file else f"--text-file {args.text_file}"
        raise SystemExit(f"{source} encodes to id {data.max_id} >= the model's vocabulary {vocab}: the tokenizer "
                         f"does not belong to this checkpoint")
    return data


def answer(model: torch.nn.Module, grid: axgrid.Grid, tokenizer: Any, prompt: str, tokens: int) -> str:
    """The greedy answer to the user turn ``prompt`` (after the chat template's generation prompt;
    ``axgrid.generate``, the prompt repeated once per data-parallel and z rank), up to the end-of-turn token."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    ids = ids.expand(grid.size("d") * grid.size("z"), -1).contiguous()
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = axgrid.generate(model, ids.to(grid.device), grid, tokens, eos_token_id=tokenizer.eos_token_id)
    model.train(was_training)
    return tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True).strip()


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Fine-tune; returns the summary (losses, mean step time, tokens/s, TFLOP/s) on every rank."""
    args = parse_args(argv)
    check_args(args)
    dtype = compute_dtype(args.dtype)
    config = axgrid.RuntimeConfig(timeout_s=args.timeout, seed=args.seed, record_timing=args.comm_timing,
                                  zero=args.zero)
    grid = axgrid.init(args.grid or "1x1x1", order=args.order, config=config, cp=args.cp)
    try:
        return _finetune(args, grid, dtype)
    finally:
        grid.destroy()


def _finetune(args: argparse.Namespace, grid: axgrid.Grid, dtype: str) -> dict[str, Any]:
    settings = StepSettings.from_args(args, args.steps, dtype)
    settings.check(grid)
    rank0 = grid.rank == 0
    tokenizer = load_tokenizer(args.checkpoint)
    if args.sample_prompt is not None and (tokenizer is None or not getattr(tokenizer, "chat_template", None)):
        raise SystemExit(f"--sample-prompt needs a checkpoint with a tokenizer and a chat template; "
                         f"{args.checkpoint} has none")
    model = load_causal_lm(args.checkpoint, grid, args.recompute)
    if args.lora_r:                       # the base frozen, adapters on the targets (before the buckets are built)
        axgrid.lora(model, grid, lora_config(args))
    grid.watch(model)                     # the d buckets now: with ODP the first backward reduces over d too
    mcfg = model.config
    opt = axgrid.adamw(decay_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, args.beta2))
    opt = axgrid.shard_optimizer(opt, model, grid)   # --zero 1|2: this d-rank's share of the state
    ckpt = RunCheckpoints(args, grid, run_config(args), "finetune")
    start = ckpt.resume(model, opt)
    data = RunData.open(args, grid, settings, seq=args.seq, seed=args.seed, vocab=mcfg.vocab_size, start=start,
                        resumed=ckpt.extra, fallback=lambda: data_of(args, tokenizer, mcfg.vocab_size))
    own = data.batches.info if data.corpus is None else {}
    flops = llama_flops(mcfg, args.batch, args.seq, args.recompute)
    if args.lora_r:                       # the frozen base's weight gradients gone, the adapters' GEMMs added
        flops += lora_flops_change(model, args.lora_r, args.batch * args.seq, args.recompute)
    tok_name = type(tokenizer).__name__ if tokenizer is not None else "byte-level fallback (no tokenizer in checkpoint)"
    config = {"model": type(model).__name__, "checkpoint": args.checkpoint, "parameters": dense_parameters(model),
              "lora": run_config(args)["lora"], "tokenizer": tok_name, "optimizer": f"AdamW ({axgrid.adamw_kind(opt)})",
              "data": "corpus" if data.corpus is not None else None, **own,
              "text_file": None if (args.chat_file or data.corpus) else args.text_file, "chat_file": args.chat_file,
              "chat_layout": args.chat_layout if args.chat_file else None, "corpus": data.describe() or None,
              "seq": args.seq, "cp": args.cp, "batch": args.batch,
              "microbatches": args.microbatches, "recompute": args.recompute, "goldfish_k": args.goldfish_k,
              "goldfish_h": args.goldfish_h, "goldfish_mode": args.goldfish_mode,
              "flop_formula": "(6 + 2r)*P*B*S + (6 + 2r)*2*L*S*a*B*S"}
    metrics = Metrics.from_args(grid, args, flops_per_step=flops, tokens_per_step=args.batch * args.seq, dtype=dtype,
                                config=config, progress=None if args.no_progress else args.steps, initial=start,
                                append=bool(args.resume))
    if rank0:
        print(f"finetune: {type(model).__name__} from {args.checkpoint} on grid {grid.shape} ({grid.world_size} "
              f"ranks, {dtype}); tokenizer: {tok_name}; "
              f"{data.describe() if data.corpus else data.batches.describe}; batch {args.batch} x "
              f"{args.seq} in {args.microbatches} micro-batch(es)", flush=True)
    if rank0 and args.unrecorded:
        print(f"finetune: {unrecorded_note(args.unrecorded)}", flush=True)
    extra: dict[str, Any] = {}

    def evaluate(when: str, steps_done: int) -> None:
        """Held-out loss and perplexity (and the sample answer) ``before`` or ``after``: an eval row, the summary."""
        if data.has_validation and not (metrics.evals and metrics.evals[-1]["step"] == steps_done):
            row = data.evaluate(steps_done, model, grid, metrics)
            if when == "before":
                extra.update(valid_loss_before=row["valid_loss"], valid_ppl_before=row["valid_ppl"])
        if args.sample_prompt is not None:
            extra[f"answer_{when}"] = answer(model, grid, tokenizer, args.sample_prompt, args.sample_tokens)
        if rank0 and (metrics.evals or args.sample_prompt is not None):
            last = metrics.evals[-1] if metrics.evals else None
            held = (f"held-out loss {last['valid_loss']:.4f}, perplexity {last['valid_ppl']:.2f}" if last else "")
            said = f"; answer: {extra[f'answer_{when}']!r}" if args.sample_prompt is not None else ""
            print(f"finetune: {when} step {steps_done}: {held}{said}", flush=True)

    evaluate("before", start)
    for step in range(start, args.steps):
        inputs, targets, mask = data.batch(step)
        run_step(model, opt, grid, settings, step, inputs, targets, metrics, loss_mask=mask)
        data.after_step(step + 1, model, grid, metrics)
        if ckpt.step_done(step + 1, model, opt, last=step + 1 == args.steps, extra=data.extra(step + 1)):
            break
    ckpt.close()
    if not ckpt.stopped:
        evaluate("after", args.steps)
    exported = args.export if (args.export and not ckpt.stopped) else None
    if exported and args.lora_r:          # the adapter alone in PEFT's format, then the merged model
        axgrid.save_adapter(model, os.path.join(args.export, "adapter"), grid,
                            base_model_name_or_path=os.path.abspath(args.checkpoint))
        axgrid.merge_lora(model)
    if exported:
        axgrid.export_pretrained(model, args.export, grid, tokenizer=tokenizer)
    losses = [r["loss"] for r in metrics.rows]
    summary = metrics.close(start_step=start, losses=losses, exported=exported, **extra)
    if rank0 and losses:
        held = (f"; held-out perplexity {summary['valid_ppl_before']:.2f} -> {summary['valid_ppl']:.2f}"
                if "valid_ppl_before" in summary and "valid_ppl" in summary else "")
        print(f"finetune: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps{held}; "
              f"{summary['step_s']:.3f} s/step, {summary['tokens_per_s']:.0f} tokens/s, {summary['tflops']:.4f} "
              f"TFLOP/s per device" + (f"; exported to {args.export}" if summary["exported"] else ""), flush=True)
    return summary


if __name__ == "__main__":
    run(main, "finetune")     # errors said once, as one line (axgrid.launch.errors)
