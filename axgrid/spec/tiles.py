"""How a rank's parameter is a piece of a dense tensor: a rectangular tile, optionally flattened and split.

The split rule (one definition for the runtime's weight shards, checkpoints and perfmodel's volumes): a flat
buffer of ``numel`` elements is zero-padded to ``parts · ceil(numel/parts)`` and cut into ``parts`` equal parts;
part ``i`` holds elements ``[i·part, min((i+1)·part, numel))`` of the buffer, the rest of it is padding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import torch


def ceil_div(a, b):
    """``ceil(a / b)`` for ints or integer arrays."""
    return -(-a // b)


def split_part(numel: int, parts: int, index: int) -> tuple[int, int, int]:
    """``(part, start, stop)``: part ``index`` of ``parts`` of a flat buffer of ``numel`` elements holds
    ``part`` elements, of which ``[start, stop)`` of the buffer are real (``stop - start`` may be less than
    ``part``, even 0: the tail is padding)."""
    part = ceil_div(numel, parts)
    start = index * part
    return part, start, max(start, min(start + part, numel))


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

    def part_range(self) -> tuple[int, int]:
        """``[start, stop)`` of the flattened tile held by this rank's part (the whole tile when not split)."""
        if not self.split_dim:
            return 0, self.tile_numel
        _, start, stop = split_part(self.tile_numel, self.split_size, self.split_index)
        return start, stop

    @property
    def part_numel(self) -> int:
        """Elements of this rank's parameter (the padded part when split, else the whole tile)."""
        return split_part(self.tile_numel, self.split_size, 0)[0] if self.split_dim else self.tile_numel

    def part_of(self, tile: "torch.Tensor") -> "torch.Tensor":
        """This rank's parameter data ``[part_numel]`` (or ``tile_shape`` unsplit) cut from the whole ``tile``."""
        if tuple(tile.shape) != tuple(self.tile_shape):
            raise ValueError(f"tile has shape {tuple(tile.shape)}, expected {self.tile_shape}")
        if not self.split_dim:
            return tile.clone()
        flat = tile.reshape(-1)
        out = flat.new_zeros(self.part_numel)
        start, stop = self.part_range()
        out[: stop - start] = flat[start:stop]
        return out

    def slices(self) -> tuple[slice, ...]:
        """Where the tile sits in the dense tensor."""
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.tile_shape))
