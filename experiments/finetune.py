"""Fine-tune a Hugging Face LLaMA-family checkpoint (Llama, Mistral, Qwen2) on the grid, then export it.

    axgrid launch -n 4 -- python experiments/finetune.py --checkpoint PATH --grid 1x2x1x2 --seq 128 --batch 8 \\
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
resumed run sees the same batches.

Step (``train_step``, shared with the memorization study): ``--batch`` sequences in ``--microbatches``
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
on any grid (loading reshards; a checkpoint saved with other settings is refused, naming them). ``--export DIR``
writes the fine-tuned model as a Hugging Face folder (``axgrid.export_pretrained``, plus the tokenizer).
``main(argv)`` returns the summary on every rank.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import axgrid  # noqa: E402
from axgrid.memorization.goldfish import step_mask  # noqa: E402
from axgrid.metrics import Metrics, add_arguments as add_metrics_arguments  # noqa: E402
from axgrid.models import GPT  # noqa: E402
from axgrid.train import cosine_lr, decay_groups, train_step  # noqa: E402
from train_gpt import DEFAULT_TEXT, ByteTokenizer, TokenWindows, add_run_arguments, parse_step_args  # noqa: E402
from train_gpt import add_step_arguments as add_gpt_step_arguments  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


# ----------------------------------------------------------------------------------------------------------------
# model and tokenizer
# ----------------------------------------------------------------------------------------------------------------
def load_tokenizer(path: str) -> Optional[Any]:
    """The checkpoint folder's own tokenizer (``AutoTokenizer``), or None when the folder has none."""
    if not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def encode(text: str, tokenizer: Optional[Any]) -> torch.Tensor:
    """``text`` as token ids ``[T]``: the tokenizer's (no special tokens added), or UTF-8 bytes without one."""
    if tokenizer is None:
        return ByteTokenizer().encode(text)
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


def load_model(path: str, grid: axgrid.Grid, recompute: bool = False) -> torch.nn.Module:
    """The Hugging Face causal LM at ``path`` in fp32 on ``grid`` (``axgrid.from_pretrained``: each rank reads its
    own parts), in training mode; ``recompute``: activation checkpointing of the decoder layers."""
    model = axgrid.from_pretrained(path, grid, torch_dtype=torch.float32)
    model.config.use_cache = False
    if recompute:
        kw = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):          # transformers >= 5.x's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    return model.train()


def llama_flops(config: Any, batch: int, seq: int, recompute: bool) -> float:
    """FLOPs of one training step of a LLaMA-family model on ``batch x seq`` tokens (see the module doc)."""
    h, layers = config.hidden_size, config.num_hidden_layers
    hd = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q, kv, f = config.num_attention_heads * hd, config.num_key_value_heads * hd, config.intermediate_size
    matrices = layers * (h * q + 2 * h * kv + q * h + 3 * h * f) + h * config.vocab_size
    per_token = 6 + 2 * int(recompute)
    tokens = batch * seq
    return per_token * matrices * tokens + per_token * 2 * layers * seq * q * tokens


def causal_lm_loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                   mask: Optional[torch.Tensor], normalizer: float) -> torch.Tensor:
    """The summed cross entropy over the kept targets of ``inputs/targets [b, S]`` divided by ``normalizer``, for
    axgrid's GPT or a Hugging Face causal LM (dropped targets become ``-100`` labels; ``shift_labels`` are the
    targets, so no shift happens inside the model's loss)."""
    if isinstance(model, GPT):
        return model(inputs, targets, mask, normalizer=normalizer)
    labels = targets if mask is None else targets.masked_fill(mask == 0, -100)
    out = model(input_ids=inputs, labels=labels, shift_labels=labels, num_items_in_batch=normalizer, use_cache=False)
    return out.loss


# ----------------------------------------------------------------------------------------------------------------
# one optimizer step (shared with experiments/memorization.py)
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepSettings:
    """What every optimizer step of a run shares: batch (global sequences, micro-batches), schedule, clipping,
    Goldfish, and precision."""
    steps: int
    batch: int
    microbatches: int = 1
    lr: float = 1e-4
    min_lr: float = 1e-5
    warmup: int = 0
    clip: float = 1.0
    goldfish_k: int = 0
    goldfish_h: int = 13
    goldfish_mode: str = "hash"
    bf16: bool = False

    def check(self, grid: axgrid.Grid) -> None:
        """Every problem, raised identically on every rank before any collective."""
        if self.steps < 1 or self.batch < 1 or self.microbatches < 1:
            raise SystemExit(f"--steps {self.steps}, --batch {self.batch}, --microbatches {self.microbatches}: all "
                             f"must be >= 1")
        per = self.batch // self.microbatches
        split = grid.size("d") * grid.size("z")
        if self.batch % self.microbatches or per % split:
            raise SystemExit(f"--batch {self.batch} in {self.microbatches} micro-batch(es) does not split into whole "
                             f"sequences over Gd*Gz = {split} of grid {grid.shape}: use --batch a multiple of "
                             f"{self.microbatches * split}")
        if self.goldfish_k == 1 or self.goldfish_k < 0:
            raise SystemExit(f"--goldfish-k {self.goldfish_k}: use 0 (off) or K >= 2")


def run_step(model: torch.nn.Module, opt: torch.optim.Optimizer, grid: axgrid.Grid, s: StepSettings, step: int,
             inputs: torch.Tensor, targets: torch.Tensor, metrics: Metrics) -> dict[str, Any]:
    """One optimizer step on the global batch ``inputs/targets [B, S]`` (the same on every rank), measured by
    ``metrics``; returns the step's row (``loss``: the step's mean over kept targets, the same on every rank;
    ``lr``, ``grad_norm``, ``kept_fraction`` under Goldfish; the rest is :mod:`axgrid.metrics`')."""
    device = grid.device
    gd, d = grid.size("d"), grid.coord.d
    mask, normalizer = step_mask(inputs, s.goldfish_k, s.goldfish_h, s.goldfish_mode, gd)
    lr = cosine_lr(step, s.steps, s.lr, s.min_lr, s.warmup)
    for group in opt.param_groups:
        group["lr"] = lr
    per_mb = s.batch // s.microbatches
    bd = per_mb // gd
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=s.bf16)

    def loss_of(mb: int) -> torch.Tensor:
        rows = slice(mb * per_mb + d * bd, mb * per_mb + (d + 1) * bd)
        m = mask[rows].to(device) if mask is not None else None
        with autocast:
            return causal_lm_loss(model, inputs[rows].to(device), targets[rows].to(device), m, normalizer)

    metrics.begin()
    out = train_step(model, opt, loss_of, grid, s.microbatches, clip=s.clip)
    extra = {"kept_fraction": normalizer * gd / inputs.numel()} if mask is not None else {}
    row = metrics.end(step, loss=out.loss, lr=lr, grad_norm=out.grad_norm, **extra)
    if not math.isfinite(row["loss"]):
        raise FloatingPointError(f"loss became {row['loss']} at step {step}; lower --lr or check the data")
    return row


# ----------------------------------------------------------------------------------------------------------------
# arguments and checkpoints
# ----------------------------------------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="Hugging Face model folder (save_pretrained)")
    p.add_argument("--text-file", default=str(DEFAULT_TEXT), help="UTF-8 text to fine-tune on")
    p.add_argument("--seq", type=int, default=128, help="tokens per training sequence")
    p.add_argument("--steps", type=int, default=100)
    add_step_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the data order")
    add_run_arguments(p)
    p.add_argument("--export", default=None, help="write the fine-tuned model as a Hugging Face folder here")
    add_metrics_arguments(p)
    return parse_step_args(p, argv)


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    """The options of :class:`StepSettings` (and the optimizer): train_gpt's, with a fine-tuning learning rate and
    no weight decay by default (experiments/memorization.py changes more with ``set_defaults``)."""
    add_gpt_step_arguments(p)
    p.set_defaults(lr=1e-4, weight_decay=0.0)


def step_settings(args: argparse.Namespace, steps: int, dtype: str, goldfish: bool = True) -> StepSettings:
    """The :class:`StepSettings` of the options of :func:`add_step_arguments` (Goldfish off unless ``goldfish``)."""
    return StepSettings(steps=steps, batch=args.batch, microbatches=args.microbatches, lr=args.lr,
                        min_lr=args.min_lr, warmup=args.warmup, clip=args.clip,
                        goldfish_k=args.goldfish_k if goldfish else 0, goldfish_h=args.goldfish_h,
                        goldfish_mode=args.goldfish_mode, bf16=dtype == "bf16")


def compute_dtype(requested: Optional[str]) -> str:
    """``--dtype`` or its default (bf16 on a GPU, fp32 on a CPU); on a CPU also sets torch's threads to
    ``OMP_NUM_THREADS`` (default 1 per rank)."""
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    return requested or ("bf16" if on_gpu else "fp32")


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """What a resumed run must share with the run that saved (not the grid, dtype or timeout: loading reshards)."""
    return {"checkpoint": os.path.abspath(args.checkpoint), "text_file": os.path.abspath(args.text_file),
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
    if not os.path.isfile(args.text_file):
        raise SystemExit(f"--text-file {args.text_file} does not exist or is not a file: pass a UTF-8 text file")
    if args.seq < 1:
        raise SystemExit(f"--seq {args.seq}: tokens per sequence must be >= 1")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise SystemExit(f"--timeout {args.timeout}: must be a number of seconds > 0, e.g. --timeout 120")
    if args.save_every and not args.save:
        raise SystemExit("--save-every needs --save DIR")


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


# ----------------------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Fine-tune; returns the summary (losses, mean step time, tokens/s, TFLOP/s) on every rank."""
    args = parse_args(argv)
    check_args(args)
    dtype = compute_dtype(args.dtype)
    config = axgrid.RuntimeConfig(timeout_s=args.timeout, seed=args.seed, record_timing=args.comm_timing)
    grid = axgrid.init(args.grid or "1x1x1", order=args.order, config=config)
    try:
        return _finetune(args, grid, dtype)
    finally:
        grid.destroy()


def _finetune(args: argparse.Namespace, grid: axgrid.Grid, dtype: str) -> dict[str, Any]:
    settings = step_settings(args, args.steps, dtype)
    settings.check(grid)
    rank0 = grid.rank == 0
    tokenizer = load_tokenizer(args.checkpoint)
    model = load_model(args.checkpoint, grid, args.recompute)
    mcfg = model.config
    data = data_of(args, tokenizer, mcfg.vocab_size)
    opt = torch.optim.AdamW(decay_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, args.beta2), eps=1e-8)
    start = load_checkpoint(args, model, opt, grid) if args.resume else 0
    flops = llama_flops(mcfg, args.batch, args.seq, args.recompute)
    tok_name = type(tokenizer).__name__ if tokenizer is not None else "byte-level fallback (no tokenizer in checkpoint)"
    config = {"model": type(model).__name__, "checkpoint": args.checkpoint, "parameters": dense_parameters(model),
              "tokenizer": tok_name, "text_tokens": int(data.tokens.numel()), "seq": args.seq, "batch": args.batch,
              "microbatches": args.microbatches, "recompute": args.recompute, "goldfish_k": args.goldfish_k,
              "goldfish_h": args.goldfish_h, "goldfish_mode": args.goldfish_mode,
              "flop_formula": "(6 + 2r)*P*B*S + (6 + 2r)*2*L*S*a*B*S"}
    metrics = Metrics.from_args(grid, args, flops_per_step=flops, tokens_per_step=args.batch * args.seq, dtype=dtype,
                                config=config, progress=None if args.no_progress else args.steps, initial=start,
                                append=bool(args.resume))
    if rank0:
        print(f"finetune: {type(model).__name__} from {args.checkpoint} on grid {grid.shape} ({grid.world_size} "
              f"ranks, {dtype}); tokenizer: {tok_name}; {data.tokens.numel():,} tokens of text; batch {args.batch} x "
              f"{args.seq} in {args.microbatches} micro-batch(es)", flush=True)
    from axgrid.checkpoint import SaveOnSignal
    stop = SaveOnSignal(grid).install() if args.save else None
    for step in range(start, args.steps):
        inputs, targets = data.batch(step, args.batch)
        run_step(model, opt, grid, settings, step, inputs, targets, metrics)
        halt = stop is not None and stop.should_stop()
        if args.save and (halt or (args.save_every and (step + 1) % args.save_every == 0) or step + 1 == args.steps):
            from axgrid.checkpoint import save_checkpoint
            save_checkpoint(args.save, model, opt, grid, step=step + 1, config=run_config(args))
        if halt:
            if rank0:
                print(f"finetune: {stop.signal_name or 'a stop signal'} received; saved step {step + 1} to "
                      f"{args.save}; exiting (resume with --resume {args.save})", flush=True)
            break
    if stop is not None:
        stop.uninstall()
    finished = not (stop is not None and stop.stopped)
    if args.export and finished:
        axgrid.export_pretrained(model, args.export, grid, tokenizer=tokenizer)
    losses = [r["loss"] for r in metrics.rows]
    exported = args.export if (args.export and finished) else None
    summary = metrics.close(start_step=start, losses=losses, exported=exported)
    if rank0 and losses:
        print(f"finetune: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps; {summary['step_s']:.3f} "
              f"s/step, {summary['tokens_per_s']:.0f} tokens/s, {summary['tflops']:.4f} TFLOP/s per device"
              + (f"; exported to {args.export}" if summary["exported"] else ""), flush=True)
    return summary


def dense_parameters(model: torch.nn.Module) -> int:
    """Parameters of the dense model (a parallel parameter counts its dense shape, ``axgrid_tile``)."""
    return sum(math.prod(t.dense_shape) if (t := getattr(p, "axgrid_tile", None)) is not None else p.numel()
               for p in model.parameters())


def load_checkpoint(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer,
                    grid: axgrid.Grid) -> int:
    """Load model + optimizer (resharding if the grid differs); the number of steps done. Refuses a checkpoint
    saved with other settings, naming them."""
    from axgrid.checkpoint import CheckpointError, ConfigMismatch, load_checkpoint as load
    try:
        info = load(args.resume, model, opt, grid, config=run_config(args))
    except (ConfigMismatch, CheckpointError) as e:     # raised on every rank alike
        raise SystemExit(f"--resume {args.resume}: {e}") from None
    if grid.rank == 0:
        print(f"finetune: resumed from {info.path} at step {info.step}", flush=True)
    return info.step


if __name__ == "__main__":
    main()
