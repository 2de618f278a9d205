"""One optimizer step of a training driver on a global batch that every rank holds alike.

    settings = StepSettings(steps=100, batch=8, microbatches=2, lr=1e-4, ...)
    settings.check(grid)                                      # SystemExit, identically on every rank
    row = run_step(model, opt, grid, settings, step, inputs, targets, metrics)   # inputs/targets [B, S]
    rows = settings.rows_read(grid)             # the rows of [B, S] this rank's step uses (None: all of them)

The step: the loss mask of the global batch (Goldfish's, and the caller's, e.g. the assistant tokens of
instruction fine-tuning) and its global normaliser (:func:`~axgrid.memorization.goldfish.
step_mask`), the learning rate of the schedule at ``step`` (warm-up, cosine decay), this data-parallel rank's rows
of each micro-batch (``B/(M·Gd)`` sequences; the model splits them over z), autocast, then :func:`axgrid.train_step`
(accumulation, data-parallel sync, clipping, AdamW), measured by ``metrics`` (:class:`axgrid.metrics.Metrics`).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..data_parallel.gradients import local_batch
from ..device import host_read
from ..core.grid import Grid
from ..memorization.goldfish import step_mask
from ..metrics import Metrics
from ..plans.causal_lm import causal_lm_loss
from ..data_parallel.replicas import check_replicas
from ..train import cosine_lr, train_step


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
    replica_check_every: int = 100      # steps between checks that tensor-parallel replicas are still equal

    @classmethod
    def from_args(cls, args: argparse.Namespace, steps: int, dtype: str, goldfish: bool = True) -> "StepSettings":
        """The settings of :func:`~axgrid.driver.options.add_step_arguments`' options (Goldfish off unless
        ``goldfish``)."""
        return cls(steps=steps, batch=args.batch, microbatches=args.microbatches, lr=args.lr, min_lr=args.min_lr,
                   warmup=args.warmup, clip=args.clip, goldfish_k=args.goldfish_k if goldfish else 0,
                   goldfish_h=args.goldfish_h, goldfish_mode=args.goldfish_mode, bf16=dtype == "bf16")

    def rows_read(self, grid: Grid) -> Optional[list[int]]:
        """The rows of the global batch this rank's step uses (:func:`share_rows`); None under Goldfish, whose
        step normaliser counts the kept targets of the whole batch."""
        if self.goldfish_k:
            return None
        return share_rows(self.batch, self.microbatches, grid)

    def check(self, grid: Grid) -> None:
        """Every problem, raised identically on every rank before any collective."""
        if self.steps < 1 or self.batch < 1 or self.microbatches < 1:
            raise SystemExit(f"--steps {self.steps}, --batch {self.batch}, --microbatches {self.microbatches}: all "
                             f"must be >= 1")
        check_batch_split(self.batch, self.microbatches, grid.size("d"), grid.size("z"), str(grid.shape),
                          grid.size("c"))
        if self.goldfish_k == 1 or self.goldfish_k < 0:
            raise SystemExit(f"--goldfish-k {self.goldfish_k}: use 0 (off) or K >= 2")


def check_batch_split(batch: int, microbatches: int, gd: int, gz: int, grid: str, cp: int = 1) -> None:
    """SystemExit unless ``batch`` sequences split into ``microbatches`` micro-batches of whole sequences over d
    (data parallelism) and z (the model splits its sequences over z; under context parallelism over the ``Gz/cp``
    groups of ``cp`` z-ranks, each of which splits its sequences into chunks)."""
    if batch % microbatches:
        raise SystemExit(f"--batch {batch} is not divisible by --microbatches {microbatches}")
    per = batch // microbatches
    groups = gz // cp
    if per % (gd * groups):
        by = f"Gd*Gz/cp = {gd}*{gz}/{cp}" if cp > 1 else f"Gd*Gz = {gd}*{gz}"
        raise SystemExit(f"a micro-batch of {per} sequences (--batch {batch} / --microbatches {microbatches}) is not "
                         f"divisible by {by} of grid {grid}: data parallelism splits it over d and the "
                         f"model over z by whole sequences; use --batch a multiple of {microbatches * gd * groups}")


def share_rows(batch: int, microbatches: int, grid: Grid) -> list[int]:
    """The rows of a global batch ``[batch, S]`` that this rank computes: in each micro-batch of ``batch /
    microbatches`` sequences, its data-parallel slice (:func:`run_step`), and of that the model's z slice (whole
    sequences, :meth:`axgrid.models.GPT.local_rows`; under context parallelism those of its group, of which the
    model computes two chunks)."""
    per_mb = batch // microbatches
    bd = per_mb // grid.size("d")
    cp = grid.size("c")
    bz = bd * cp // grid.size("z")                      # a group of cp z-ranks shares its sequences
    first = grid.index("d") * bd + grid.index("z") // cp * bz
    return [mb * per_mb + first + i for mb in range(microbatches) for i in range(bz)]


def run_step(model: torch.nn.Module, opt: torch.optim.Optimizer, grid: Grid, s: StepSettings, step: int,
             inputs: torch.Tensor, targets: torch.Tensor, metrics: Metrics,
             loss_mask: Optional[torch.Tensor] = None) -> dict[str, Any]:
    """One optimizer step on the global batch ``inputs/targets [B, S]`` (the same on every rank), measured by
    ``metrics``; ``loss_mask [B, S]`` (1/0, optional): the targets the loss may cover (instruction fine-tuning's
    assistant tokens), combined with Goldfish's mask. Returns the step's row (``loss``: the step's mean over kept
    targets, the same on every rank; ``lr``, ``grad_norm``, ``kept_fraction`` under a mask; the rest is
    :mod:`axgrid.metrics`')."""
    device = grid.device
    gd = grid.size("d")
    mask, normalizer = step_mask(inputs, s.goldfish_k, s.goldfish_h, s.goldfish_mode, gd, keep=loss_mask)
    lr = cosine_lr(step, s.steps, s.lr, s.min_lr, s.warmup)
    for group in opt.param_groups:
        group["lr"] = lr
    per_mb = s.batch // s.microbatches
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=s.bf16)

    def loss_of(mb: int) -> torch.Tensor:
        rows = slice(mb * per_mb, (mb + 1) * per_mb)             # micro-batch mb, then this rank's share of it
        m = local_batch(mask[rows], grid).to(device) if mask is not None else None
        with autocast:
            return causal_lm_loss(model, local_batch(inputs[rows], grid).to(device),
                                  local_batch(targets[rows], grid).to(device), m, normalizer)

    metrics.begin()
    out = train_step(model, opt, loss_of, grid, s.microbatches, clip=s.clip, accumulate="sum")   # global normaliser
    extra = {"kept_fraction": normalizer * gd / inputs.numel()} if mask is not None else {}
    norm = out.grad_norm                  # read at the step's end, where the meter synchronises the device anyway
    norm = float(host_read(norm)) if isinstance(norm, torch.Tensor) else norm
    row = metrics.end(step, loss=out.loss, lr=lr, grad_norm=norm, **extra)
    if s.replica_check_every and (step + 1) % s.replica_check_every == 0:
        check_replicas(model, grid)     # outside the measured step: a non-deterministic backward lets replicas drift
    if not math.isfinite(row["loss"]):
        raise FloatingPointError(f"loss became {row['loss']} at step {step}; lower --lr or check the data")
    return row
