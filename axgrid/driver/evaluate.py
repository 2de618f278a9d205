"""Validation during training: the mean loss per token over fixed validation batches, and its perplexity.

    result = evaluate(model, grid, settings, lambda i: corpus.valid_batch(i, settings.batch, rows), iters=10)
    # {"valid_loss": 3.21, "valid_ppl": 24.8, "valid_tokens": 10 * B * S}: the same on every rank

Each batch is ``[B, S]`` like a training batch and is split the same way (micro-batches, then d, then z inside the
model), without gradients and without the Goldfish mask; the loss is the sum of every target's cross entropy over
the whole batch divided by its ``B·S`` targets (a mean over d of each rank's share), averaged over the batches.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..grid import Grid
from ..plans.causal_lm import causal_lm_loss
from .step import StepSettings

Batch = tuple[torch.Tensor, torch.Tensor]


@torch.no_grad()
def batch_loss(model: torch.nn.Module, grid: Grid, s: StepSettings, inputs: torch.Tensor,
               targets: torch.Tensor) -> float:
    """Mean cross entropy over every target of the global batch ``inputs/targets [B, S]`` (collective over d)."""
    gd, d = grid.size("d"), grid.index("d")
    per_mb = s.batch // s.microbatches
    bd = per_mb // gd
    normalizer = inputs.numel() / gd
    autocast = torch.autocast(device_type=grid.device.type, dtype=torch.bfloat16, enabled=s.bf16)
    total = torch.zeros((), dtype=torch.float32, device=grid.device)
    for mb in range(s.microbatches):
        rows = slice(mb * per_mb + d * bd, mb * per_mb + (d + 1) * bd)
        with autocast:
            loss = causal_lm_loss(model, inputs[rows].to(grid.device), targets[rows].to(grid.device), None,
                                  normalizer)
        total += loss.float()
    return float(grid.comm.all_reduce(total.reshape(1), "d", average=True)[0])


def evaluate(model: torch.nn.Module, grid: Grid, s: StepSettings, batch: Callable[[int], Batch],
             iters: int) -> dict[str, float]:
    """``valid_loss`` (mean per token over ``iters`` batches ``batch(i)``), ``valid_ppl`` = exp of it, and
    ``valid_tokens``. Collective; the model's training mode is restored."""
    was_training = model.training
    model.eval()
    try:
        losses = []
        tokens = 0
        for i in range(iters):
            inputs, targets = batch(i)
            losses.append(batch_loss(model, grid, s, inputs, targets))
            tokens += inputs.numel()
    finally:
        model.train(was_training)
    loss = sum(losses) / len(losses)
    return {"valid_loss": loss, "valid_ppl": math.exp(min(loss, 700.0)), "valid_tokens": tokens}
