"""Gradients of parameters that are replicated over z (and possibly x or y) while the tokens are split over z.

Each z-rank sees only its own tokens, so such a parameter's gradient is a partial sum that must be summed over z
(the data-parallel mean over d happens later, in :func:`axgrid.sync_gradients`). ``axgrid.nn.Linear`` does this for
its bias; the layer norms and embeddings of :mod:`axgrid.models.gpt` use :func:`reduce_over_z` for the same job, so
every such gradient follows one rule -- including the ORS overlap, when the grid has a pending-gradient queue.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..grid import Grid


def reduce_over_z(grid: Grid, params: Sequence[torch.nn.Parameter],
                  grads: Sequence[torch.Tensor]) -> list[Optional[torch.Tensor]]:
    """Sum ``grads`` (this rank's partial gradients of ``params``) over z, in ONE all-reduce.

    Returns the summed gradients for autograd to accumulate, or ``None`` for each when the sum was handed to the
    grid's overlapped gradient queue (ORS on), which writes ``param.grad`` itself when it finishes.
    """
    if grid.size("z") == 1:
        return list(grads)
    if grid.config.overlap.ors and grid.pending_grads is not None:
        grid.pending_grads.all_reduce(list(params), list(grads), "z")
        return [None] * len(grads)
    flat = torch.cat([g.reshape(-1) for g in grads]) if len(grads) > 1 else grads[0].contiguous().reshape(-1)
    flat = grid.comm.all_reduce(flat, "z")
    out, off = [], 0
    for g in grads:
        out.append(flat[off: off + g.numel()].view_as(g))
        off += g.numel()
    return out
