"""The top-k router of a mixture-of-experts block on the sharded stream.

The stream holds ``x [T, h/Gx]`` (this rank's tokens, its x-part of the features, copies over y). The router's weight
``[E, h]`` is split by columns over x (``[E, h/Gx]`` here, copies over y, z and d, like a norm's weight), so the logits
are ``AR_x(x W_loc^T) [T, E]``, the same on every rank of the x·y block; everything after them (scores, top-k, the
combine weights) is computed alike there. Backward: the logits' gradient is whole on every x-rank (the combine
weights' gradient, a sum over features, is all-reduced over x before it reaches them), so ``dx = dlogits W_loc`` and
``dW_loc = dlogits^T x`` -- partial over this rank's tokens, summed over z through the gradient sink (and over d by the
data parallelism).

Scores (per the model's config): ``softmax`` of the logits in fp32 or ``sigmoid``; the top-k of them; normalised to sum
1 per token when ``normalize``. The router's output is ``(logits, weights [T, k], indices [T, k])``; its logits are
those of the x·y·z block's tokens (all-gathered over z, in sequence order), so that a model's auxiliary
load-balancing loss, computed from them, is the one transformers computes on the data-parallel rank's batch.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..core.grid import Grid
from ..spec import TileSpec


class _RouterLogits(torch.autograd.Function):
    """``x [T, h/Gx]``, ``weight [E, h/Gx]`` -> ``AR_x(x weight^T) [T, E]`` (see the module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, router: "TopKRouter",  # type: ignore[override]
                uses: Optional[torch.Tensor] = None) -> torch.Tensor:
        ctx.router = router
        ctx.save_for_backward(x, weight)
        return router.grid.comm.all_reduce(x @ weight.t(), "x")

    @staticmethod
    def backward(ctx, dlogits: torch.Tensor):  # type: ignore[override]
        router = ctx.router
        grid = router.grid
        x, weight = ctx.saved_tensors
        dlogits = dlogits.to(x.dtype)
        dx = dlogits @ weight
        dw = None
        if ctx.needs_input_grad[1]:
            dw = dlogits.t() @ x
            if grid.size("z") > 1:
                (dw,) = grid.runtime.grads.all_reduce([router.weight], [dw], "z")
        token = torch.zeros((), device=dx.device) if ctx.needs_input_grad[3] else None
        return dx, dw, None, token


class _SumGradOverX(torch.autograd.Function):
    """Identity forward; the gradient summed over x (a value copied over x whose uses are partial there)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, grid: Grid) -> torch.Tensor:  # type: ignore[override]
        ctx.grid = grid
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return ctx.grid.comm.all_reduce(grad.contiguous(), "x"), None


def sum_grad_over_x(t: torch.Tensor, grid: Grid) -> torch.Tensor:
    """``t`` (the same on every x-rank) whose gradient, partial over x where it is used, is summed there."""
    return _SumGradOverX.apply(t, grid) if grid.size("x") > 1 and t.requires_grad else t


class _GatherOverZ(torch.autograd.Function):
    """``[T, E]`` per z-rank -> ``[Gz·T, E]`` in z order; backward: this rank's rows of the gradient (every z-rank
    computes the same function of the gathered tensor, so each keeps the gradient of its own rows)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, grid: Grid) -> torch.Tensor:  # type: ignore[override]
        ctx.grid, ctx.rows = grid, t.shape[0]
        return grid.comm.all_gather(t.contiguous(), "z").reshape(-1, *t.shape[1:])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        i = ctx.grid.index("z")
        return grad[i * ctx.rows:(i + 1) * ctx.rows], None


class TopKRouter(nn.Module):
    """The router of an MoE block on the grid: ``x [T, h/Gx]`` -> ``(block logits [Gz·T, E], weights [T, k],
    indices [T, k])`` (see the module docstring). ``scoring``: ``"softmax"`` or ``"sigmoid"``; ``normalize``: the
    top-k scores of a token divided by their sum. ``weight``: this rank's columns ``[E, h/Gx]`` of the dense
    ``[E, h]``."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, grid: Grid, *, scoring: str = "softmax",
                 normalize: bool = True, dtype: Optional[torch.dtype] = None) -> None:
        nn.Module.__init__(self)    # not super(): a plan may mix in a model's own router class (its recorder's type)
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"router scoring={scoring!r}: choose 'softmax' or 'sigmoid'")
        gx = grid.size("x")
        if hidden % gx:
            raise ValueError(f"router hidden size {hidden} is not divisible by Gx={gx} of grid {grid.shape}")
        self.grid, self.hidden, self.num_experts, self.top_k = grid, hidden, num_experts, top_k
        self.scoring, self.normalize = scoring, normalize
        local = hidden // gx
        self.weight = nn.Parameter(torch.zeros(num_experts, local, dtype=dtype or torch.get_default_dtype(),
                                               device=grid.device))
        self.weight.axgrid_tile = TileSpec((num_experts, hidden), (0, grid.index("x") * local), (num_experts, local))
        self.weight.axgrid_replicated = "yzd"

    def load_dense_(self, weight: torch.Tensor) -> "TopKRouter":
        """This rank's columns of a dense ``weight [E, h]``."""
        local = self.hidden // self.grid.size("x")
        with torch.no_grad():
            self.weight.copy_(weight[:, self.grid.index("x") * local:(self.grid.index("x") + 1) * local])
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = x.reshape(-1, self.weight.shape[1])
        uses = self.grid.runtime.grads.uses_token([self.weight]) \
            if self.weight.requires_grad and torch.is_grad_enabled() else None
        logits = _RouterLogits.apply(x, self.weight, self, uses)                  # [T, E]
        scores = torch.softmax(logits, dim=-1, dtype=torch.float) if self.scoring == "softmax" \
            else torch.sigmoid(logits.float())
        top, indices = torch.topk(scores, self.top_k, dim=-1)
        if self.normalize:
            top = top / top.sum(dim=-1, keepdim=True)
        block = _GatherOverZ.apply(logits, self.grid) if self.grid.size("z") > 1 else logits
        return block, top.to(logits.dtype), indices

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden}, experts={self.num_experts}, top_k={self.top_k}, scoring={self.scoring}, "
                f"normalize={self.normalize}")


class SharedExpertGate(nn.Module):
    """A shared expert's gate (Qwen2-MoE's ``shared_expert_gate``, ``nn.Linear(h, 1)`` then a sigmoid): ``x [T, h/Gx]``
    -> ``sigmoid(AR_x(x W_loc^T)) [T, 1]``, the same on every rank of the x·y block. ``weight``: this rank's columns
    ``[1, h/Gx]`` of the dense ``[1, h]`` (copies over y, z and d; its gradient summed over z like the router's)."""

    def __init__(self, hidden: int, grid: Grid, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        gx = grid.size("x")
        if hidden % gx:
            raise ValueError(f"shared expert gate: hidden size {hidden} is not divisible by Gx={gx} of grid "
                             f"{grid.shape}")
        self.grid, self.hidden = grid, hidden
        local = hidden // gx
        self.weight = nn.Parameter(torch.zeros(1, local, dtype=dtype or torch.get_default_dtype(), device=grid.device))
        self.weight.axgrid_tile = TileSpec((1, hidden), (0, grid.index("x") * local), (1, local))
        self.weight.axgrid_replicated = "yzd"

    def load_dense_(self, weight: torch.Tensor) -> "SharedExpertGate":
        """This rank's columns of a dense ``weight [1, h]``."""
        local = self.hidden // self.grid.size("x")
        with torch.no_grad():
            self.weight.copy_(weight[:, self.grid.index("x") * local:(self.grid.index("x") + 1) * local])
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        uses = self.grid.runtime.grads.uses_token([self.weight]) \
            if self.weight.requires_grad and torch.is_grad_enabled() else None
        return torch.sigmoid(_RouterLogits.apply(x, self.weight, self, uses))
