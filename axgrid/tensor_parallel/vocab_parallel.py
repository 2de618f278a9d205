"""Vocabulary-parallel cross entropy: the loss of every token without any rank holding a full row of logits.

Input: ``logits_loc [m', V/G_v]`` -- this rank's tokens, its slice ``[v0, v0 + V/G_v)`` of the vocabulary (the
output layout of a normal ``axgrid.nn.Linear`` head with ``G_v = Gy``; replicated over x) -- and the global target
ids ``[m']``. Output: the per-token loss ``[m']`` (fp32, identical on every member of the vocabulary group).

Communication (forward only; backward is local):
  1. ``all_gather`` over the vocabulary dimension of the per-token local max ``[m']`` -> the global max
     (the runtime's all-reduce is a sum, and the max is only a shift for stability: any value common to the
     group gives the same loss);
  2. one ``all_reduce`` of ``[m', 2]``: sum of ``exp(logit - max)`` and the target's shifted logit (non-zero on
     the one rank whose slice holds the target).
Loss ``= log(sum exp) - target logit``; gradient ``softmax - onehot(target)`` on the local slice, times the
incoming per-token gradient.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F

from ..core.grid import Grid


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, grid: Grid, dim: str) -> torch.Tensor:  # type: ignore[override]
        comm = grid.comm
        lf = logits.float()
        m, v_loc = lf.shape
        v0 = grid.index(dim) * v_loc
        local_max = lf.max(dim=-1).values
        gmax = comm.all_gather(local_max, dim).max(dim=0).values if grid.size(dim) > 1 else local_max
        shifted = lf - gmax.unsqueeze(-1)
        e = shifted.exp()
        t = targets - v0
        inside = (t >= 0) & (t < v_loc)
        t_safe = torch.where(inside, t, torch.zeros_like(t))
        tlogit = torch.where(inside, shifted.gather(1, t_safe.unsqueeze(1)).squeeze(1), torch.zeros_like(gmax))
        both = comm.all_reduce(torch.stack([e.sum(-1), tlogit], dim=-1), dim)       # [m', 2]
        sum_exp, target_logit = both[:, 0], both[:, 1]
        e.div_(sum_exp.unsqueeze(-1))                                              # local softmax slice
        ctx.save_for_backward(e, t_safe, inside)
        ctx.logit_dtype = logits.dtype
        return torch.log(sum_exp) - target_logit

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        softmax, t_safe, inside = ctx.saved_tensors
        g = g.float()
        grad = softmax * g.unsqueeze(-1)
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, t_safe] -= torch.where(inside, g, torch.zeros_like(g))
        return grad.to(ctx.logit_dtype), None, None, None


def vocab_parallel_cross_entropy(logits_loc: torch.Tensor, targets: torch.Tensor, grid: Optional[Grid],
                                 dim: str = "y") -> torch.Tensor:
    """Per-token cross entropy ``[m']`` from vocabulary-split logits ``[m', V/G_dim]`` and target ids ``[m']``.

    ``grid=None``: ``logits_loc`` holds the whole vocabulary (serial); plain ``F.cross_entropy``.
    """
    if logits_loc.dim() != 2 or targets.shape != logits_loc.shape[:1]:
        raise ValueError(f"expected logits [m, V_local] and targets [m]; got {tuple(logits_loc.shape)} and "
                         f"{tuple(targets.shape)}")
    if grid is None or grid.size(dim) == 1:
        return F.cross_entropy(logits_loc.float(), targets, reduction="none")
    return _VocabParallelCE.apply(logits_loc, targets, grid, dim)
