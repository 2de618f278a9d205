"""Which part of a dense tensor a rank holds: the one place that knows it (pure arithmetic, no torch).

A :class:`TileSpec` says a rank's parameter is the tile ``dense[offsets : offsets + tile_shape]`` of a dense tensor
or, split over z, the elements ``[start, stop)`` of that tile flattened row-major (zero-padded to ``part_numel``);
``piece`` narrows it to a flat range of that part (what a d-rank's sharded optimizer keeps of it, ``zero`` >= 1).
:func:`part_boxes` turns that into a list of :class:`Box` -- rectangles of the dense tensor whose row-major contents,
concatenated, are exactly the part's real elements. A 2-D split part is at most three boxes: the tail of one row,
whole rows, the head of another; a tile is one box. Everything that moves a rank's part in or out (the loader, the
checkpoint's reshard, ``load_state_dict``, the export; :mod:`axgrid.io.part_copy` does the copying) goes through
these boxes:

    boxes = part_boxes(tile)                       # [Box(offsets, shape), ...] in dense coordinates

The split rule (one definition for the runtime's weight shards, checkpoints and perfmodel's volumes): a flat
buffer of ``numel`` elements is zero-padded to ``parts · ceil(numel/parts)`` and cut into ``parts`` equal parts;
part ``i`` holds elements ``[i·part, min((i+1)·part, numel))`` of the buffer, the rest of it is padding.

Fused tensors (Phi-3's ``qkv_proj [(H + 2·H_kv)·d, h]``, ``gate_up_proj [2f, h]``) keep their rows in another
order than the grid needs: a y-rank must hold its own heads' q, k and v rows, which are three separate bands of
the file's tensor. A ``row_map`` says so: the tile is cut from the *layout* tensor whose rows are the bands
``dense[a : a + n]`` of the ``row_map``, in order (a permutation of the dense rows, :func:`segment_row_map`).
:func:`part_boxes` still returns boxes of the dense tensor, in the part's element order (a box that crosses a band
is cut at it), so every reader and writer above handles a fused tensor with no code of its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

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
    ``piece = (lo, hi)``: only the elements ``[lo, hi)`` of that part (its flat form, padding included): the share
    of a parameter one d-rank's sharded optimizer state holds (:mod:`axgrid.spec.buckets`).
    """

    dense_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    tile_shape: tuple[int, ...]
    split_dim: Optional[str] = None
    split_size: int = 1
    split_index: int = 0
    #: ``((first dense row, rows), ...)``: the rows (dim 0) of the layout tensor that ``offsets``/``tile_shape``
    #: refer to, as consecutive bands of the dense tensor (empty: the dense tensor's own order)
    row_map: tuple[tuple[int, int], ...] = ()
    piece: Optional[tuple[int, int]] = None

    @property
    def tile_numel(self) -> int:
        n = 1
        for s in self.tile_shape:
            n *= s
        return n

    @property
    def flat(self) -> bool:
        """This rank's data is 1-D (split, or a piece): ``[part_numel]``."""
        return bool(self.split_dim) or self.piece is not None

    def part_range(self) -> tuple[int, int]:
        """``[start, stop)`` of the flattened tile held by this rank's part (the whole tile when not split), or by
        its piece."""
        if not self.split_dim:
            start, stop = 0, self.tile_numel
        else:
            _, start, stop = split_part(self.tile_numel, self.split_size, self.split_index)
        if self.piece is None:
            return start, stop
        lo = min(start + self.piece[0], stop)
        return lo, max(lo, min(start + self.piece[1], stop))

    @property
    def part_numel(self) -> int:
        """Elements of this rank's data (the piece; else the padded part when split, else the whole tile)."""
        if self.piece is not None:
            return self.piece[1] - self.piece[0]
        return split_part(self.tile_numel, self.split_size, 0)[0] if self.split_dim else self.tile_numel

    def part_of(self, tile: "torch.Tensor") -> "torch.Tensor":
        """This rank's parameter data ``[part_numel]`` (or ``tile_shape`` unsplit) cut from the whole ``tile``."""
        if tuple(tile.shape) != tuple(self.tile_shape):
            raise ValueError(f"tile has shape {tuple(tile.shape)}, expected {self.tile_shape}")
        if not self.flat:
            return tile.clone()
        flat = tile.reshape(-1)
        out = flat.new_zeros(self.part_numel)
        start, stop = self.part_range()
        out[: stop - start] = flat[start:stop]
        return out

    def slices(self) -> tuple[slice, ...]:
        """Where the tile sits in the dense tensor (a tile of a row-mapped tensor is no one rectangle: use
        :func:`part_boxes`)."""
        if self.row_map:
            raise ValueError("a tile with a row_map is several bands of the dense tensor, not one slice: use "
                             "part_boxes(tile) (or axgrid.io.part_copy.part_of_dense)")
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.tile_shape))


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
    boxes = flat_boxes(tile_box(tile), start, stop) if tile.flat else [tile_box(tile)]
    if not tile.row_map:
        return boxes
    return [b for box in boxes for b in map_rows(box, tile.row_map)]


def map_rows(box: Box, row_map: Sequence[tuple[int, int]]) -> list[Box]:
    """``box`` of the layout tensor (rows in ``row_map``'s order) as boxes of the dense tensor, in the box's
    row-major element order: cut where a band ends."""
    out: list[Box] = []
    layout_row = 0
    lo, hi = box.offsets[0], box.offsets[0] + box.shape[0]
    for first, rows in row_map:
        a, b = max(lo, layout_row), min(hi, layout_row + rows)
        if a < b:
            out.append(Box((first + a - layout_row, *box.offsets[1:]), (b - a, *box.shape[1:])))
        layout_row += rows
    return out


def segment_row_map(segments: Sequence[int], parts: int) -> tuple[tuple[int, int], ...]:
    """The row map of a fused tensor whose rows are ``segments`` (e.g. ``(H·d, H_kv·d, H_kv·d)``), each split into
    ``parts`` equal shares, so that part ``j``'s rows of the layout tensor, ``[j·n/parts, (j+1)·n/parts)``, are
    share ``j`` of every segment in turn: ``((seg0 + j·s0/parts, s0/parts), (seg1 + j·s1/parts, s1/parts), ...)``
    for ``j = 0 .. parts-1``. Empty (no map) for one segment or one part."""
    if any(s % parts for s in segments):
        raise ValueError(f"segments {tuple(segments)} do not each divide into {parts} parts")
    if len(segments) <= 1 or parts == 1:
        return ()
    starts = [sum(segments[:i]) for i in range(len(segments))]
    return tuple((a + j * (s // parts), s // parts) for j in range(parts) for a, s in zip(starts, segments))


def row_segments(tile: TileSpec, r0: int, r1: int) -> list[tuple[int, Box]]:
    """``(position, box)`` for each piece of this rank's part that lies in the dense rows ``[r0, r1)``, in the
    part's element order: ``box`` (dense coordinates) holds the part's elements ``[position, position +
    box.numel)`` (positions count from the part's first real element). A piece is contiguous in the part because
    every box of :func:`part_boxes` is row-major over whole rows of itself."""
    out: list[tuple[int, Box]] = []
    pos = 0
    for box in part_boxes(tile):
        if not box.shape:                               # a 0-d tensor: one piece, whatever the rows
            out.append((pos, box))
            pos += box.numel
            continue
        a, b = max(r0, box.offsets[0]), min(r1, box.offsets[0] + box.shape[0])
        if a < b:
            row = box.numel // box.shape[0]
            out.append((pos + (a - box.offsets[0]) * row, Box((a, *box.offsets[1:]), (b - a, *box.shape[1:]))))
        pos += box.numel
    return out


def part_shape(tile: TileSpec) -> tuple[int, ...]:
    """The shape of this rank's data: ``[part_numel]`` when split or a piece, else ``tile_shape``."""
    return (tile.part_numel,) if tile.flat else tuple(tile.tile_shape)


def overlap(a: Box, b: Box) -> Optional[Box]:
    """The intersection of two boxes, or None when empty (0-d boxes always intersect)."""
    lo = [max(x, y) for x, y in zip(a.offsets, b.offsets)]
    hi = [min(x + sx, y + sy) for x, sx, y, sy in zip(a.offsets, a.shape, b.offsets, b.shape)]
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return Box(tuple(lo), tuple(h - l for l, h in zip(lo, hi)))
