"""Gradients of parameters that are replicated over z (and possibly x or y) while the tokens are split over z.

Each z-rank sees only its own tokens, so such a parameter's gradient is a partial sum that must be summed over z
(the data-parallel mean over d happens later, in :func:`axgrid.sync_gradients`). ``axgrid.nn.Linear`` does this for
its bias; the layer norms and embeddings of :mod:`axgrid.models.gpt` use :func:`reduce_over_z` for the same job, so
every such gradient follows one rule -- the grid's gradient sink, which holds it in flight with the ORS overlap.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..core.grid import Grid


def reduce_over_z(grid: Grid, params: Sequence[torch.nn.Parameter],
                  grads: Sequence[torch.Tensor]) -> list[Optional[torch.Tensor]]:
    """Sum ``grads`` (this rank's partial gradients of ``params``) over z, in ONE all-reduce.

    Returns the summed gradients for autograd to accumulate, or ``None`` for each when the grid's gradient sink
    keeps the sum in flight (ORS on) and writes ``param.grad`` itself when it finishes.
    """
    if grid.size("z") == 1:
        return list(grads)
    return grid.runtime.grads.all_reduce(params, grads, "z")


def uses_token(grid: Grid, params: Sequence[Optional[torch.nn.Parameter]]) -> Optional[torch.Tensor]:
    """The gradient sink's uses token for a layer owning ``params`` whose gradients go through the sink
    (:func:`reduce_over_z`, ``axgrid.nn.Linear``; :mod:`axgrid.tensor_parallel.overlap`: with ORS it tells when the
    backward of the layer's last use in this pass has run), or None when none is needed (no ORS, nothing trained, no
    grad). Pass it to the layer's autograd function as an input; its
    backward returns :func:`token_grad` for it."""
    trained = [p for p in params if p is not None and p.requires_grad]
    if not trained or not torch.is_grad_enabled():
        return None
    return grid.runtime.grads.uses_token(trained)


def token_grad(ctx, index: int, like: torch.Tensor) -> Optional[torch.Tensor]:
    """What an autograd function's backward returns for the uses token at input ``index`` (a 0-d zero)."""
    return torch.zeros((), device=like.device) if ctx.needs_input_grad[index] else None
