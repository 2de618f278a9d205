"""The loss of a model on held-out rows, as the drivers report it (finetune before and after, the memorization
study at every evaluation).

    loss = heldout_loss(model, grid, inputs, targets, mask, rows_per_pass=8)   # inputs/targets/mask [H, S]
    perplexity = math.exp(loss)

The mean cross entropy per kept target (``mask`` 1; every target without a mask) over all ``H`` rows, in passes
of ``rows_per_pass`` rows; each pass splits its rows over d (and the model over z, by whole sequences). Rows are
padded with empty rows (mask 0) to a multiple of ``Gd·Gz`` per pass, so any ``H`` works. The same value on every
rank; the model is in eval mode meanwhile and no gradient is kept.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..grid import Grid
from ..plans.causal_lm import causal_lm_loss


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, grid: Grid, inputs: torch.Tensor, targets: torch.Tensor,
                 mask: Optional[torch.Tensor] = None, rows_per_pass: Optional[int] = None) -> float:
    """Mean cross entropy per kept target of ``inputs/targets [H, S]`` (``mask [H, S]``, 1 = kept; default all);
    see the module docstring. Collective: every rank passes the same rows."""
    gd, d, split = grid.size("d"), grid.coord.d, grid.size("d") * grid.size("z")
    mask = torch.ones(inputs.shape, dtype=torch.float32) if mask is None else mask.float()
    kept = float(mask.sum())
    if kept == 0:
        raise ValueError("heldout_loss: no kept target in the held-out rows")
    per_pass = max(split, math.ceil((rows_per_pass or inputs.shape[0]) / split) * split)
    rows = math.ceil(inputs.shape[0] / per_pass) * per_pass
    pad = rows - inputs.shape[0]
    if pad:
        inputs = torch.cat([inputs, inputs[:1].expand(pad, -1)])
        targets = torch.cat([targets, targets[:1].expand(pad, -1)])
        mask = torch.cat([mask, torch.zeros(pad, mask.shape[1])])
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64)
    per_d = per_pass // gd
    for start in range(0, rows, per_pass):
        mine = slice(start + d * per_d, start + (d + 1) * per_d)
        loss = causal_lm_loss(model, inputs[mine].to(grid.device), targets[mine].to(grid.device),
                              mask[mine].to(grid.device), kept / gd)
        total += loss.detach().double().cpu()
    model.train(was_training)
    return float(grid.comm.all_reduce(total.float().reshape(1).to(grid.device), "d", average=True)[0])
