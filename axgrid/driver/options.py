"""The command-line options every training driver shares, and the defaults that depend on the machine.

    p = argparse.ArgumentParser()
    add_step_arguments(p)               # batch, micro-batches, schedule, AdamW, clipping, recompute, dtype, Goldfish
    add_run_arguments(p)                # grid, order, timeout, --zero, checkpoints
    add_data_arguments(p)               # --data-path, --split, --data-cache, --eval-interval, --eval-iters
    args = parse_step_args(p, argv)     # --min-lr defaults to --lr/10
    check_step_arguments(args, steps)   # the schedule and AdamW's options: SystemExit with one line on every rank
    check_run_arguments(args)           # raises SystemExit with one line, identically on every rank
    check_zero(args.zero, shape)        # --zero > 0 needs Gd > 1
    check_context_parallel(args.cp, seq, shape)   # --cp: a sequence cut into 2·cp chunks, cp dividing Gz
    check_data_arguments(args)          # the same for the data options
    check_output_paths({**run_outputs(args), "--export": args.export})   # last: created and written to
"""
from __future__ import annotations

import argparse
import math
import os
import socket
from typing import Any, Mapping, Optional, Sequence

from ..core.config import RuntimeConfig
from ..launch.errors import usage_errors_raise
from ..spec.layout import GridShape


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    """The optimizer step: batch, schedule, AdamW, clipping, recompute, autocast, Goldfish (a driver changes
    defaults with ``set_defaults``)."""
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


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The grid, the collective timeout, the sharding over d (``--zero``) and checkpointing."""
    p.add_argument("--grid", default=None, help="GXxGYxGZxGD (default: 1x1x1xWORLD, pure data parallel)")
    p.add_argument("--order", default="xyzd", help="rank order of the grid letters, fastest first")
    p.add_argument("--timeout", type=float, default=RuntimeConfig.timeout_s,
                   help="seconds before a stuck collective fails")
    p.add_argument("--zero", type=int, choices=(0, 1, 2), default=0,
                   help="shard over the data-parallel ranks (Gd > 1): 1 the optimizer state, 2 also the gradients "
                        "(RuntimeConfig.zero; docs/training.md#sharding-over-d-zero)")
    p.add_argument("--save", default=None, help="checkpoint directory")
    p.add_argument("--save-every", type=int, default=0, help="save every K steps (and at the end) when --save")
    p.add_argument("--resume", default=None, help="checkpoint directory to resume from")
    p.add_argument("--keep", type=int, default=2, metavar="N",
                   help="checkpoints kept under --save: the newest N, older ones deleted after each save (0: keep "
                        "all); the checkpoint --resume loaded is never deleted (default 2)")
    p.add_argument("--allow-config-change", default=None, metavar="FIELD[,FIELD]",
                   help="resume although these settings differ from the checkpoint's, e.g. steps or model.heads")


def add_data_arguments(p: argparse.ArgumentParser, evaluation: bool = True) -> None:
    """A preprocessed corpus (:class:`axgrid.data.Corpus`) and, with ``evaluation``, validation during training."""
    g = p.add_argument_group("corpus (python -m axgrid.data preprocess; docs/data.md)")
    g.add_argument("--data-path", nargs="+", default=None, metavar="[WEIGHT] PREFIX",
                   help="indexed dataset(s) PREFIX.bin/.idx; a blend as weight-prefix pairs: 0.7 A 0.3 B")
    g.add_argument("--split", default="949,50,1", help="train,validation,test shares of each dataset's documents")
    g.add_argument("--allow-tokenizer-mismatch", action="store_true",
                   help="train on a corpus whose recorded tokenizer (PREFIX.tokenizer.json) is not the model's")
    g.add_argument("--data-cache", default=None, metavar="DIR",
                   help="where the sample index is cached (default: axgrid_cache/ next to each dataset); every "
                        "rank must see it")
    if evaluation:
        g.add_argument("--eval-interval", type=int, default=0,
                       help="every N steps (and after the last) the validation loss and perplexity (0: never)")
        g.add_argument("--eval-iters", type=int, default=10, help="validation batches (of --batch) per evaluation")


def data_settings(args: argparse.Namespace):
    """The :class:`axgrid.data.DataSettings` of :func:`add_data_arguments`' options (None without --data-path)."""
    if not args.data_path:
        return None
    from ..data.corpus import DataSettings
    return DataSettings(tuple(args.data_path), args.split, args.data_cache)


def check_data_arguments(args: argparse.Namespace) -> None:
    """Problems with :func:`add_data_arguments`' options (blend weights, split, evaluation), raised identically
    on every rank before any collective."""
    from ..data.indexed import DataError
    settings = data_settings(args)
    if settings is not None:
        try:
            settings.blend()
            settings.fractions()
        except DataError as e:
            raise SystemExit(str(e)) from None
    interval = getattr(args, "eval_interval", 0)
    if interval < 0:
        raise SystemExit(f"--eval-interval {interval}: use a number of steps >= 1, or 0 for no evaluation")
    if interval and args.eval_iters < 1:
        raise SystemExit(f"--eval-iters {args.eval_iters}: evaluate at least 1 batch")
    if interval and settings is None:
        raise SystemExit(f"--eval-interval {interval} needs --data-path: the validation loss is measured on the "
                         f"corpus' validation split (--split)")


def check_corpus_tokenizer(args: argparse.Namespace, vocab: int, want: Optional[dict] = None,
                           whose: str = "") -> list[str]:
    """The ``--data-path`` corpora against the model: each one's recorded tokenizer (:mod:`axgrid.data.
    tokenizer_record`) must be ``want`` (the tokenizer of ``whose``, e.g. ``--checkpoint DIR``; None: a model
    without one, of which only the ``vocab`` size is known) and hold at most ``vocab`` ids, unless
    ``--allow-tokenizer-mismatch``: SystemExit with one line, identically on every rank before any collective.
    Returns the prefixes without a record (their token ids are still checked against ``vocab`` by the corpus)."""
    from ..data.tokenizer_record import mismatch, read_record
    settings = data_settings(args)
    if settings is None:
        return []
    unrecorded = []
    for _, prefix in settings.blend():
        try:
            record = read_record(prefix)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        if record is None:
            unrecorded.append(prefix)
            continue
        if getattr(args, "allow_tokenizer_mismatch", False):
            continue
        line = mismatch(prefix, record, want, whose) if want is not None else None
        if line is None and record["vocab_size"] > vocab:
            line = (f"--data-path {prefix} was preprocessed with tokenizer {record['name']} of "
                    f"{record['vocab_size']:,} ids, more than the model's vocabulary {vocab:,}; preprocess it with "
                    f"the model's tokenizer, use a model with a vocabulary >= {record['vocab_size']:,}, or pass "
                    f"--allow-tokenizer-mismatch")
        if line is not None:
            raise SystemExit(line)
    return unrecorded


def unrecorded_note(prefixes: Sequence[str]) -> str:
    """What a driver says (once, rank 0) of corpora without a tokenizer record."""
    return (f"{', '.join(prefixes)}: no tokenizer record (PREFIX.tokenizer.json: preprocessed by an older axgrid or "
            f"by Megatron), so its tokenizer is not checked, only its token ids against the vocabulary; preprocess "
            f"again with python -m axgrid.data preprocess to record it")


def parse_step_args(p: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Parse ``argv`` with a parser holding :func:`add_step_arguments`; ``--min-lr`` then defaults to ``--lr``/10
    (a default that depends on another option, which argparse cannot express)."""
    usage_errors_raise(p)               # a bad option: one line, said once (axgrid.launch.errors)
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.min_lr is None:
        args.min_lr = args.lr / 10
    return args


def check_step_arguments(args: argparse.Namespace, steps: int) -> None:
    """:func:`add_step_arguments`' schedule and optimizer options (a run of ``steps`` optimizer steps): SystemExit
    with one line naming the value and the fix, identically on every rank before any collective (torch's own
    checks come only at the optimizer's construction, as a traceback per rank)."""
    lr, min_lr = args.lr, args.min_lr

    def bad(v: float) -> bool:
        return not math.isfinite(v)
    if bad(lr) or lr <= 0:
        raise SystemExit(f"--lr {lr}: the peak learning rate must be a number > 0, e.g. --lr 3e-4")
    if bad(min_lr) or not 0 <= min_lr <= lr:
        raise SystemExit(f"--min-lr {min_lr}: the end of the cosine decay must be in [0, --lr {lr}]; leave it out "
                         f"for --lr/10")
    if bad(args.weight_decay) or args.weight_decay < 0:
        raise SystemExit(f"--weight-decay {args.weight_decay}: AdamW's decoupled weight decay must be >= 0, e.g. "
                         f"0.1 (0: none)")
    if bad(args.beta2) or not 0 <= args.beta2 < 1:
        raise SystemExit(f"--beta2 {args.beta2}: AdamW's second-moment decay must be in [0, 1), e.g. 0.95")
    if bad(args.clip) or args.clip < 0:
        raise SystemExit(f"--clip {args.clip}: the global gradient-norm limit must be > 0, or 0 for no clipping")
    if args.warmup < 0 or args.warmup > steps:
        raise SystemExit(f"--warmup {args.warmup} with {steps} steps: the warm-up must be 0 to {steps} steps (the "
                         f"learning rate reaches --lr at its end), e.g. --warmup {max(steps // 10, 0)}")


def run_outputs(args: argparse.Namespace) -> dict[str, Optional[str]]:
    """The output paths of :func:`add_run_arguments` and the metrics options, for :func:`check_output_paths`."""
    return {"--save": args.save, "--log": getattr(args, "log", None),
            "--tensorboard": getattr(args, "tensorboard", None)}


def check_output_paths(paths: Mapping[str, Optional[str]], files: Sequence[str] = ("--log",)) -> None:
    """Create each output folder (``{"--save": DIR, ...}``; for the options in ``files``, the file's folder) and
    write and remove a file in it, so that a path that cannot be written is said before step 0, not at the first
    save: SystemExit with one line naming the option, the path and the reason. Every rank does it (each may write
    there, and each must say the same); a driver calls it after its other checks, so bad input creates nothing."""
    for flag, path in paths.items():
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path)) if flag in files else path
        probe = os.path.join(folder, f".axgrid-write-test-{socket.gethostname()}-{os.getpid()}")
        try:
            os.makedirs(folder, exist_ok=True)
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as e:
            raise SystemExit(f"{flag} {path}: cannot write there ({e.strerror or type(e).__name__}: "
                             f"{e.filename or folder}); pass a path in a folder you can write") from None


def check_run_arguments(args: argparse.Namespace) -> None:
    """Problems with :func:`add_run_arguments`' options, raised identically on every rank before any collective."""
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise SystemExit(f"--timeout {args.timeout}: the seconds a stuck collective may take must be a number > 0, "
                         f"e.g. --timeout 120")
    if args.save_every and not args.save:
        raise SystemExit("--save-every needs --save DIR")
    if args.resume and not os.path.exists(args.resume):      # before the grid is built: said in a second
        raise SystemExit(f"--resume {args.resume}: no checkpoint there (the path does not exist); pass a --save "
                         f"directory of an earlier run, or leave --resume out to start fresh")
    if args.keep < 0:
        raise SystemExit(f"--keep {args.keep}: the number of checkpoints to keep must be >= 1, or 0 to keep all")


def check_zero(zero: int, shape: GridShape) -> None:
    """``--zero`` > 0 needs data parallelism to shard over: SystemExit naming the grid otherwise (identically on
    every rank, before any collective)."""
    if zero and shape.gd == 1:
        raise SystemExit(f"--zero {zero} with grid {shape}: Gd = 1, so there is nothing to shard over d; use "
                         f"--zero 0, or a --grid whose last size (Gd) is > 1")


def add_context_parallel_argument(p: argparse.ArgumentParser) -> None:
    """``--cp N``: context parallelism, each sequence split over ``N`` z-ranks (``axgrid.init(..., cp=N)``)."""
    p.add_argument("--cp", type=int, default=1, help="context parallelism: each sequence split over CP ranks of z "
                                                    "(CP divides Gz; the sequence a multiple of 2*CP)")


def check_context_parallel(cp: int, seq: int, shape: Optional[GridShape]) -> None:
    """``--cp``: an integer >= 1, a sequence of ``seq`` tokens that cuts into ``2·cp`` chunks (the causal balance,
    :mod:`axgrid.context_parallel.chunks`) and a ``cp`` that divides Gz (the token shard a model splits over z);
    SystemExit with one line naming the sizes that work, identically on every rank before any collective."""
    from ..context_parallel import check_sequence
    if cp == 1:
        return
    if cp < 1:
        raise SystemExit(f"--cp {cp}: the context-parallel size must be >= 1 (1: off)")
    try:
        check_sequence(seq, cp)
    except ValueError as e:
        raise SystemExit(f"--seq {seq} with --cp {cp}: {e}") from None
    gz = shape.gz if shape is not None else 1
    if gz % cp:
        fits = [c for c in range(1, gz + 1) if gz % c == 0]
        raise SystemExit(f"--cp {cp} with grid {shape or '1x1x1'}: a sequence is split over the z-ranks, so --cp "
                         f"must divide Gz = {gz}; use --cp in {fits} (or a --grid with a larger Gz)")


def compute_dtype(requested: Optional[str]) -> str:
    """``--dtype`` or its default (bf16 on a GPU, fp32 on a CPU); on a CPU also sets torch's threads to
    ``OMP_NUM_THREADS`` (default 1 per rank)."""
    import torch
    from ..device import cuda
    on_gpu = cuda.available()
    if not on_gpu:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    return requested or ("bf16" if on_gpu else "fp32")


def add_expert_parallel_argument(p: argparse.ArgumentParser) -> None:
    """``--ep N``: expert parallelism, a mixture of experts' experts spread over ``N`` d-ranks
    (``axgrid.init(..., ep=N)``)."""
    p.add_argument("--ep", type=int, default=1, help="expert parallelism: a mixture of experts' experts spread over "
                                                    "EP ranks of d (EP divides Gd and the number of experts)")


def moe_sizes(config: Any) -> Optional[tuple[int, int]]:
    """``(experts, top-k)`` of a Hugging Face mixture-of-experts config (Mixtral's ``num_local_experts``, Qwen-MoE's
    ``num_experts``; ``num_experts_per_tok``), None for a dense model."""
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    return (int(experts), int(top_k)) if experts and top_k else None


def check_expert_parallel(ep: int, shape: Optional[GridShape], config: Any, where: str) -> None:
    """``--ep``: an integer >= 1 dividing Gd; with a mixture-of-experts ``config``, top-k at most the experts and the
    experts divisible by ``ep``; ``ep > 1`` only for a mixture of experts. SystemExit with one line naming the sizes
    that work, identically on every rank before any collective (``where``: the config's name in the message)."""
    if ep < 1:
        raise SystemExit(f"--ep {ep}: the expert-parallel size must be >= 1 (1: every rank holds every expert)")
    sizes = moe_sizes(config)
    if sizes is not None:
        experts, top_k = sizes
        if top_k < 1 or top_k > experts:
            raise SystemExit(f"{where}: num_experts_per_tok={top_k} (top-k) but the model has {experts} experts; "
                             f"choose num_experts_per_tok in 1..{experts}")
    if ep == 1:
        return
    if sizes is None:
        raise SystemExit(f"--ep {ep} with {where}: the model is not a mixture of experts (no num_experts / "
                         f"num_local_experts); drop --ep")
    gd = shape.gd if shape is not None else 1
    if gd % ep:
        fits = [e for e in range(1, gd + 1) if gd % e == 0 and experts % e == 0]
        raise SystemExit(f"--ep {ep} with grid {shape or '1x1x1'}: the experts spread over d-ranks, so --ep must "
                         f"divide Gd={gd}; choose --ep in {fits} or a grid whose Gd is a multiple of {ep}")
    if experts % ep:
        fits = [e for e in range(1, gd + 1) if gd % e == 0 and experts % e == 0]
        raise SystemExit(f"--ep {ep} with {where}: its {experts} experts do not divide over {ep} ranks; choose --ep "
                         f"in {fits}")
