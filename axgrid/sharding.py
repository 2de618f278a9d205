"""How a rank's parameter relates to the dense tensor it is a piece of: the contract between parallel layers,
checkpoints (which reshard through it) and anything else that must see the dense model.

Every parameter of a parallel layer carries ``param.axgrid_tile``, a :class:`TileSpec`. A parameter without one
is dense and replicated on every rank. ``param.axgrid_replicated`` names the grid letters the parameter is
replicated over (used to count each element once in norms and to pick one writer per tile).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class TileSpec:
    """This rank's parameter is the rectangular tile ``dense[offsets : offsets + tile_shape]`` of a dense tensor
    of ``dense_shape`` -- or, when ``split_dim`` is set (``"z"``), this rank's 1/G part of that tile flattened
    row-major and zero-padded to a multiple of G (the group along ``split_dim``), member ``split_index``.
    """

    dense_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    tile_shape: tuple[int, ...]
    split_dim: Optional[str] = None
    split_size: int = 1
    split_index: int = 0

    @property
    def tile_numel(self) -> int:
        n = 1
        for s in self.tile_shape:
            n *= s
        return n

    @property
    def part_numel(self) -> int:
        """Elements of this rank's parameter (the padded part when split, else the whole tile)."""
        return -(-self.tile_numel // self.split_size) if self.split_dim else self.tile_numel

    def part_of(self, tile: torch.Tensor) -> torch.Tensor:
        """This rank's parameter data cut from the whole ``tile`` (shape ``tile_shape``)."""
        if tuple(tile.shape) != tuple(self.tile_shape):
            raise ValueError(f"tile has shape {tuple(tile.shape)}, expected {self.tile_shape}")
        if not self.split_dim:
            return tile.clone()
        flat = tile.reshape(-1)
        out = torch.zeros(self.part_numel, dtype=tile.dtype, device=tile.device)
        start = self.split_index * self.part_numel
        stop = min(start + self.part_numel, self.tile_numel)
        if stop > start:
            out[: stop - start] = flat[start:stop]
        return out

    def slices(self) -> tuple[slice, ...]:
        """Where the tile sits in the dense tensor."""
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.tile_shape))


def tile_of(param: torch.Tensor) -> Optional[TileSpec]:
    return getattr(param, "axgrid_tile", None)
