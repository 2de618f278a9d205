"""Autograd-aware moves of activations between the replicated layout and a parallel layer's layout.

Replicated layout: every rank of the tensor-parallel block holds the same ``[m, f]`` (its data-parallel
shard's tokens, all features); gradients are replicated the same way.
Layer layout: tokens split over z (first ``m % Gz`` ranks hold one more), features split over ``feature_dim``
("x" or "y"), replicated over the other of the two: ``[m/Gz, f/G_feature]``.

``shard_tokens_features`` (replicated -> layer layout) is a slice forward, an all-gather backward;
``gather_tokens_features`` (layer layout -> replicated) is an all-gather forward, a slice backward.
"""
from __future__ import annotations

import torch

from ..core.grid import Grid


def token_split(m: int, parts: int) -> list[int]:
    """Rows each of ``parts`` ranks holds when ``m`` rows are split as evenly as possible."""
    base, extra = divmod(m, parts)
    return [base + (i < extra) for i in range(parts)]


def _row_range(m: int, parts: int, index: int) -> tuple[int, int]:
    sizes = token_split(m, parts)
    start = sum(sizes[:index])
    return start, start + sizes[index]


def _slice(x: torch.Tensor, grid: Grid, feature_dim: str) -> torch.Tensor:
    m, f = x.shape
    gz, gf = grid.size("z"), grid.size(feature_dim)
    r0, r1 = _row_range(m, gz, grid.index("z"))
    fl = f // gf
    c0 = grid.index(feature_dim) * fl
    return x[r0:r1, c0:c0 + fl].contiguous()


def _gather(x_loc: torch.Tensor, grid: Grid, feature_dim: str, m: int) -> torch.Tensor:
    comm = grid.comm
    rows, fl = x_loc.shape
    gf = grid.size(feature_dim)
    if gf > 1:
        stacked = comm.all_gather(x_loc, feature_dim)  # [Gf, rows, fl]
        x_loc = stacked.permute(1, 0, 2).reshape(rows, gf * fl)
    if grid.size("z") > 1:
        x_loc = comm.all_gather_uneven(x_loc, "z", token_split(m, grid.size("z")))
    return x_loc


class _Shard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, grid: Grid, feature_dim: str) -> torch.Tensor:  # type: ignore[override]
        ctx.grid, ctx.feature_dim, ctx.m = grid, feature_dim, x.shape[0]
        return _slice(x, grid, feature_dim)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        return _gather(dy.contiguous(), ctx.grid, ctx.feature_dim, ctx.m), None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_loc: torch.Tensor, grid: Grid, feature_dim: str, m: int) -> torch.Tensor:  # type: ignore[override]
        ctx.grid, ctx.feature_dim = grid, feature_dim
        return _gather(x_loc.contiguous(), grid, feature_dim, m)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        return _slice(dy, ctx.grid, ctx.feature_dim), None, None, None


def check_features(f: int, grid: Grid, feature_dim: str, what: str = "features") -> None:
    g = grid.size(feature_dim)
    if f % g:
        raise ValueError(f"{what}={f} is not divisible by G{feature_dim}={g} of grid {grid.shape}; "
                         f"choose {what} divisible by {g} or a grid with G{feature_dim} dividing {f}")


def feature_part(grid: "Grid | None", size: int, feature_dim: str, what: str) -> tuple[int, int]:
    """``(local size, first index)`` of this rank's slice of ``size`` features split over ``feature_dim``
    ("x" or "y"); the whole range without a grid. ``what`` names the quantity in the error."""
    if feature_dim not in ("x", "y"):
        raise ValueError(f"feature_dim={feature_dim!r} must be 'x' or 'y'")
    if grid is None:
        return size, 0
    check_features(size, grid, feature_dim, what)
    local = size // grid.size(feature_dim)
    return local, grid.index(feature_dim) * local


def shard_tokens_features(x: torch.Tensor, grid: Grid, feature_dim: str) -> torch.Tensor:
    """``[m, f]`` replicated -> ``[m/Gz, f/G_feature]`` (this rank's tokens and features). Differentiable."""
    if x.dim() != 2:
        raise ValueError(f"expected a 2-D [tokens, features] tensor, got shape {tuple(x.shape)}")
    check_features(x.shape[1], grid, feature_dim)
    if grid.size("z") == 1 and grid.size(feature_dim) == 1:
        return x
    return _Shard.apply(x, grid, feature_dim)


def gather_tokens_features(x_loc: torch.Tensor, grid: Grid, feature_dim: str, m: int | None = None) -> torch.Tensor:
    """``[m/Gz, f/G_feature]`` -> ``[m, f]`` replicated. ``m``: the total tokens; when it is not given, the
    z-ranks exchange their row counts (one small all-gather) so an uneven split is handled alike everywhere.
    Differentiable."""
    if x_loc.dim() != 2:
        raise ValueError(f"expected a 2-D [tokens, features] tensor, got shape {tuple(x_loc.shape)}")
    gz = grid.size("z")
    if m is None:
        rows = grid.comm.all_gather(torch.tensor([x_loc.shape[0]], dtype=torch.int64, device=x_loc.device), "z")
        counts = [int(v) for v in rows.reshape(-1).tolist()]
        m = sum(counts)
        if counts != token_split(m, gz):     # the same verdict on every z-rank: they all see all counts
            raise ValueError(f"token rows per z-rank {counts} are not the split of m={m} tokens over Gz={gz} "
                             f"({token_split(m, gz)}); shard tokens with shard_tokens_features")
    elif token_split(m, gz)[grid.index("z")] != x_loc.shape[0]:
        raise ValueError(f"this rank holds {x_loc.shape[0]} token rows, which is not its part of m={m} tokens "
                         f"split over Gz={gz}")
    if grid.size("z") == 1 and grid.size(feature_dim) == 1:
        return x_loc
    return _Gather.apply(x_loc, grid, feature_dim, m)
