"""Gradients of parameters that are replicated over z (and possibly x or y) while the tokens are split over z.

Each z-rank sees only its own tokens, so such a parameter's gradient is a partial sum that must be summed over z
(the data-parallel mean over d happens later, in :func:`axgrid.sync_gradients`). ``axgrid.nn.Linear`` does this for
its bias; the layer norms and embeddings of :mod:`axgrid.models.gpt` use :func:`reduce_over_z` for the same job, so
every such gradient follows one rule -- the grid's gradient sink, which holds it in flight with the ORS overlap.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..grid import Grid


def reduce_over_z(grid: Grid, params: Sequence[torch.nn.Parameter],
                  grads: Sequence[torch.Tensor]) -> list[Optional[torch.Tensor]]:
    """Sum ``grads`` (this rank's partial gradients of ``params``) over z, in ONE all-reduce.

    Returns the summed gradients for autograd to accumulate, or ``None`` for each when the grid's gradient sink
    keeps the sum in flight (ORS on) and writes ``param.grad`` itself when it finishes.
    """
    if grid.size("z") == 1:
        return list(grads)
    return grid.runtime.grads.all_reduce(params, grads, "z")
