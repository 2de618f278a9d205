"""Gradients of parameters that are replicated over z (and possibly x or y) while the tokens are split over z.

Each z-rank sees only its own tokens, so such a parameter's gradient is a partial sum that must be summed over z
(the data-parallel mean over d happens later, in :func:`axgrid.sync_gradients`). ``axgrid.nn.Linear`` does this for
its bias; the layer norms and embeddings of :mod:`axgrid.models.gpt` use :func:`reduce_over_z` for the same job, so
every such gradient follows one rule -- including the ORS overlap, when the grid has a pending-gradient queue.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..grid import Grid


def reduce_over_z(grid: Grid, param: torch.nn.Parameter, grad: torch.Tensor) -> Optional[torch.Tensor]:
    """Sum ``grad`` (this rank's partial gradient of ``param``) over z.

    Returns the summed gradient for autograd to accumulate, or ``None`` when the sum was handed to the grid's
    overlapped gradient queue (ORS on), which writes ``param.grad`` itself when it finishes.
    """
    if grid.size("z") == 1:
        return grad
    if grid.config.overlap.ors and grid.pending_grads is not None:
        grid.pending_grads.all_reduce(param, grad, "z")
        return None
    return grid.comm.all_reduce(grad.contiguous(), "z")
