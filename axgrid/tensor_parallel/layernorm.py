"""``axgrid.nn.LayerNorm``: layer normalisation over a feature dimension that is split across a grid dimension.

On a grid the input is the layer layout ``x_loc [m', h/G_f]`` (tokens over (d, z), features over ``feature_dim``,
``"x"`` for the GPT residual stream, replicated over the other tensor-parallel letter). The statistics are
computed over all ``h`` features:

- forward: ``mean = AR_f(sum x_loc) / h``; ``var = AR_f(sum (x_loc - mean)^2) / h`` (two-pass, two all-reduces
  of ``[m']`` each);
- backward: ``g = dy * w``; one all-reduce over ``feature_dim`` of ``[m', 2]`` (``sum g``, ``sum g*xhat``), then
  ``dx = rstd * (g - mean(g) - xhat * mean(g*xhat))``; ``dw``/``db`` are partial over z (this rank's tokens) and
  are summed over z (one all-reduce of ``[2, h/G_f]``).

Weight and bias are the tile ``[f0 : f0 + h/G_f]`` of the dense ``[h]`` vectors, replicated over the other
tensor-parallel letter, z and d. Statistics and the normalisation run in fp32 (also under autocast); the output
is fp32. ``grid=None`` is the serial layer (``F.layer_norm``) with the same initialisation (weight 1, bias 0).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from ..core.grid import Grid
from .redistribute import feature_part
from ..io.state_dict import add_state_hooks, deepcopy_keeping_marks
from ..spec import TileSpec
from .replicated_grad import reduce_over_z, token_grad, uses_token


class _ShardedLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],  # type: ignore[override]
                layer: "LayerNorm", uses: Optional[torch.Tensor] = None) -> torch.Tensor:
        grid, dim, h = layer.grid, layer.feature_dim, layer.hidden
        xf = x.float()
        mean = grid.comm.all_reduce(xf.sum(-1), dim) / h                       # [m']
        xc = xf - mean.unsqueeze(-1)
        var = grid.comm.all_reduce((xc * xc).sum(-1), dim) / h               # [m']
        rstd = torch.rsqrt(var + layer.eps)
        xhat = xc * rstd.unsqueeze(-1)
        y = xhat * weight.float()
        if bias is not None:
            y = y + bias.float()
        ctx.layer, ctx.has_bias, ctx.x_dtype = layer, bias is not None, x.dtype
        ctx.save_for_backward(xhat, rstd, weight)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        layer: LayerNorm = ctx.layer
        grid, dim, h = layer.grid, layer.feature_dim, layer.hidden
        xhat, rstd, weight = ctx.saved_tensors
        dy = dy.float()
        g = dy * weight.float()
        sums = torch.stack([g.sum(-1), (g * xhat).sum(-1)], dim=-1)          # [m', 2]
        sums = grid.comm.all_reduce(sums, dim) / h
        dx = rstd.unsqueeze(-1) * (g - sums[:, :1] - xhat * sums[:, 1:])
        # the trained ones of weight and bias (a frozen norm, as under LoRA, computes and reduces nothing): one call
        need_w, need_b = ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]
        params = [p for p, need in ((layer.weight, need_w), (layer.bias, need_b)) if need]
        grads = [g() for g, need in ((lambda: (dy * xhat).sum(0), need_w), (lambda: dy.sum(0), need_b)) if need]
        reduced = iter(reduce_over_z(grid, params, grads) if params else [])
        dw = next(reduced) if need_w else None
        db = next(reduced) if need_b else None
        dw = dw.to(weight.dtype) if dw is not None else None
        db = db.to(weight.dtype) if db is not None else None
        return dx.to(ctx.x_dtype), dw, db, None, token_grad(ctx, 4, dy)


class LayerNorm(nn.Module):
    """LayerNorm over ``hidden`` features; on a grid the features are split over ``feature_dim``.

    Forward: ``[..., hidden]`` (serial) or ``[m', hidden/G_f]`` (grid, layer layout) -> same shape, fp32.
    """

    def __init__(self, hidden: int, grid: Optional[Grid] = None, *, feature_dim: str = "x", eps: float = 1e-5,
                 bias: bool = True, dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None) -> None:
        super().__init__()
        self.grid, self.hidden, self.feature_dim, self.eps = grid, hidden, feature_dim, eps
        dtype = dtype or torch.get_default_dtype()
        local, f0 = feature_part(grid, hidden, feature_dim, "LayerNorm hidden")
        device = device or (grid.device if grid is not None else torch.device("cpu"))
        self.local, self.f0 = local, f0
        self.weight = nn.Parameter(torch.ones(local, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(local, dtype=dtype, device=device)) if bias else None
        if grid is not None:
            other = "y" if feature_dim == "x" else "x"
            for p in (self.weight, self.bias):
                if p is not None:
                    p.axgrid_tile = TileSpec((hidden,), (f0,), (local,))
                    p.axgrid_replicated = other + "zd"
        add_state_hooks(self)

    __deepcopy__ = deepcopy_keeping_marks     # the copy keeps its TileSpecs and shares the grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.local:
            raise ValueError(f"LayerNorm input has {x.shape[-1]} features, expected {self.local} "
                             f"(hidden={self.hidden}{'' if self.grid is None else ' / G' + self.feature_dim})")
        if self.grid is None:
            return F.layer_norm(x.float(), (self.hidden,), self.weight.float(),
                                None if self.bias is None else self.bias.float(), self.eps)
        lead = x.shape[:-1]
        y = _ShardedLayerNorm.apply(x.reshape(-1, self.local), self.weight, self.bias, self,
                                    uses_token(self.grid, [self.weight, self.bias]))
        return y.reshape(*lead, self.local)

    def extra_repr(self) -> str:
        where = "serial" if self.grid is None else f"features over {self.feature_dim}, grid {self.grid.shape}"
        return f"hidden={self.hidden}, local={self.local}, eps={self.eps}, {where}"
