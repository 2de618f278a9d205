"""``axgrid.nn.RMSNorm``: root-mean-square normalisation over a feature dimension split across a grid dimension.

The LLaMA family's norm: ``y = w * (x / sqrt(mean(x^2) + eps))``, the statistics over all ``h`` features. On a
grid the input is the residual stream's layout ``x_loc [m', h/G_f]`` (tokens over (d, z), features over
``feature_dim``, ``"x"`` like axgrid's GPT, replicated over the other tensor-parallel letter):

- forward: ``ms = AR_f(sum x_loc^2) / h`` (one all-reduce of ``[m']``), ``xhat = x * rsqrt(ms + eps)``;
- backward: ``g = dy * w``; ``dx = rstd * (g - xhat * AR_f(sum g*xhat) / h)`` (one all-reduce of ``[m']``);
  ``dw = sum_tokens dy * xhat`` is partial over z (this rank's tokens) and summed over z.

The arithmetic follows Hugging Face's ``LlamaRMSNorm``: statistics in fp32, the normalised value cast back to
the input dtype before the weight multiplies it. With ``unit_offset`` it is Gemma's instead: ``y = xhat · (1 + w)``
in fp32, then cast (so ``dw = sum_tokens dy * xhat`` in fp32). ``grid=None`` is the serial layer with the same
arithmetic.

:class:`HeadRMSNorm` is the norm over each attention head's ``d`` features (Qwen3's and Gemma 3's ``q_norm`` and
``k_norm``): the plan runs attention on whole local heads, so its statistics are local (no communication in
forward), and its weight ``[d]`` is replicated everywhere. Its gradient ``dw = sum dy * xhat`` is partial twice --
this rank's heads (over y) and its tokens (over z), not over x (the heads are replicated there) -- and is summed
over y, then over z.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..core.grid import Grid
from ..io.part_copy import copy_part_
from .redistribute import feature_part
from ..io.state_dict import add_state_hooks, deepcopy_keeping_marks
from ..spec import TileSpec
from .replicated_grad import reduce_over_z, token_grad, uses_token


def _scaled(xhat: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype, unit_offset: bool) -> torch.Tensor:
    """The norm's output from ``xhat`` (fp32): Llama's ``w * xhat.to(dtype)``, or Gemma's ``(xhat*(1+w)).to(dtype)``."""
    if unit_offset:
        return (xhat * (1.0 + weight.float())).to(dtype)
    return weight * xhat.to(dtype)


class _ShardedRMSNorm(torch.autograd.Function):
    """``x [m', f]`` -> the norm; statistics all-reduced over ``layer.stat_dim`` (None: local), the weight's
    gradient summed over ``layer.grad_dims`` (z last, through the gradient sink)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, layer: Any,  # type: ignore[override]
                uses: Optional[torch.Tensor] = None) -> torch.Tensor:
        grid, dim, h = layer.grid, layer.stat_dim, layer.hidden
        xf = x.float()
        sq = (xf * xf).sum(-1)
        ms = (grid.comm.all_reduce(sq, dim) if dim else sq) / h               # [m']
        rstd = torch.rsqrt(ms + layer.eps)
        xhat = xf * rstd.unsqueeze(-1)
        ctx.layer, ctx.x_dtype = layer, x.dtype
        ctx.save_for_backward(xhat, rstd, weight)
        return _scaled(xhat, weight, x.dtype, layer.unit_offset)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        layer = ctx.layer
        grid, dim, h = layer.grid, layer.stat_dim, layer.hidden
        xhat, rstd, weight = ctx.saved_tensors
        dyf = dy.float()
        g = dyf * (weight.float() + (1.0 if layer.unit_offset else 0.0))
        gx = (g * xhat).sum(-1)
        mean_gx = (grid.comm.all_reduce(gx, dim) if dim else gx) / h          # [m']
        dx = rstd.unsqueeze(-1) * (g - xhat * mean_gx.unsqueeze(-1))
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dyf * (xhat if layer.unit_offset else xhat.to(ctx.x_dtype).float())).sum(0)
            if "y" in layer.grad_dims and grid.size("y") > 1:
                dw = grid.comm.all_reduce(dw, "y")
            (dw,) = reduce_over_z(grid, [layer.weight], [dw])
        return dx.to(ctx.x_dtype), (dw.to(weight.dtype) if dw is not None else None), None, token_grad(ctx, 3, dy)


class RMSNorm(nn.Module):
    """RMSNorm over ``hidden`` features; on a grid the features are split over ``feature_dim``.

    Forward: ``[..., hidden]`` (serial) or ``[..., hidden/G_f]`` (grid, stream layout) -> same shape and dtype.
    """

    stat_dim = property(lambda self: self.feature_dim)     # the statistics are all-reduced over the features' dim
    grad_dims = "z"

    def __init__(self, hidden: int, grid: Optional[Grid] = None, *, feature_dim: str = "x", eps: float = 1e-6,
                 dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None,
                 unit_offset: bool = False) -> None:
        super().__init__()
        self.grid, self.hidden, self.feature_dim, self.eps = grid, hidden, feature_dim, eps
        self.unit_offset = unit_offset
        local, f0 = feature_part(grid, hidden, feature_dim, "RMSNorm hidden")
        device = device or (grid.device if grid is not None else torch.device("cpu"))
        self.local, self.f0 = local, f0
        self.weight = nn.Parameter(torch.ones(local, dtype=dtype or torch.get_default_dtype(), device=device))
        if grid is not None:
            self.weight.axgrid_tile = TileSpec((hidden,), (f0,), (local,))
            self.weight.axgrid_replicated = ("y" if feature_dim == "x" else "x") + "zd"
        add_state_hooks(self)

    __deepcopy__ = deepcopy_keeping_marks     # the copy keeps its TileSpecs and shares the grid

    @classmethod
    def from_dense(cls, weight: torch.Tensor, eps: float, grid: Grid, feature_dim: str = "x",
                   unit_offset: bool = False) -> "RMSNorm":
        """This rank's slice of a dense norm's ``weight [hidden]``, on the grid's device (``grid=None``: on
        ``weight``'s; on the meta device: ones, for a loader to fill)."""
        meta = weight.device.type == "meta"
        norm = cls(weight.shape[0], grid, feature_dim=feature_dim, eps=eps, dtype=weight.dtype,
                   device=weight.device if grid is None and not meta else None, unit_offset=unit_offset)
        with torch.no_grad():
            if not meta:
                if grid is None:
                    norm.weight.copy_(weight.detach())
                else:
                    copy_part_(norm.weight.axgrid_tile, weight, norm.weight)
        norm.weight.requires_grad_(weight.requires_grad)
        return norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.local:
            raise ValueError(f"RMSNorm input has {x.shape[-1]} features, expected {self.local} "
                             f"(hidden={self.hidden}{'' if self.grid is None else ' / G' + self.feature_dim})")
        if self.grid is None:
            xf = x.float()
            xhat = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + self.eps)
            return _scaled(xhat, self.weight, x.dtype, self.unit_offset)
        lead = x.shape[:-1]
        y = _ShardedRMSNorm.apply(x.reshape(-1, self.local), self.weight, self, uses_token(self.grid, [self.weight]))
        return y.reshape(*lead, self.local)

    def extra_repr(self) -> str:
        where = "serial" if self.grid is None else f"features over {self.feature_dim}, grid {self.grid.shape}"
        return (f"hidden={self.hidden}, local={self.local}, eps={self.eps}, {where}"
                + (", weight as 1 + w (Gemma)" if self.unit_offset else ""))


class HeadRMSNorm(nn.Module):
    """RMSNorm over each head's ``head_dim`` features (q/k norms) on a grid whose ranks hold whole heads: local
    statistics, a replicated weight ``[head_dim]`` whose gradient is summed over y and z (see the module docstring).

    Forward: ``[..., head_dim]`` (any leading dims: batch, local heads, sequence) -> same shape and dtype.
    """

    stat_dim = None
    grad_dims = "yz"

    def __init__(self, head_dim: int, grid: Grid, *, eps: float = 1e-6, dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None, unit_offset: bool = False) -> None:
        super().__init__()
        self.grid, self.hidden, self.eps, self.unit_offset = grid, head_dim, eps, unit_offset
        self.weight = nn.Parameter(torch.ones(head_dim, dtype=dtype or torch.get_default_dtype(),
                                              device=device or grid.device))
        self.weight.axgrid_replicated = "xyzd"

    __deepcopy__ = deepcopy_keeping_marks     # the copy shares the grid

    @classmethod
    def from_dense(cls, weight: torch.Tensor, eps: float, grid: Grid, unit_offset: bool = False) -> "HeadRMSNorm":
        """A copy of a dense head norm's ``weight [head_dim]`` (on the meta device: ones, for a loader to fill)."""
        meta = weight.device.type == "meta"
        norm = cls(weight.shape[0], grid, eps=eps, dtype=weight.dtype, device=None if meta else weight.device,
                   unit_offset=unit_offset)
        with torch.no_grad():
            if not meta:
                norm.weight.copy_(weight.detach())
        norm.weight.requires_grad_(weight.requires_grad)
        return norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.hidden:
            raise ValueError(f"HeadRMSNorm input has {x.shape[-1]} features, expected head_dim={self.hidden}")
        lead = x.shape[:-1]
        y = _ShardedRMSNorm.apply(x.reshape(-1, self.hidden), self.weight, self, uses_token(self.grid, [self.weight]))
        return y.reshape(*lead, self.hidden)

    def extra_repr(self) -> str:
        return (f"head_dim={self.hidden}, eps={self.eps}, per local head, grid {self.grid.shape}"
                + (", weight as 1 + w (Gemma)" if self.unit_offset else ""))
