"""Per-rank geometry of one FC layer ``W [n, k]`` (see :mod:`axgrid.spec.layers` for which dimension splits what).

With ``m'`` tokens on the rank (tokens split over (d, z)), ``G_in``/``G_out`` the sizes of ``in_dim``/``out_dim``:

===========  =========================================================================================
W block      ``[n/G_out, k/G_in]``, flattened, padded to a multiple of Gz and split over z (the shard)
bias         ``[n/G_out]``, replicated over ``in_dim``, z and d
forward      ``AG_z`` of the padded block; ``X [m', k/G_in] @ W_blkᵀ`` then ``AR_in_dim`` of ``[m', n/G_out]``
backward     ``AR_out_dim`` of ``dX [m', k/G_in]``; ``RS_z`` of the padded ``dW``; ``AR_z`` of ``db [n/G_out]``
===========  =========================================================================================

:func:`fc_volumes` gives these sizes for any grid (ints or integer arrays, sizes that do not divide rounded
up, as perfmodel prices them); :class:`LinearSharding` gives one rank's exact piece (sizes must divide).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .layout import Coord, GridShape
from .layers import FCLayer
from .tiles import TileSpec, ceil_div, segment_row_map, split_part


@dataclass(frozen=True)
class FCVolumes:
    """Elements per call of one FC layer on one rank (ints, or integer arrays ``[N]`` for N grids).

    ``block`` = ``n_loc·k_loc``; ``padded``: the block rounded up to a multiple of Gz (the AG_z output and RS_z
    input); ``shard`` = ``padded/Gz`` (the stored weight, AR_d); ``bias_loc``: ``n_loc`` or 0 without bias;
    ``fwd_ar``/``bwd_ar``: the forward output and input gradient all-reduced over ``fwd_ar_dim``/``bwd_ar_dim``.
    """

    fwd_ar_dim: str
    bwd_ar_dim: str
    fwd_ar: Any
    bwd_ar: Any
    n_loc: Any
    k_loc: Any
    block: Any
    padded: Any
    shard: Any
    bias_loc: Any


def fc_volumes(layer: FCLayer, gx, gy, gz, mprime) -> FCVolumes:
    """The sizes of ``layer`` on grids ``(gx, gy, gz)`` with ``mprime`` tokens per rank (ints or arrays)."""
    g_in, g_out = (gy, gx) if layer.transposed else (gx, gy)
    n_loc, k_loc = ceil_div(layer.n, g_out), ceil_div(layer.k, g_in)
    block = n_loc * k_loc
    shard = ceil_div(block, gz)
    return FCVolumes(fwd_ar_dim=layer.in_dim, bwd_ar_dim=layer.out_dim, fwd_ar=mprime * n_loc,
                     bwd_ar=mprime * k_loc, n_loc=n_loc, k_loc=k_loc, block=block, padded=shard * gz, shard=shard,
                     bias_loc=n_loc if layer.bias else n_loc * 0)


@dataclass(frozen=True)
class LinearSharding:
    """Which part of the dense layer ``[out_features, in_features]`` one rank holds: the block of rows
    ``row0 : row0+n_blk`` and columns ``col0 : col0+k_blk``, of which it stores z-part ``z`` of ``gz``.

    ``out_segments``: a fused layer's output features as consecutive segments (Phi-3's ``qkv_proj``:
    ``(H·d, H_kv·d, H_kv·d)``), each split over ``out_dim`` on its own: the block's rows are then this rank's share
    of every segment in turn, and ``row0`` counts in that layout (the tiles carry the row map,
    :func:`~axgrid.spec.tiles.segment_row_map`)."""

    in_features: int
    out_features: int
    in_dim: str         # grid dimension splitting in_features ("x" normal, "y" transposed)
    out_dim: str        # grid dimension splitting out_features
    n_blk: int          # out_features / G_out
    k_blk: int          # in_features / G_in
    row0: int           # first row (output feature) of this rank's block
    col0: int           # first column (input feature) of this rank's block
    gz: int
    z: int
    out_segments: tuple[int, ...] = ()

    @property
    def row_map(self) -> tuple[tuple[int, int], ...]:
        """The tiles' row map (empty for an unfused layer)."""
        return segment_row_map(self.out_segments, self.out_features // self.n_blk) if self.out_segments else ()

    @property
    def block_numel(self) -> int:
        return self.n_blk * self.k_blk

    @property
    def shard_numel(self) -> int:
        return split_part(self.block_numel, self.gz, self.z)[0]

    @property
    def padded_numel(self) -> int:
        return self.shard_numel * self.gz

    @property
    def shard_start(self) -> int:
        """Offset of this rank's shard in the flattened (row-major) block."""
        return split_part(self.block_numel, self.gz, self.z)[1]

    @property
    def weight_tile(self) -> TileSpec:
        """The weight's tile: the block, flattened and split over z."""
        return TileSpec((self.out_features, self.in_features), (self.row0, self.col0), (self.n_blk, self.k_blk),
                        "z", self.gz, self.z, self.row_map)

    @property
    def bias_tile(self) -> TileSpec:
        return TileSpec((self.out_features,), (self.row0,), (self.n_blk,), row_map=self.row_map)

    @staticmethod
    def of(shape: GridShape, coord: Coord, in_features: int, out_features: int,
           transpose: bool, out_segments: tuple[int, ...] = ()) -> "LinearSharding":
        """The piece of the rank at ``coord`` on a grid of ``shape``; a ValueError names a size that does not
        divide."""
        layer = FCLayer(out_features, in_features, transpose)
        g_in, g_out = shape.extent(layer.in_dim), shape.extent(layer.out_dim)
        for name, f, g, d in (("in_features", in_features, g_in, layer.in_dim),
                              ("out_features", out_features, g_out, layer.out_dim)):
            if f % g:
                kind = "transposed" if transpose else "normal"
                raise ValueError(f"{name}={f} is not divisible by G{d}={g} (grid {shape}, {kind} layer); "
                                 f"choose {name} divisible by {g}, another grid, or transpose={not transpose}")
        if out_segments and (sum(out_segments) != out_features or any(s % g_out for s in out_segments)):
            raise ValueError(f"out_segments={tuple(out_segments)} must add up to out_features={out_features}, each "
                             f"divisible by G{layer.out_dim}={g_out} (grid {shape})")
        v = fc_volumes(layer, shape.gx, shape.gy, shape.gz, 1)
        return LinearSharding(in_features, out_features, layer.in_dim, layer.out_dim, v.n_loc, v.k_loc,
                              coord[layer.out_dim] * v.n_loc, coord[layer.in_dim] * v.k_loc, shape.gz, coord.z,
                              tuple(out_segments) if len(out_segments) > 1 else ())


__all__ = ["FCVolumes", "fc_volumes", "LinearSharding"]
