"""A stack of residual MLP blocks: ``x + down(gelu(up(x)))``, up normal (h -> f), down transposed (f -> h).

On a grid the whole stack runs in the layer layout: the input is sharded once (tokens over z, features over x),
every up/down pair needs no redistribution (a normal layer's output layout is a transposed layer's input
layout, and a transposed layer's output layout is a normal layer's input layout), and the output is gathered
once. Without a grid it is the serial model with the same initialisation, for checking.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..core.grid import Grid
from ..nn.init import reference_linear
from ..tensor_parallel.linear import Linear
from ..tensor_parallel.redistribute import gather_tokens_features, shard_tokens_features


class MLPStack(nn.Module):
    """``depth`` blocks of width ``hidden`` with inner width ``ffn`` (default 4*hidden).

    ``grid=None`` builds the serial model; a grid builds the parallel one. The same ``seed`` gives the same
    weights either way. ``recompute`` recomputes each block's activations in backward.
    """

    def __init__(self, hidden: int, depth: int, ffn: Optional[int] = None, grid: Optional[Grid] = None,
                 seed: int = 0, bias: bool = True, recompute: bool = False) -> None:
        super().__init__()
        self.grid, self.hidden, self.recompute = grid, hidden, recompute
        ffn = ffn or 4 * hidden
        ups, downs = [], []
        for i in range(depth):
            su, sd = seed * 1000 + 2 * i, seed * 1000 + 2 * i + 1
            if grid is None:
                ups.append(reference_linear(hidden, ffn, bias, su))
                downs.append(reference_linear(ffn, hidden, bias, sd))
            else:
                ups.append(Linear(hidden, ffn, bias, transpose=False, grid=grid, seed=su,
                                  input_layout="sharded", output_layout="sharded"))
                downs.append(Linear(ffn, hidden, bias, transpose=True, grid=grid, seed=sd,
                                    input_layout="sharded", output_layout="sharded"))
        self.ups, self.downs = nn.ModuleList(ups), nn.ModuleList(downs)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[tokens, hidden]`` -> ``[tokens, hidden]`` (replicated over the tensor-parallel block)."""
        m = x.shape[0]
        if self.grid is not None:
            x = shard_tokens_features(x, self.grid, "x")          # [m/Gz, hidden/Gx]
        for up, down in zip(self.ups, self.downs):
            if self.recompute and torch.is_grad_enabled():
                x = x + checkpoint(self._block, x, up, down, use_reentrant=False)
            else:
                x = x + self._block(x, up, down)
        if self.grid is not None:
            x = gather_tokens_features(x, self.grid, "x", m)
        return x

    def _block(self, x: torch.Tensor, up: nn.Module, down: nn.Module) -> torch.Tensor:
        return down(self.act(up(x)))
