"""A model's tensors as this rank's parts of dense tensors, and the agreement every collective reader and writer
posts first (checkpoints, export, loading).

    parts = model_parts(model)        # [TensorPart("model/<state_dict key>", tensor, tile, replicated, kind)]
    fp = fingerprint(parts)           # 24 bits: names, dense shapes, dtypes, splits (equal on SPMD ranks)
    failed, s = agree(grid, [int(err is not None), fp])   # sums over the whole grid (also a barrier)
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from ..spec import TileSpec
from .part_copy import tile_of


@dataclass
class TensorPart:
    """One tensor of this rank: its data and where it sits in the dense tensor."""

    name: str                         # "model/<state_dict key>" or "optim/<param name>/<state key>"
    tensor: torch.Tensor              # this rank's data: the part when split, else the whole tile
    tile: Optional[TileSpec]          # None: dense, replicated on every rank
    replicated: str                   # grid letters holding identical copies
    kind: str = "param"               # "param", "buffer", "optim" (parameter-shaped) or "optim-scalar"

    @property
    def dense_shape(self) -> tuple[int, ...]:
        return tuple(self.tile.dense_shape) if self.tile else tuple(self.tensor.shape)

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(self.tile.offsets) if self.tile else (0,) * self.tensor.dim()

    @property
    def tile_shape(self) -> tuple[int, ...]:
        return tuple(self.tile.tile_shape) if self.tile else tuple(self.tensor.shape)

    @property
    def spec(self) -> TileSpec:
        """The tile, or for a dense tensor the whole tensor as one tile."""
        shape = tuple(self.tensor.shape)
        return self.tile or TileSpec(shape, (0,) * len(shape), shape)


def replicated_letters(t: torch.Tensor) -> str:
    """The grid letters holding identical copies of ``t`` (``param.axgrid_replicated``; a tensor without a tile
    is replicated everywhere, a tile at least over d)."""
    rep = getattr(t, "axgrid_replicated", None)
    return rep if rep is not None else ("d" if tile_of(t) is not None else "xyzd")


def model_parts(model: nn.Module) -> list[TensorPart]:
    """Every entry of ``model.state_dict()`` as a :class:`TensorPart` named ``model/<key>``; a TypeError names
    an entry that is not a tensor."""
    out = []
    params = {id(p) for p in model.parameters()}
    for name, t in model.state_dict(keep_vars=True).items():
        if not torch.is_tensor(t):
            raise TypeError(f"model state {name!r} is a {type(t).__name__}, not a tensor; checkpoints hold "
                            f"tensors only (keep other state in extra=...)")
        out.append(TensorPart("model/" + name, t.detach(), tile_of(t), replicated_letters(t),
                              "param" if id(t) in params else "buffer"))
    return out


def dtype_name(dt: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dt).replace("torch.", "")


def fingerprint(parts: Sequence[TensorPart]) -> int:
    """24 bits identifying the list of tensors (names, dense shapes, dtypes, split): equal on all ranks of a
    well-formed SPMD model."""
    h = hashlib.sha256()
    for e in parts:
        split = e.tile.split_dim if e.tile else None
        rows = e.tile.row_map if e.tile else ()
        h.update(f"{e.name}|{e.dense_shape}|{dtype_name(e.tensor.dtype)}|{split}|{rows}|{e.kind};".encode())
    return int.from_bytes(h.digest()[:3], "little")


def agree(grid, values: Sequence[int]) -> list[int]:
    """Sum of ``values`` (int64) over every rank of the grid: an all-reduce over "xyz" then over "d" (the two
    groups together span the whole grid). Also a barrier. With no grid: the values themselves."""
    t = torch.tensor(list(values), dtype=torch.int64)
    if grid is not None:
        if grid.device.type != "cpu":
            t = t.to(grid.device)
        t = grid.comm.all_reduce(t, "xyz")
        t = grid.comm.all_reduce(t, "d")
    return [int(v) for v in t.cpu().tolist()]



def raise_on_any_rank(grid, err: Optional[BaseException], others: Callable[[int], BaseException], *,
                      cleanup: Optional[Callable[[], None]] = None) -> None:
    """Collective, called by every rank whether it failed or not: when any rank holds an error, every rank raises
    -- its own ``err``, or ``others(n)`` (``n``: how many ranks failed) where it has none -- after ``cleanup()``
    has run on every rank and a barrier (so no rank raises while another still cleans up). Returns when no rank
    failed. The one way an axgrid collective turns one rank's bad input or I/O error into an error on all."""
    (failed,) = agree(grid, [int(err is not None)])
    if not failed:
        return
    if cleanup is not None:
        try:
            cleanup()
        finally:
            agree(grid, [0])
    raise err if err is not None else others(failed)
