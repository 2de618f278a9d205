"""Per-rank GEMM shapes of a GPT model on a Gx x Gy x Gz x Gd grid (the layers and their sharding come from
:mod:`axgrid.spec`).

With T tokens per micro-batch, m' = T / (Gd·Gz) tokens per rank; a layer W [n, k] holds the block
W_blk [n_blk, k_blk] (n over its ``out_dim``, k over its ``in_dim``) and runs
    forward      X[m', k_blk] @ W_blkᵀ   -> GEMM (m', n_blk, k_blk)
    input_grad   dY[m', n_blk] @ W_blk   -> GEMM (m', k_blk, n_blk)
    weight_grad  dYᵀ @ X                 -> GEMM (n_blk, k_blk, m')
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from axgrid.spec import GridShape, TransformerShape, block_layers, fc_volumes


@dataclass(frozen=True)
class LayerGemm:
    """One GEMM of one FC layer on one rank: C[m, n] = A[m, k] @ B[k, n]."""

    layer: str
    role: str
    m: int
    n: int
    k: int


def model_sizes(model: str | Sequence[int] | Mapping[str, int]) -> tuple[int, int, int]:
    """(layers, hidden, heads) from a named size (``axgrid.spec.NAMED_SIZES``), a 3-sequence or a mapping."""
    if isinstance(model, str):
        shape = TransformerShape.named(model)
        return shape.layers, shape.hidden, shape.heads
    if isinstance(model, Mapping):
        return int(model["layers"]), int(model["hidden"]), int(model["heads"])
    layers, hidden, heads = (int(v) for v in model)
    return layers, hidden, heads


def _div(value: int, by: int, what: str) -> int:
    if value % by:
        raise ValueError(f"{what} = {value} is not divisible by {by}; choose a grid/token count that divides it")
    return value // by


def layer_gemms(model: str | Sequence[int] | Mapping[str, int], grid: str | Sequence[int] | GridShape,
                tokens: int) -> list[LayerGemm]:
    """Every GEMM (3 per layer) of one transformer block on one rank; all blocks are identical."""
    _, hidden, heads = model_sizes(model)
    g = GridShape.parse(grid)
    m = _div(tokens, g.gd * g.gz, "tokens (per micro-batch) over Gd*Gz")
    _div(heads, g.gy, "attention heads over Gy (QKV output is split over y by heads)")
    out: list[LayerGemm] = []
    for layer in block_layers(hidden):
        _div(layer.k, g.extent(layer.in_dim), f"{layer.name} in_features over G{layer.in_dim}")
        _div(layer.n, g.extent(layer.out_dim), f"{layer.name} out_features over G{layer.out_dim}")
        v = fc_volumes(layer, g.gx, g.gy, g.gz, m)
        nn, kk = v.n_loc, v.k_loc
        out += [LayerGemm(layer.name, "forward", m, nn, kk), LayerGemm(layer.name, "input_grad", m, kk, nn),
                LayerGemm(layer.name, "weight_grad", nn, kk, m)]
    return out


def layer_gemm_shapes(model: str | Sequence[int] | Mapping[str, int], grid: str | Sequence[int] | GridShape,
                      tokens: int) -> list[tuple[int, int, int, str]]:
    """Distinct (m, n, k, role) a rank runs for ``model`` on ``grid`` with ``tokens`` per micro-batch, in layer
    order."""
    seen: dict[tuple[int, int, int, str], None] = {}
    for g in layer_gemms(model, grid, tokens):
        seen.setdefault((g.m, g.n, g.k, g.role), None)
    return list(seen)
