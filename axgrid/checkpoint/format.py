"""On-disk format constants, the error and result types and small shared helpers (a rank's tensors as parts of
dense tensors, and the agreement, are :mod:`axgrid.io`'s)."""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch


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
    bytes_read: int = 0          # tensor bytes this rank read from the files (its own parts, in the saved dtype)
    saved_zero: int = 0          # the saving run's RuntimeConfig.zero (its optimizer state sharded over d: 1, 2)


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


def _grid_str(grid) -> str:
    return "serial" if grid is None else str(grid.shape)


def _rank_world(grid) -> tuple[int, int]:
    return (0, 1) if grid is None else (grid.rank, grid.world_size)
