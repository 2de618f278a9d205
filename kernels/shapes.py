"""Per-rank GEMM shapes of a GPT model on a Gx x Gy x Gz x Gd grid.

A transformer block has 4 FC layers ``Y = X Wᵀ``, W [n, k]:
QKV W[3h, h] (normal), attention-out W[h, h] (transposed), MLP-up W[4h, h] (normal),
MLP-down W[h, 4h] (transposed). With T tokens per micro-batch, m' = T / (Gd·Gz) tokens per rank;
a normal layer holds W_blk [n/Gy, k/Gx] and runs
    forward      X[m', k/Gx] @ W_blkᵀ   -> GEMM (m', n/Gy, k/Gx)
    input_grad   dY[m', n/Gy] @ W_blk   -> GEMM (m', k/Gx, n/Gy)
    weight_grad  dYᵀ @ X                -> GEMM (n/Gy, k/Gx, m')
and a transposed layer swaps Gx and Gy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

# layers, hidden, heads (GPT table of the AxoNN papers, plus tiny CPU sizes)
MODELS: dict[str, tuple[int, int, int]] = {
    "gpt-tiny": (2, 64, 4), "gpt-mini": (4, 128, 4),
    "gpt-5b": (24, 4096, 32), "gpt-10b": (32, 5120, 40), "gpt-20b": (32, 7168, 56),
    "gpt-40b": (38, 9216, 72), "gpt-60b": (56, 9216, 72), "gpt-80b": (42, 12288, 96),
    "gpt-160b": (84, 12288, 96), "gpt-320b": (96, 16384, 128), "gpt-640b": (192, 16384, 128),
    "gpt-1t": (128, 25600, 160),
}


@dataclass(frozen=True)
class Grid:
    """Process grid sizes, x fastest-varying."""

    gx: int
    gy: int
    gz: int
    gd: int

    def __str__(self) -> str:
        return f"{self.gx}x{self.gy}x{self.gz}x{self.gd}"


@dataclass(frozen=True)
class LayerGemm:
    """One GEMM of one FC layer on one rank: C[m, n] = A[m, k] @ B[k, n]."""

    layer: str
    role: str
    m: int
    n: int
    k: int


def parse_grid(grid: str | Sequence[int] | Grid) -> Grid:
    """'2x2x2x1' (gx x gy x gz x gd) or a 4-sequence -> Grid; raises ValueError naming the bad value."""
    if isinstance(grid, Grid):
        return grid
    parts: Sequence = grid.lower().split("x") if isinstance(grid, str) else grid
    try:
        sizes = [int(p) for p in parts]
    except (TypeError, ValueError):
        sizes = []
    if len(sizes) != 4 or min(sizes) < 1:
        raise ValueError(f"bad grid {grid!r}; write it as GXxGYxGZxGD with positive integers, e.g. '2x2x2x1'")
    return Grid(*sizes)


def model_sizes(model: str | Sequence[int] | Mapping[str, int]) -> tuple[int, int, int]:
    """(layers, hidden, heads) from a name in MODELS, a 3-sequence or a mapping with those keys."""
    if isinstance(model, str):
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; use one of {sorted(MODELS)} or pass (layers, hidden, heads)")
        return MODELS[model]
    if isinstance(model, Mapping):
        return int(model["layers"]), int(model["hidden"]), int(model["heads"])
    layers, hidden, heads = (int(v) for v in model)
    return layers, hidden, heads


def _div(value: int, by: int, what: str) -> int:
    if value % by:
        raise ValueError(f"{what} = {value} is not divisible by {by}; choose a grid/token count that divides it")
    return value // by


def block_layers(hidden: int) -> list[tuple[str, int, int, bool]]:
    """(name, n, k, transposed) of the four FC layers of a block with hidden size ``hidden``."""
    h = hidden
    return [("qkv", 3 * h, h, False), ("attn_out", h, h, True), ("mlp_up", 4 * h, h, False), ("mlp_down", h, 4 * h, True)]


def layer_gemms(model: str | Sequence[int] | Mapping[str, int], grid: str | Sequence[int] | Grid,
                tokens: int) -> list[LayerGemm]:
    """Every GEMM (3 per layer) of one transformer block on one rank; all blocks are identical."""
    _, hidden, heads = model_sizes(model)
    g = parse_grid(grid)
    m = _div(tokens, g.gd * g.gz, "tokens (per micro-batch) over Gd*Gz")
    _div(heads, g.gy, "attention heads over Gy (QKV output is split over y by heads)")
    out: list[LayerGemm] = []
    for name, n, k, transposed in block_layers(hidden):
        gk, gn = (g.gy, g.gx) if transposed else (g.gx, g.gy)  # k split over gk, n over gn
        kk = _div(k, gk, f"{name} in_features over G{'y' if transposed else 'x'}")
        nn = _div(n, gn, f"{name} out_features over G{'x' if transposed else 'y'}")
        out += [LayerGemm(name, "forward", m, nn, kk), LayerGemm(name, "input_grad", m, kk, nn),
                LayerGemm(name, "weight_grad", nn, kk, m)]
    return out


def layer_gemm_shapes(model: str | Sequence[int] | Mapping[str, int], grid: str | Sequence[int] | Grid,
                      tokens: int) -> list[tuple[int, int, int, str]]:
    """Distinct (m, n, k, role) a rank runs for ``model`` on ``grid`` with ``tokens`` per micro-batch, in layer order."""
    seen: dict[tuple[int, int, int, str], None] = {}
    for g in layer_gemms(model, grid, tokens):
        seen.setdefault((g.m, g.n, g.k, g.role), None)
    return list(seen)
