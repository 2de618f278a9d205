"""``axgrid.nn.RMSNorm``: root-mean-square normalisation over a feature dimension split across a grid dimension.

The LLaMA family's norm: ``y = w * (x / sqrt(mean(x^2) + eps))``, the statistics over all ``h`` features. On a
grid the input is the residual stream's layout ``x_loc [m', h/G_f]`` (tokens over (d, z), features over
``feature_dim``, ``"x"`` like axgrid's GPT, replicated over the other tensor-parallel letter):

- forward: ``ms = AR_f(sum x_loc^2) / h`` (one all-reduce of ``[m']``), ``xhat = x * rsqrt(ms + eps)``;
- backward: ``g = dy * w``; ``dx = rstd * (g - xhat * AR_f(sum g*xhat) / h)`` (one all-reduce of ``[m']``);
  ``dw = sum_tokens dy * xhat`` is partial over z (this rank's tokens) and summed over z.

The arithmetic follows Hugging Face's ``LlamaRMSNorm``: statistics in fp32, the normalised value cast back to
the input dtype before the weight multiplies it. ``grid=None`` is the serial layer with the same arithmetic.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..grid import Grid
from ..io.part_copy import copy_part_
from ..redistribute import feature_part
from ..io.state_dict import add_state_hooks, deepcopy_keeping_marks
from ..spec import TileSpec
from .replicated_grad import reduce_over_z


class _ShardedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, layer: "RMSNorm") -> torch.Tensor:  # type: ignore[override]
        grid, dim, h = layer.grid, layer.feature_dim, layer.hidden
        xf = x.float()
        ms = grid.comm.all_reduce((xf * xf).sum(-1), dim) / h                 # [m']
        rstd = torch.rsqrt(ms + layer.eps)
        xhat = xf * rstd.unsqueeze(-1)
        ctx.layer, ctx.x_dtype = layer, x.dtype
        ctx.save_for_backward(xhat, rstd, weight)
        return weight * xhat.to(x.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        layer: RMSNorm = ctx.layer
        grid, dim, h = layer.grid, layer.feature_dim, layer.hidden
        xhat, rstd, weight = ctx.saved_tensors
        dyf = dy.float()
        g = dyf * weight.float()
        mean_gx = grid.comm.all_reduce((g * xhat).sum(-1), dim) / h           # [m']
        dx = rstd.unsqueeze(-1) * (g - xhat * mean_gx.unsqueeze(-1))
        dw = None
        if ctx.needs_input_grad[1]:
            (dw,) = reduce_over_z(grid, [layer.weight], [(dyf * xhat.to(ctx.x_dtype).float()).sum(0)])
        return dx.to(ctx.x_dtype), (dw.to(weight.dtype) if dw is not None else None), None


class RMSNorm(nn.Module):
    """RMSNorm over ``hidden`` features; on a grid the features are split over ``feature_dim``.

    Forward: ``[..., hidden]`` (serial) or ``[..., hidden/G_f]`` (grid, stream layout) -> same shape and dtype.
    """

    def __init__(self, hidden: int, grid: Optional[Grid] = None, *, feature_dim: str = "x", eps: float = 1e-6,
                 dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None) -> None:
        super().__init__()
        self.grid, self.hidden, self.feature_dim, self.eps = grid, hidden, feature_dim, eps
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
    def from_dense(cls, weight: torch.Tensor, eps: float, grid: Grid, feature_dim: str = "x") -> "RMSNorm":
        """This rank's slice of a dense norm's ``weight [hidden]``, on the grid's device (``grid=None``: on
        ``weight``'s; on the meta device: ones, for a loader to fill)."""
        meta = weight.device.type == "meta"
        norm = cls(weight.shape[0], grid, feature_dim=feature_dim, eps=eps, dtype=weight.dtype,
                   device=weight.device if grid is None and not meta else None)
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
            return self.weight * xhat.to(x.dtype)
        lead = x.shape[:-1]
        y = _ShardedRMSNorm.apply(x.reshape(-1, self.local), self.weight, self)
        return y.reshape(*lead, self.local)

    def extra_repr(self) -> str:
        where = "serial" if self.grid is None else f"features over {self.feature_dim}, grid {self.grid.shape}"
        return f"hidden={self.hidden}, local={self.local}, eps={self.eps}, {where}"
