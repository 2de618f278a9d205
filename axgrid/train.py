"""One training step: the ritual every trainer in the project runs (demo, train_gpt, benchmarks).

    for i in micro-batches:  loss_i = loss_of(i); loss_i.backward()   (all but the last under grid.no_sync())
    axgrid.sync_gradients(model, grid)      # completes overlapped collectives, averages over d
    optional global-norm clip; optimizer.step()

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

from .data_parallel import clip_grad_norm_, sync_gradients, zero_gradients
from .grid import Grid


@dataclass(frozen=True)
class StepResult:
    """``loss``: the sum over micro-batches of the losses ``loss_of`` returned, detached, fp32, on their device
    (no host sync: read it with ``float()`` when needed); ``grad_norm``: the global gradient norm before
    clipping, or nan when not clipped."""
    loss: torch.Tensor
    grad_norm: float


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_of: Callable[[int], torch.Tensor],
               grid: Optional[Grid], microbatches: int = 1, clip: float = 0.0) -> StepResult:
    """Run one optimizer step of ``microbatches`` forward/backward passes; ``loss_of(i)`` is micro-batch i's
    forward (autocast included, if any) returning the scalar loss whose gradient is wanted.

    ``clip > 0``: clip the global gradient norm (every parameter element counted once over the grid) to
    ``clip`` after the gradient sync."""
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be a positive int, got {microbatches!r}")
    if not clip >= 0:
        raise ValueError(f"clip must be >= 0 (0: off), got {clip!r}")
    if grid is None or not zero_gradients(model, grid):
        optimizer.zero_grad(set_to_none=True)
    total = None
    for i in range(microbatches):
        # ODP: only the last micro-batch's backward reduces over d (the others accumulate locally)
        last = i == microbatches - 1
        with nullcontext() if (grid is None or last) else grid.no_sync():
            loss = loss_of(i)
            loss.backward()
        part = loss.detach().float()
        total = part if total is None else total + part
    gnorm = math.nan
    if grid is not None:
        sync_gradients(model, grid)
        if clip > 0:
            gnorm = float(clip_grad_norm_(model, clip, grid))
    elif clip > 0:
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
    optimizer.step()
    return StepResult(total, gnorm)


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups of any (parallel or serial) model: weight decay on parameters whose dense form is a
    matrix (FC weights, embedding tables; a parallel parameter's ``axgrid_tile`` gives its dense shape), none on
    vectors (biases, norm weights)."""
    decay, no_decay = [], []
    for p in model.parameters():
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
