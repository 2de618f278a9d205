"""The loss over the whole sequence when its tokens are split over the context-parallel group.

Each rank holds its rows' summed per-token losses and how many tokens count; the mean over the sequence is the sum of
both over ``"c"``, divided. Backward: each rank's share of the numerator is its own tokens', so the sum's gradient
is the identity (the global normaliser, a count, carries none)."""
from __future__ import annotations

import torch

from ..core.comm import Communicator


class _SumOverGroup(torch.autograd.Function):
    """Sum a tensor over the group ``dim`` in forward; identity in backward."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, comm: Communicator, dim: str) -> torch.Tensor:  # type: ignore[override]
        return comm.all_reduce(t.detach().clone(), dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad, None, None


def whole_sequence_mean(loss_sum: torch.Tensor, count: torch.Tensor, comm: Communicator,
                        dim: str = "c") -> torch.Tensor:
    """``sum over the group of loss_sum / sum over the group of count`` (scalars; ``count``: this rank's kept
    tokens), the same on every member: the mean per-token loss of the whole sequences. One all-reduce of both."""
    both = _SumOverGroup.apply(torch.stack([loss_sum, count.to(loss_sum.dtype).detach()]), comm, dim)
    total = both[1].detach()
    if total <= 0:
        raise ValueError("whole_sequence_mean: no token of these sequences counts (every loss_mask is 0)")
    return both[0] / total
