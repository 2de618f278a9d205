"""Validation during training: the mean loss per token over fixed validation batches, and its perplexity.

    result = evaluate(model, grid, settings, lambda i: corpus.valid_batch(i, settings.batch, rows), iters=10)
    # {"valid_loss": 3.21, "valid_ppl": 24.8, "valid_tokens": 10 * B * S}: the same on every rank

Each batch is ``[B, S]`` like a training batch and is split the same way (micro-batches, then d, then z inside the
model), without gradients and without the Goldfish mask. A batch may carry a mask ``[B, S]`` of the targets that
count (instruction fine-tuning's assistant tokens; empty padding rows): ``batch(i)`` then returns ``(inputs,
targets, mask)``. The loss of a batch is the sum of its counted targets' cross entropy divided by their number (a
mean over d of each rank's share); the result is the mean over every counted target of all batches (for batches
without a mask, of equal size, the average of their losses).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch

from ..core.grid import Grid
from ..plans.causal_lm import causal_lm_loss
from .step import StepSettings

Batch = Union[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]


@torch.no_grad()
def batch_loss(model: torch.nn.Module, grid: Grid, s: StepSettings, inputs: torch.Tensor,
               targets: torch.Tensor, mask: Optional[torch.Tensor] = None) -> float:
    """Mean cross entropy over every target of the global batch ``inputs/targets [B, S]``, or over those with
    ``mask [B, S]`` 1 (collective over d; 0.0 when the mask counts none)."""
    gd, d = grid.size("d"), grid.index("d")
    per_mb = s.batch // s.microbatches
    bd = per_mb // gd
    normalizer = (inputs.numel() if mask is None else max(float(mask.sum()), 1.0)) / gd
    autocast = torch.autocast(device_type=grid.device.type, dtype=torch.bfloat16, enabled=s.bf16)
    total = torch.zeros((), dtype=torch.float32, device=grid.device)
    for mb in range(s.microbatches):
        rows = slice(mb * per_mb + d * bd, mb * per_mb + (d + 1) * bd)
        with autocast:
            m = mask[rows].to(grid.device) if mask is not None else None
            loss = causal_lm_loss(model, inputs[rows].to(grid.device), targets[rows].to(grid.device), m,
                                  normalizer)
        total += loss.float()
    return float(grid.comm.all_reduce(total.reshape(1), "d", average=True)[0])


def evaluate(model: torch.nn.Module, grid: Grid, s: StepSettings, batch: Callable[[int], Batch],
             iters: int) -> dict[str, float]:
    """``valid_loss`` (mean per counted target over ``iters`` batches ``batch(i)``), ``valid_ppl`` = exp of it, and
    ``valid_tokens`` (the targets counted). Collective; the model's training mode is restored."""
    was_training = model.training
    model.eval()
    try:
        total, tokens = 0.0, 0
        for i in range(iters):
            inputs, targets, *rest = batch(i)
            mask = rest[0] if rest else None
            counted = inputs.numel() if mask is None else int(mask.sum())
            if counted:
                total += batch_loss(model, grid, s, inputs, targets, mask) * counted
                tokens += counted
    finally:
        model.train(was_training)
    if not tokens:
        raise ValueError("evaluate: the validation batches count no target")
    loss = total / tokens
    return {"valid_loss": loss, "valid_ppl": math.exp(min(loss, 700.0)), "valid_tokens": tokens}
