"""``axgrid.nn.Embedding``: a lookup table whose feature columns are split over a grid dimension.

On a grid each rank holds ``E[:, f0 : f0 + dim/G_f]`` of the dense table ``E [num, dim]`` (all rows, its slice of
the features along ``feature_dim``, replicated over the other tensor-parallel letter, z and d). A lookup of this
rank's token ids gives ``[m', dim/G_f]`` -- exactly the layer layout of a normal ``axgrid.nn.Linear``'s input
when ``feature_dim="x"`` -- with no communication in forward. Backward scatters the output gradient into a
dense ``[num, dim/G_f]`` gradient (partial: this rank's tokens only) and sums it over z (one all-reduce of the
local table's size per micro-batch); the mean over d is :func:`axgrid.sync_gradients`'s. The scatter accumulates
deterministically (``index_put_(accumulate=True)``: sorted by row on a GPU, where ``index_add_`` uses atomics), so
the table's replicas over the other letter get bit-identical gradients and stay replicas.

Initialisation is hashed (see :mod:`axgrid.nn.init`): element (i, j) of the dense table is
``U(-sqrt(3)*std, sqrt(3)*std)`` (variance ``std**2``) drawn from ``(seed, index i*dim + j)``, so each rank
computes only its own columns and every grid (and ``grid=None``, the serial table) holds the same values.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from ..core.grid import Grid
from ..io.part_copy import copy_part_
from .redistribute import feature_part
from ..io.state_dict import add_state_hooks, deepcopy_keeping_marks
from ..spec import TileSpec
from ..nn import init as _init
from .replicated_grad import reduce_over_z, token_grad, uses_token

EMBEDDING_STREAM = 3



def scale_value(scale: float, dtype: torch.dtype) -> float:
    """An embedding's output scale (Gemma's ``sqrt(h)``) as Hugging Face applies it -- the fp32 value cast to the
    table's ``dtype`` -- as a Python number: the product is the same, and autograd saves no tensor for it."""
    return torch.tensor(scale, dtype=torch.float32).to(dtype).item()

class _ShardedLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, layer: "Embedding",  # type: ignore[override]
                uses: Optional[torch.Tensor] = None) -> torch.Tensor:
        ctx.layer, ctx.num = layer, weight.shape[0]
        ctx.save_for_backward(ids)
        return weight.index_select(0, ids)

    @staticmethod
    def backward(ctx, dout: torch.Tensor):  # type: ignore[override]
        layer: Embedding = ctx.layer
        (ids,) = ctx.saved_tensors
        w = layer.weight
        grad = torch.zeros((ctx.num, dout.shape[-1]), dtype=torch.float32, device=dout.device)
        grad.index_put_((ids,), dout.float(), accumulate=True)     # deterministic: no atomics on a GPU
        if layer.padding_idx is not None:
            grad[layer.padding_idx] = 0          # like nn.Embedding: the padding row never learns
        (grad,) = reduce_over_z(layer.grid, [w], [grad])
        return None, (grad.to(w.dtype) if grad is not None else None), None, token_grad(ctx, 3, dout)


class Embedding(nn.Module):
    """``num`` rows of ``dim`` features; on a grid the features are split over ``feature_dim``.

    Forward: integer ids of any shape ``[...]`` -> ``[..., dim]`` (serial) or ``[..., dim/G_f]`` (grid), times
    ``scale`` when given (Gemma's ``sqrt(dim)``, cast to the table's dtype first, as Hugging Face does).
    """

    def __init__(self, num: int, dim: int, grid: Optional[Grid] = None, *, feature_dim: str = "x", seed: int = 0,
                 std: float = 0.02, padding_idx: Optional[int] = None, dtype: Optional[torch.dtype] = None,
                 device: Optional[torch.device] = None, init: bool = True, scale: Optional[float] = None) -> None:
        super().__init__()
        self.scale = scale
        self.grid, self.num, self.dim, self.feature_dim = grid, num, dim, feature_dim
        if padding_idx is not None and not -num <= padding_idx < num:
            raise ValueError(f"padding_idx={padding_idx} is outside the table's {num} rows")
        self.padding_idx = None if padding_idx is None else padding_idx % num
        self.seed, self.std = seed, std
        local, f0 = feature_part(grid, dim, feature_dim, "Embedding dim")
        device = device or (grid.device if grid is not None else torch.device("cpu"))
        self.local, self.f0 = local, f0
        self.weight = nn.Parameter(torch.empty(num, local, dtype=dtype or torch.get_default_dtype(), device=device))
        if grid is not None:
            other = "y" if feature_dim == "x" else "x"
            self.weight.axgrid_tile = TileSpec((num, dim), (0, f0), (num, local))
            self.weight.axgrid_replicated = other + "zd"
        if init:                                  # init=False: left uninitialised for a loader that fills it
            self.reset_parameters()
        add_state_hooks(self)

    __deepcopy__ = deepcopy_keeping_marks     # the copy keeps its TileSpecs and shares the grid

    def reset_parameters(self) -> None:
        """Fill this rank's columns from the hashed initialisation (no communication, no full table)."""
        bound = math.sqrt(3.0) * self.std
        with torch.no_grad():
            self.weight.copy_(_init.uniform_block(self.seed, EMBEDDING_STREAM, self.dim, range(self.num),
                                                  range(self.f0, self.f0 + self.local), bound, torch.float64,
                                                  self.weight.device))

    @classmethod
    def from_dense(cls, dense: nn.Embedding, grid: Grid, feature_dim: str = "x",
                   scale: Optional[float] = None) -> "Embedding":
        """This rank's columns of a dense ``nn.Embedding`` (held in full on every rank), on the grid's device
        (``grid=None``: on ``dense``'s); padding row kept. A ``dense`` on the meta device gives an uninitialised
        table (for a loader to fill)."""
        w = dense.weight
        meta = w.device.type == "meta"
        emb = cls(dense.num_embeddings, dense.embedding_dim, grid, feature_dim=feature_dim,
                  padding_idx=dense.padding_idx, dtype=w.dtype, device=w.device if grid is None and not meta else None,
                  init=False, scale=scale)
        with torch.no_grad():
            if not meta:
                if grid is None:
                    emb.weight.copy_(w.detach())
                else:
                    copy_part_(emb.weight.axgrid_tile, w, emb.weight)
        emb.weight.requires_grad_(w.requires_grad)
        return emb

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"embedding ids must be int64 or int32, got {ids.dtype}")
        if self.grid is None:
            out = F.embedding(ids, self.weight, self.padding_idx)
        else:
            out = _ShardedLookup.apply(ids.reshape(-1).long(), self.weight, self,
                                       uses_token(self.grid, [self.weight])).reshape(*ids.shape, self.local)
        if self.scale is not None:
            out = out * scale_value(self.scale, self.weight.dtype)
        return out

    def extra_repr(self) -> str:
        where = "serial" if self.grid is None else f"features over {self.feature_dim}, grid {self.grid.shape}"
        return f"num={self.num}, dim={self.dim}, local={self.local}, {where}"
