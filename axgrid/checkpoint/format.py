"""On-disk format constants, the error and result types, the tensor entry and small shared helpers."""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from ..spec import TileSpec

FORMAT = "axgrid-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_HASH_CHUNK = 16 * 2**20


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read: the message names the file and what to do."""


class CheckpointWarning(UserWarning):
    """A checkpoint loads, but something could not be checked (e.g. it records no run config)."""


@dataclass
class LoadInfo:
    """What :func:`load_checkpoint` restored."""

    path: str                    # the checkpoint directory that was read
    step: int
    extra: dict[str, Any]        # the ``extra`` given to save (data-loader position, scheduler, ...)
    saved_grid: str              # e.g. "2x2x2x1" ("serial" for a checkpoint written without a grid)
    saved_world_size: int
    resharded: bool              # grid, order or world size differ from the saving run
    rng: str                     # "per-rank", "from rank 0" (resharded) or "not restored"
    optimizer: bool              # optimizer state was restored
    config: dict[str, Any] = field(default_factory=dict)   # the run config it was saved with (flat, dotted names)


@dataclass
class _Entry:
    """One tensor to save or load: this rank's data and where it sits in the dense tensor."""

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

def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _dtype_of(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in the manifest")
    return dt


def _json_safe(v: Any) -> Any:
    """A JSON-representable copy of an optimizer hyper-parameter (tensors -> numbers, tuples -> lists)."""
    if torch.is_tensor(v):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def _like(saved: Any, current: Any) -> Any:
    """``saved`` (from JSON) in the type of the ``current`` hyper-parameter value."""
    if torch.is_tensor(current):
        return torch.tensor(saved, dtype=current.dtype, device=current.device)
    if isinstance(current, tuple) and isinstance(saved, list):
        return tuple(saved)
    return saved


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_HASH_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def _overlap(a_off: Sequence[int], a_shape: Sequence[int], b_off: Sequence[int],
             b_shape: Sequence[int]) -> Optional[tuple[list[int], list[int]]]:
    """The intersection ``[lo, hi)`` of two boxes, or None when empty (0-d boxes always intersect)."""
    lo = [max(a, b) for a, b in zip(a_off, b_off)]
    hi = [min(a + sa, b + sb) for a, sa, b, sb in zip(a_off, a_shape, b_off, b_shape)]
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return lo, hi


def _grid_str(grid) -> str:
    return "serial" if grid is None else str(grid.shape)


def _rank_world(grid) -> tuple[int, int]:
    return (0, 1) if grid is None else (grid.rank, grid.world_size)


def _agree(grid, values: Sequence[int]) -> list[int]:
    """Sum of ``values`` (int64) over every rank of the grid: an all-reduce over "xyz" then over "d" (the two
    groups together span the whole grid). Also a barrier. With no grid: the values themselves."""
    t = torch.tensor(list(values), dtype=torch.int64)
    if grid is not None:
        if grid.device.type != "cpu":
            t = t.to(grid.device)
        t = grid.comm.all_reduce(t, "xyz")
        t = grid.comm.all_reduce(t, "d")
    return [int(v) for v in t.cpu().tolist()]


def _fingerprint(entries: Sequence[_Entry]) -> int:
    """24 bits identifying the list of tensors (names, dense shapes, dtypes, split): equal on all ranks of a
    well-formed SPMD model."""
    h = hashlib.sha256()
    for e in entries:
        split = e.tile.split_dim if e.tile else None
        h.update(f"{e.name}|{e.dense_shape}|{_dtype_name(e.tensor.dtype)}|{split}|{e.kind};".encode())
    return int.from_bytes(h.digest()[:3], "little")
