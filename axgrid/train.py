"""One training step: the ritual every trainer in the project runs (demo, train_gpt, benchmarks).

    for i in micro-batches:  loss_i = loss_of(i); (loss_i / M).backward()   (all but the last under grid.no_sync())
    axgrid.sync_gradients(model, grid)      # the last backward reduced over d already: builds the buckets on first use
    optional global-norm clip; optimizer.step()

Micro-batches are averaged: with ``loss_of(i)`` the mean loss of micro-batch i's rows on this rank, the step
trains with the gradient of the mean over the whole global batch (equal-sized micro-batches; ``sync_gradients``
averages over the data-parallel ranks). ``accumulate="sum"`` is for a loss already normalised over the whole
step, as the training drivers' is (summed over a micro-batch's kept tokens and divided by the step's global
count of kept tokens, :func:`axgrid.memorization.goldfish.step_mask`): then the micro-batch losses add up.

Gradients are zeroed at the start of the step (in place in the data-parallel buckets, which are their storage;
with Gd = 1 ``set_to_none``), so after it ``.grad`` holds this step's synchronised gradients (with ``zero`` >= 1
only this d-rank's share of them is the mean; with ``zero=2`` ``.grad`` is None). With ``grid=None`` the same
step runs serially (a plain torch model: no no_sync, no gradient sync), which is how the demo trains its serial
reference.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .data_parallel.gradients import clip_grad_norm_, sync_gradients, zero_gradients
from .core.grid import Grid


#: How ``train_step`` combines the micro-batches' losses: "mean" (each a mean over its own micro-batch) or "sum"
#: (each already its share of the step's loss).
ACCUMULATE = ("mean", "sum")


@dataclass(frozen=True)
class StepResult:
    """``loss``: the step's loss, the mean (or, with ``accumulate="sum"``, the sum) over micro-batches of the losses
    ``loss_of`` returned on this rank, detached, fp32, on their device; ``grad_norm``: the global gradient norm before
    clipping (a 0-d fp32 tensor on the device), or nan when not clipped. Neither makes the host wait for the device:
    read them with ``float()`` when needed (after the step's end, e.g. in :class:`axgrid.metrics.StepMeter`)."""
    loss: torch.Tensor
    grad_norm: "torch.Tensor | float"


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_of: Callable[[int], torch.Tensor],
               grid: Optional[Grid], microbatches: int = 1, clip: float = 0.0,
               accumulate: str = "mean") -> StepResult:
    """Run one optimizer step of ``microbatches`` forward/backward passes; ``loss_of(i)`` is micro-batch i's
    forward (autocast included, if any) returning its scalar loss.

    ``accumulate="mean"`` (default): the step's gradient is the mean of the micro-batches' (each loss scaled by
    1/``microbatches`` before its backward), so a ``loss_of`` that returns the mean over micro-batch i trains with
    the full-batch mean gradient. ``"sum"``: ``loss_of(i)`` is already micro-batch i's share of the step's loss
    (e.g. divided by the step's global token count), and the gradients add up unscaled.
    ``clip > 0``: clip the global gradient norm (every parameter element counted once over the grid) to
    ``clip`` after the gradient sync."""
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be a positive int, got {microbatches!r}")
    if not clip >= 0:
        raise ValueError(f"clip must be >= 0 (0: off), got {clip!r}")
    if accumulate not in ACCUMULATE:
        raise ValueError(f"accumulate={accumulate!r}: use 'mean' (loss_of returns each micro-batch's mean loss) or "
                         f"'sum' (loss_of returns each micro-batch's share of the step's loss)")
    scale = 1.0 / microbatches if accumulate == "mean" and microbatches > 1 else None
    if grid is None or not zero_gradients(model, grid):
        optimizer.zero_grad(set_to_none=True)
    total = None
    for i in range(microbatches):
        # ODP: only the last micro-batch's backward reduces over d (the others accumulate locally)
        last = i == microbatches - 1
        with nullcontext() if (grid is None or last) else grid.no_sync():
            loss = loss_of(i)
            (loss if scale is None else loss * scale).backward()
        part = loss.detach().float()
        total = part if total is None else total + part
    if scale is not None:
        total = total * scale
    gnorm: "torch.Tensor | float" = math.nan
    if grid is not None:
        sync_gradients(model, grid)
        if clip > 0:
            gnorm = clip_grad_norm_(model, clip, grid)
    elif clip > 0:
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return StepResult(total, gnorm)


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups of any (parallel or serial) model: weight decay on parameters whose dense form is a
    matrix (FC weights, embedding tables; a parallel parameter's ``axgrid_tile`` gives its dense shape), none on
    vectors (biases, norm weights). Frozen parameters (``requires_grad=False``: a LoRA model's base) are left out."""
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        tile = getattr(p, "axgrid_tile", None)
        dense_dims = len(tile.dense_shape) if tile is not None else p.dim()
        (decay if dense_dims >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def cosine_lr(step: int, steps: int, lr: float, min_lr: float, warmup: int = 0) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``steps``: linear warm-up over ``warmup`` steps to
    ``lr``, then cosine decay to ``min_lr`` at the last step (a function of the step alone, so a resumed run
    continues the same schedule)."""
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, steps - warmup)
    frac = min(1.0, (step - warmup) / span)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * frac))
