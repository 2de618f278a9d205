"""Which part of a dense tensor a rank holds, as index ranges of the dense tensor: the one place that knows it.

A parameter's :class:`~axgrid.spec.TileSpec` says the rank holds the tile ``dense[offsets : offsets + tile_shape]``
or, split over z, the elements ``[start, stop)`` of that tile flattened row-major (zero-padded to
``part_numel``). Here that becomes a list of :class:`Box` -- rectangles of the dense tensor whose row-major
contents, concatenated, are exactly the part's real elements. A 2-D split part is at most three boxes: the tail
of one row, whole rows, the head of another; a tile is one box. Everything that moves a rank's part in or out
goes through these boxes:

    boxes = part_boxes(tile)                       # [Box(offsets, shape), ...] in dense coordinates
    part = read_part(tile, lambda b: sl[b.slices()])   # this rank's parameter data, read box by box
    part = part_of_dense(tile, dense)              # the same from a dense tensor held here
    place_part(tile, part, out)                    # and back: the part's elements into a dense tensor

``read`` may be anything that returns a box of the dense tensor (a safetensors ``get_slice``, a saved tile, a
dense tensor): reading exactly the boxes reads exactly the part's bytes, nothing of another rank's part.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from ..spec import TileSpec


@dataclass(frozen=True)
class Box:
    """The rectangle ``dense[offsets : offsets + shape]`` of a dense tensor (0-d: the whole scalar)."""

    offsets: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def slices(self, origin: Optional[Sequence[int]] = None) -> tuple[slice, ...]:
        """Index of the box in the dense tensor, or in a region of it that starts at ``origin``."""
        origin = origin or (0,) * len(self.offsets)
        return tuple(slice(o - g, o - g + s) for o, g, s in zip(self.offsets, origin, self.shape))


def tile_of(param: torch.Tensor) -> Optional[TileSpec]:
    """The TileSpec a parallel layer set on ``param`` (``param.axgrid_tile``); None for a dense tensor."""
    return getattr(param, "axgrid_tile", None)


def tile_box(tile: TileSpec) -> Box:
    """The whole tile as a box."""
    return Box(tuple(tile.offsets), tuple(tile.tile_shape))


def flat_boxes(box: Box, start: int, stop: int) -> list[Box]:
    """The elements ``[start, stop)`` of ``box`` flattened row-major, as boxes in row-major order."""
    if stop <= start:
        return []
    if not box.shape:
        return [box]
    if len(box.shape) == 1:
        return [Box((box.offsets[0] + start,), (stop - start,))]
    row = math.prod(box.shape[1:])
    first, last = start // row, stop // row            # rows [first, last) may be whole
    inner = Box(box.offsets[1:], box.shape[1:])

    def in_row(r: int, lo: int, hi: int) -> list[Box]:
        return [Box((box.offsets[0] + r, *b.offsets), (1, *b.shape)) for b in flat_boxes(inner, lo, hi)]

    if first == last:                                  # inside one row
        return in_row(first, start - first * row, stop - first * row)
    out: list[Box] = []
    if start % row:
        out += in_row(first, start % row, row)
        first += 1
    if last > first:
        out.append(Box((box.offsets[0] + first, *box.offsets[1:]), (last - first, *box.shape[1:])))
    if stop % row:
        out += in_row(last, 0, stop % row)
    return out


def part_boxes(tile: TileSpec) -> list[Box]:
    """The boxes of the dense tensor holding this rank's part, in the part's element order (empty for a part
    that is only padding)."""
    start, stop = tile.part_range()
    return flat_boxes(tile_box(tile), start, stop) if tile.split_dim else [tile_box(tile)]


def part_shape(tile: TileSpec) -> tuple[int, ...]:
    """The shape of this rank's parameter: ``[part_numel]`` when split, else ``tile_shape``."""
    return (tile.part_numel,) if tile.split_dim else tuple(tile.tile_shape)


def overlap(a: Box, b: Box) -> Optional[Box]:
    """The intersection of two boxes, or None when empty (0-d boxes always intersect)."""
    lo = [max(x, y) for x, y in zip(a.offsets, b.offsets)]
    hi = [min(x + sx, y + sy) for x, sx, y, sy in zip(a.offsets, a.shape, b.offsets, b.shape)]
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return Box(tuple(lo), tuple(h - l for l, h in zip(lo, hi)))


def read_part(tile: TileSpec, read: Callable[[Box], torch.Tensor], dtype: Optional[torch.dtype] = None,
              device: Optional[torch.device | str] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """This rank's parameter data (:func:`part_shape`; padding zero) from ``read(box) -> [box.shape]``, called
    once per box of :func:`part_boxes` (so only the part's own elements are read). ``out``: a tensor of
    :func:`part_shape` to fill (e.g. the parameter itself: no second copy); else a new one of ``dtype`` on
    ``device`` (default: those of the first box read; float32 on the CPU when there is none)."""
    if out is not None and tuple(out.shape) != part_shape(tile):
        raise ValueError(f"out has shape {tuple(out.shape)}, this rank's part is {part_shape(tile)}")
    pos = 0
    flat = None if out is None else out.view(-1)
    for b in part_boxes(tile):
        got = read(b)
        if tuple(got.shape) != b.shape:
            raise ValueError(f"read returned shape {tuple(got.shape)} for the box {b}; expected {b.shape}")
        if flat is None:
            out = torch.empty(part_shape(tile), dtype=dtype or got.dtype, device=device or got.device)
            flat = out.view(-1)
        flat[pos: pos + b.numel].view(b.shape).copy_(got)      # one strided copy, no flattened temporary
        pos += b.numel
    if out is None:
        return torch.zeros(part_shape(tile), dtype=dtype or torch.float32, device=device)
    flat[pos:].zero_()                                    # the padding of a split part
    return out


def part_of_dense(tile: TileSpec, dense: torch.Tensor) -> torch.Tensor:
    """This rank's part (a new tensor) of ``dense``, which has the tile's dense shape."""
    if tuple(dense.shape) != tuple(tile.dense_shape):
        raise ValueError(f"dense tensor has shape {tuple(dense.shape)}, the tile's dense shape is "
                         f"{tuple(tile.dense_shape)}")
    d = dense.detach()
    return read_part(tile, lambda b: d[b.slices()], dtype=d.dtype, device=d.device)


def place_part(tile: TileSpec, part: torch.Tensor, out: torch.Tensor,
               origin: Optional[Sequence[int]] = None) -> int:
    """Write this rank's ``part`` (:func:`part_shape`) into ``out``: the dense tensor, or its region starting at
    ``origin`` (boxes outside the region are skipped). Returns the elements written."""
    origin = tuple(origin or (0,) * len(tile.dense_shape))
    region = Box(origin, tuple(out.shape))
    flat = part.detach().reshape(-1)
    pos = written = 0
    for b in part_boxes(tile):
        ov = overlap(b, region)
        if ov is not None:
            src = flat[pos: pos + b.numel].view(b.shape)
            out[ov.slices(origin)] = src[ov.slices(b.offsets)]
            written += ov.numel
        pos += b.numel
    return written
