"""Copying a rank's part out of and into dense tensors, box by box (the boxes are :mod:`axgrid.spec.tiles`').

    part = read_part(tile, lambda b: sl[b.slices()])   # this rank's parameter data, read box by box
    part = part_of_dense(tile, dense)              # the same from a dense tensor held here
    copy_part_(tile, dense, param)                 # ... straight into a tensor of the part's shape (any device)
    place_part(tile, part, out)                    # and back: the part's elements into a dense tensor

``read`` may be anything that returns a box of the dense tensor (a safetensors ``get_slice``, a saved tile, a
dense tensor): reading exactly the boxes reads exactly the part's bytes, nothing of another rank's part.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from ..spec.tiles import Box, TileSpec, overlap, part_boxes, part_shape


def tile_of(param: torch.Tensor) -> Optional[TileSpec]:
    """The TileSpec a parallel layer set on ``param`` (``param.axgrid_tile``); None for a dense tensor."""
    return getattr(param, "axgrid_tile", None)


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


def copy_part_(tile: TileSpec, dense: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Fill ``out`` (:func:`part_shape`, e.g. a parameter on a GPU) with this rank's part of ``dense``, box by box:
    no copy of the part is made where ``dense`` lives (a model built on the CPU, parallelized onto GPUs)."""
    if tuple(dense.shape) != tuple(tile.dense_shape):
        raise ValueError(f"dense tensor has shape {tuple(dense.shape)}, the tile's dense shape is "
                         f"{tuple(tile.dense_shape)}")
    d = dense.detach()
    with torch.no_grad():
        return read_part(tile, lambda b: d[b.slices()], out=out)


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
