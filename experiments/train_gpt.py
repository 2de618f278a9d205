"""Train a GPT on the 4D grid and log loss, time, tokens/s, TFLOP/s, memory, communication and energy per step.

    axgrid launch -n 8 -- python experiments/train_gpt.py --model gpt-tiny --grid 2x2x2x1 --data text --steps 30
    mpirun -n 64 python experiments/train_gpt.py --model gpt-20b --grid 4x4x2x2 --batch 64 --microbatches 4 \\
        --recompute --overlap oar,ors,oag --log run.jsonl          # (srun / torchrun work the same way)

Batch: ``--batch B`` sequences per optimizer step (global), split into ``--microbatches M`` accumulated
micro-batches; each micro-batch's ``B/M`` sequences are split over the data-parallel ranks (``B/(M·Gd)`` each) and
then, inside the model, over z by whole sequences (``B/(M·Gd·Gz)`` per rank: must be a whole number >= 1).
Every rank builds the same global batch from ``(seed, step)`` and takes its slice, so no data is communicated
and a resumed run sees the same batches.

Data: ``--data text`` reads ``--text-file`` (default: the public-domain KJV selections in experiments/data/) as
bytes -- the tokenizer is byte-level, vocabulary 256 -- and samples random windows; ``--data synthetic`` draws
uniform random token ids (loss stays near ln V: use it for speed, not learning).

Precision: bf16 autocast on GPU (default), fp32 on CPU (default). Optimiser: AdamW, linear warm-up then cosine
decay to ``--min-lr``, global gradient-norm clipping. Goldfish loss: ``--goldfish-k K [--goldfish-h 13]
[--goldfish-mode hash|static]`` (the loss is averaged over the kept targets of the whole step).

FLOPs per step (axgrid.spec.flops; V = vocabulary, L layers, h hidden, B·S tokens):
    with --recompute:     96·B·S·L·h²·(1 + S/(6h) + V/(16·L·h))
    without recompute:    72·B·S·L·h²·(1 + S/(6h) + V/(12·L·h))
TFLOP/s per device = FLOPs per step / time per step / number of ranks / 1e12.

Metrics (``axgrid.metrics``, the same record every driver writes): ``--log run.jsonl`` gets a ``config`` row
(model, grid, device, the peak MFU is taken against, energy source), one ``step`` row per step (loss, lr,
grad_norm, step_s, tokens_per_s, tflops, mfu, peak_mem_bytes, comm_bytes / comm_s / comm_exposed_s per grid
dimension, energy_j, power_w, tokens_per_j) and a ``summary`` row; ``--tensorboard DIR`` writes the same as
TensorBoard scalars; a progress bar on rank 0 when stderr is a terminal; ``--comm-timing`` times every
collective; ``--peak-tflops`` / ``--peak-machine local-4`` give MFU a peak where the device table has none (CPU).
``main(argv)`` returns the summary dict (every rank), so sweeps and validation scripts can call it in-process.

Checkpoints: ``--save DIR --save-every K --resume DIR`` (any grid: loading reshards). The run's settings
(:func:`run_config`: model, seed, data, schedule, batch) are saved with each checkpoint; ``--resume`` refuses a
checkpoint saved with other settings, naming them, unless ``--allow-config-change steps[,...]`` accepts the change.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import axgrid  # noqa: E402
from axgrid.memorization.goldfish import step_mask  # noqa: E402
from axgrid.spec.layout import GridError, GridShape  # noqa: E402
from axgrid.metrics import Metrics, add_arguments as add_metrics_arguments  # noqa: E402
from axgrid.models import GPT, GPTConfig  # noqa: E402
from axgrid.spec import NAMED_SIZES  # noqa: E402
from axgrid.train import cosine_lr, train_step  # noqa: E402

DEFAULT_TEXT = Path(__file__).resolve().parent / "data" / "kjv_selections.txt"


# ----------------------------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------------------------
class ByteTokenizer:
    """Byte-level tokenizer: UTF-8 bytes are the token ids (vocabulary 256), decoding replaces invalid bytes."""

    vocab_size = 256

    def encode(self, text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class TokenWindows:
    """Random windows of ``seq + 1`` tokens from a token stream ``[T]``; batch ``step`` is a function of
    (seed, step): ``batch(step, size)`` gives ``(inputs [size, seq], targets [size, seq])``."""

    def __init__(self, tokens: torch.Tensor, seq: int, seed: int, source: str = "the text") -> None:
        if tokens.numel() < seq + 2:
            raise ValueError(f"{source} has {tokens.numel()} tokens, fewer than one window of {seq + 1}")
        self.tokens, self.seq, self.seed = tokens, seq, seed

    def batch(self, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, self.tokens.numel() - self.seq - 1, (size,), generator=gen)
        win = torch.stack([self.tokens[s: s + self.seq + 1] for s in starts.tolist()])
        return win[:, :-1], win[:, 1:]


class TextBatches(TokenWindows):
    """:class:`TokenWindows` of a byte-tokenized UTF-8 text file."""

    def __init__(self, path: Path, seq: int, seed: int) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"--text-file {path} does not exist")
        super().__init__(ByteTokenizer().encode(path.read_text(encoding="utf-8")), seq, seed, str(path))


class SyntheticBatches:
    """Uniform random token ids; batch ``step`` is a function of (seed, step)."""

    def __init__(self, vocab: int, seq: int, seed: int) -> None:
        self.vocab, self.seq, self.seed = vocab, seq, seed

    def batch(self, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        win = torch.randint(0, self.vocab, (size, self.seq + 1), generator=gen)
        return win[:, :-1], win[:, 1:]


# ----------------------------------------------------------------------------------------------------------------
# checkpoints
# ----------------------------------------------------------------------------------------------------------------
def run_config(args: argparse.Namespace, cfg: GPTConfig) -> dict[str, Any]:
    """What a resumed run must share with the run that saved: the model, seed, data, schedule and batch (not
    the grid, overlap, dtype or timeout: loading reshards, and those do not change what is trained)."""
    model = {k: getattr(cfg, k) for k in ("layers", "hidden", "heads", "seq", "vocab", "ffn", "bias", "eps", "seed",
                                          "emb_std")}
    return {"model": model, "seed": args.seed, "data": args.data,
            "text_file": os.path.abspath(args.text_file) if args.data == "text" else None,
            "steps": args.steps, "schedule": {"lr": args.lr, "min_lr": args.min_lr, "warmup": args.warmup},
            "optimizer": {"weight_decay": args.weight_decay, "beta2": args.beta2, "clip": args.clip},
            "batch": args.batch, "microbatches": args.microbatches,
            "goldfish": {"k": args.goldfish_k, "h": args.goldfish_h, "mode": args.goldfish_mode}}


def save_checkpoint(directory: str, *, model: GPT, optimizer: torch.optim.Optimizer, step: int,
                    grid: axgrid.Grid, args: argparse.Namespace) -> None:
    """Save model + optimizer state after ``step`` optimizer steps (collective: every rank calls it).

    Everything else a resumed run needs is a function of ``args`` and ``step``: the data of step ``s`` is drawn
    from ``(args.seed, s)``, the learning rate from the schedule at ``s``; :func:`run_config` goes with it.
    """
    from axgrid.checkpoint import save_checkpoint as save
    save(directory, model, optimizer, grid, step=step, config=run_config(args, model.config))


def load_checkpoint(directory: str, *, model: GPT, optimizer: torch.optim.Optimizer, grid: axgrid.Grid,
                    args: argparse.Namespace) -> int:
    """Load model + optimizer state (resharding if the grid differs); return the number of steps done. Refuses a
    checkpoint saved with another :func:`run_config` unless ``--allow-config-change`` names the fields."""
    from axgrid.checkpoint import CheckpointError, ConfigMismatch, load_checkpoint as load
    allow = [f for f in (args.allow_config_change or "").split(",") if f]
    try:
        info = load(directory, model, optimizer, grid, config=run_config(args, model.config), allow_changes=allow)
    except ConfigMismatch as e:           # raised on every rank alike: a clean exit, not a traceback per rank
        msg = str(e).split("; resume with")[0]
        raise SystemExit(f"--resume {directory}: {msg}; resume with the checkpoint's settings, or pass "
                         f"--allow-config-change {','.join(e.fields)} to change them deliberately") from None
    except CheckpointError as e:
        raise SystemExit(f"--resume {directory}: {e}") from None
    if grid.rank == 0:
        print(f"train_gpt: resumed from {info.path} at step {info.step} (saved on grid {info.saved_grid}"
              f"{', resharded to ' + str(grid.shape) if info.resharded else ''})", flush=True)
    return info.step


# ----------------------------------------------------------------------------------------------------------------
# measurement helpers
# ----------------------------------------------------------------------------------------------------------------
def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up over ``--warmup`` steps, then cosine decay from ``--lr`` to ``--min-lr`` at the last step."""
    return cosine_lr(step, args.steps, args.lr, args.min_lr, args.warmup)


# ----------------------------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-tiny", help=f"one of {', '.join(NAMED_SIZES)}")
    p.add_argument("--layers", type=int, default=None, help="override the named size's layers")
    p.add_argument("--hidden", type=int, default=None, help="override the named size's hidden size")
    p.add_argument("--heads", type=int, default=None, help="override the named size's heads")
    p.add_argument("--seq", type=int, default=None, help="override the named size's sequence length")
    p.add_argument("--vocab", type=int, default=None, help="override the named size's vocabulary")
    p.add_argument("--steps", type=int, default=20)
    add_step_arguments(p)
    p.add_argument("--overlap", default="none", help="oar,ors,oag,odp | all | none")
    p.add_argument("--data", choices=("synthetic", "text"), default="synthetic")
    p.add_argument("--text-file", default=str(DEFAULT_TEXT))
    p.add_argument("--tune-gemm", choices=("off", "on-first-use", "cache-only"), default="off")
    p.add_argument("--gemm-cache", default=None, help="GEMM tuner decision file (default: the tuner's own)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and of the data order")
    add_run_arguments(p)
    p.add_argument("--allow-config-change", default=None, metavar="FIELD[,FIELD]",
                   help="resume although these settings differ from the checkpoint's, e.g. steps or model.heads")
    add_metrics_arguments(p)
    return parse_step_args(p, argv)


def parse_step_args(p: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Parse ``argv`` with a parser holding :func:`add_step_arguments`; ``--min-lr`` then defaults to ``--lr``/10
    (a default that depends on another option, which argparse cannot express)."""
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.min_lr is None:
        args.min_lr = args.lr / 10
    return args


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The grid, the collective timeout and checkpointing: shared with experiments/finetune.py."""
    p.add_argument("--grid", default=None, help="GXxGYxGZxGD (default: 1x1x1xWORLD, pure data parallel)")
    p.add_argument("--order", default="xyzd", help="rank order of the grid letters, fastest first")
    p.add_argument("--timeout", type=float, default=axgrid.RuntimeConfig.timeout_s,
                   help="seconds before a stuck collective fails")
    p.add_argument("--save", default=None, help="checkpoint directory")
    p.add_argument("--save-every", type=int, default=0, help="save every K steps (and at the end) when --save")
    p.add_argument("--resume", default=None, help="checkpoint directory to resume from")


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    """The optimizer step: batch, schedule, AdamW, clipping, recompute, autocast, Goldfish. Shared with
    experiments/finetune.py and memorization.py, which change some defaults with ``set_defaults``."""
    p.add_argument("--batch", type=int, default=8, help="global batch in sequences per optimizer step")
    p.add_argument("--microbatches", type=int, default=1, help="gradient-accumulation micro-batches per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr", type=float, default=None, help="end of the cosine decay (default lr/10)")
    p.add_argument("--warmup", type=int, default=0, help="linear warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip (0: off)")
    p.add_argument("--recompute", action="store_true", help="recompute each block's (decoder layer's) "
                                                            "activations in backward")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default=None, help="autocast; default bf16 on GPU, fp32 on CPU")
    p.add_argument("--goldfish-k", type=int, default=0, help="drop 1 target in K from the loss (0: off)")
    p.add_argument("--goldfish-h", type=int, default=13, help="context tokens hashed by the goldfish mask")
    p.add_argument("--goldfish-mode", choices=("hash", "static"), default="hash")


def build_config(args: argparse.Namespace) -> GPTConfig:
    over = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "vocab") if getattr(args, k) is not None}
    return GPTConfig.named(args.model, recompute=args.recompute, seed=args.seed, **over)


def check_args(args: argparse.Namespace, cfg: GPTConfig, shape: Optional[GridShape]) -> None:
    """Every problem with the arguments, raised identically on every rank before any collective."""
    if args.steps < 1 or args.batch < 1 or args.microbatches < 1:
        raise SystemExit(f"--steps {args.steps}, --batch {args.batch}, --microbatches {args.microbatches}: "
                         f"all must be >= 1")
    if args.batch % args.microbatches:
        raise SystemExit(f"--batch {args.batch} is not divisible by --microbatches {args.microbatches}")
    if shape is not None:
        per = args.batch // args.microbatches
        if per % (shape.gd * shape.gz):
            raise SystemExit(f"a micro-batch of {per} sequences (--batch {args.batch} / --microbatches "
                             f"{args.microbatches}) is not divisible by Gd*Gz = {shape.gd}*{shape.gz} of grid {shape}: "
                             f"data parallelism splits it over d and the model over z by whole sequences; use "
                             f"--batch a multiple of {args.microbatches * shape.gd * shape.gz}")
    if args.data == "text" and cfg.vocab < ByteTokenizer.vocab_size:
        raise SystemExit(f"--data text is byte-level (256 ids) but {cfg.name} has vocab {cfg.vocab}")
    try:
        axgrid.OverlapConfig.parse(args.overlap)
    except ValueError as e:
        raise SystemExit(f"--overlap {args.overlap}: {e}") from None
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise SystemExit(f"--timeout {args.timeout}: the seconds a stuck collective may take must be a number > 0, "
                         f"e.g. --timeout 120")
    if args.data == "text" and not os.path.isfile(args.text_file):
        raise SystemExit(f"--text-file {args.text_file} does not exist or is not a file: pass an existing UTF-8 text "
                         f"file, or use --data synthetic")
    if args.goldfish_k == 1 or args.goldfish_k < 0:
        raise SystemExit(f"--goldfish-k {args.goldfish_k}: use 0 (off) or K >= 2")
    if args.save_every and not args.save:
        raise SystemExit("--save-every needs --save DIR")


# ----------------------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Run the training; returns the summary (mean step time after warm-up, tokens/s, TFLOP/s, losses)."""
    args = parse_args(argv)
    try:
        cfg = build_config(args)
    except ValueError as e:
        raise SystemExit(f"train_gpt: {e}") from None
    world_hint = int(os.environ.get("WORLD_SIZE", os.environ.get("PMI_SIZE", os.environ.get(
        "OMPI_COMM_WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))))
    try:
        pre_shape = GridShape.parse(args.grid, world_hint) if args.grid else None
    except GridError as e:
        raise SystemExit(str(e)) from None
    check_args(args, cfg, pre_shape)
    on_gpu = torch.cuda.is_available()
    dtype = args.dtype or ("bf16" if on_gpu else "fp32")
    if not on_gpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    config = axgrid.RuntimeConfig(timeout_s=args.timeout, overlap=axgrid.OverlapConfig.parse(args.overlap),
                                  gemm_tuning=args.tune_gemm, gemm_cache=args.gemm_cache, seed=args.seed,
                                  record_timing=args.comm_timing)
    grid = axgrid.init(args.grid or "1x1x1", order=args.order, config=config)
    try:
        return _train(args, cfg, grid, dtype)
    finally:
        grid.destroy()


def _train(args: argparse.Namespace, cfg: GPTConfig, grid: axgrid.Grid, dtype: str) -> dict[str, Any]:
    check_args(args, cfg, grid.shape)
    rank0 = grid.rank == 0
    device = grid.device
    gd, d, world = grid.size("d"), grid.coord.d, grid.world_size
    model = GPT(cfg, grid)
    grid.watch(model)                     # ODP: gradients enter the d buckets during backward
    opt = torch.optim.AdamW(model.optimizer_groups(args.weight_decay), lr=args.lr, betas=(0.9, args.beta2),
                            eps=1e-8)
    try:
        data = (TextBatches(Path(args.text_file), cfg.seq, args.seed) if args.data == "text"
                else SyntheticBatches(cfg.vocab, cfg.seq, args.seed))
    except (OSError, ValueError) as e:    # the same on every rank, before any collective
        raise SystemExit(f"--text-file {args.text_file}: {e}") from None
    start = load_checkpoint(args.resume, model=model, optimizer=opt, grid=grid, args=args) if args.resume else 0
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")
    tokens_per_step = args.batch * cfg.seq
    per_mb = args.batch // args.microbatches
    bd = per_mb // gd
    formula = ("96*B*S*L*h^2*(1 + S/(6h) + V/(16*L*h))" if cfg.recompute
               else "72*B*S*L*h^2*(1 + S/(6h) + V/(12*L*h))")
    config = {"model": cfg.name, "layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads, "seq": cfg.seq,
              "vocab": cfg.vocab, "parameters": cfg.parameters(), "order": grid.order, "backend": grid.backend,
              "batch": args.batch, "microbatches": args.microbatches, "recompute": cfg.recompute,
              "overlap": args.overlap, "data": args.data, "goldfish_k": args.goldfish_k,
              "goldfish_mode": args.goldfish_mode, "tune_gemm": args.tune_gemm, "flop_formula": formula}
    metrics = Metrics.from_args(grid, args, flops_per_step=cfg.flops_per_iteration(args.batch),
                                tokens_per_step=tokens_per_step, dtype=dtype, config=config,
                                progress=None if args.no_progress else args.steps, initial=start,
                                append=bool(args.resume))
    if rank0:
        print(f"train_gpt: {cfg.name} ({cfg.parameters():,} parameters) on grid {grid.shape} ({world} ranks, "
              f"{grid.backend}, {dtype}), batch {args.batch} x {cfg.seq} tokens in {args.microbatches} "
              f"micro-batch(es), data {args.data}; energy: {metrics.meter.energy_source}", flush=True)
    from axgrid.checkpoint import SaveOnSignal
    stop = SaveOnSignal(grid).install() if args.save else None   # SIGTERM / SIGUSR1 -> save and exit
    for step in range(start, args.steps):
        inputs, targets = data.batch(step, args.batch)               # the global batch, the same on every rank
        mask, normalizer = step_mask(inputs, args.goldfish_k, args.goldfish_h, args.goldfish_mode, gd)
        lr = lr_at(step, args)
        for group in opt.param_groups:
            group["lr"] = lr

        def loss_of(mb: int) -> torch.Tensor:
            rows = slice(mb * per_mb + d * bd, mb * per_mb + (d + 1) * bd)
            x, y = inputs[rows].to(device), targets[rows].to(device)
            m = mask[rows].to(device) if mask is not None else None
            with autocast:
                return model(x, y, m, normalizer=normalizer)

        metrics.begin()
        out = train_step(model, opt, loss_of, grid, args.microbatches, clip=args.clip)
        extra = {"kept_fraction": normalizer * gd / tokens_per_step} if mask is not None else {}
        rec = metrics.end(step, loss=out.loss, lr=lr, grad_norm=out.grad_norm, **extra)
        if not math.isfinite(rec["loss"]):
            raise FloatingPointError(f"loss became {rec['loss']} at step {step}; lower --lr or check the data")
        halt = stop is not None and stop.should_stop()           # collective: all ranks agree at this boundary
        if args.save and (halt or (args.save_every and (step + 1) % args.save_every == 0) or step + 1 == args.steps):
            save_checkpoint(args.save, model=model, optimizer=opt, step=step + 1, grid=grid, args=args)
        if halt:
            if rank0:
                print(f"train_gpt: {stop.signal_name or 'a stop signal'} received; saved step {step + 1} to "
                      f"{args.save}; exiting (resume with --resume {args.save})", flush=True)
            break
    if stop is not None:
        stop.uninstall()
    losses = [r["loss"] for r in metrics.rows]
    summary = metrics.close(model=cfg.name, grid=str(grid.shape), world=world, dtype=dtype,
                            first_loss=losses[0] if losses else None, final_loss=losses[-1] if losses else None,
                            losses=losses)
    if rank0 and not losses:
        print(f"train_gpt: nothing to run: the run is already at step {args.steps} (--steps)", flush=True)
    elif rank0:
        mfu = f", MFU {summary['mfu']:.1%}" if summary["mfu"] is not None else ""
        print(f"train_gpt: loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f} in {len(losses)} "
              f"steps; {summary['step_s']:.3f} s/step, {summary['tokens_per_s']:.0f} tokens/s, "
              f"{summary['tflops']:.4f} TFLOP/s per device{mfu}, peak memory "
              f"{summary['peak_mem_bytes'] / 2**20:.0f} MiB", flush=True)
    return summary


if __name__ == "__main__":
    main()
