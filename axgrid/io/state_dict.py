"""How a rank's parameter relates to the dense tensor it is a piece of: the contract between parallel layers,
checkpoints (which reshard through it) and anything else that must see the dense model.

Every parameter of a parallel layer carries ``param.axgrid_tile``, a :class:`~axgrid.spec.TileSpec` (the
geometry, torch-free). A parameter without one is dense and replicated on every rank. ``param.axgrid_replicated`` names the grid letters the parameter is
replicated over (used to count each element once in norms and to pick one writer per tile).
"""
from __future__ import annotations

import copy
from functools import partial
from typing import Optional

import torch
from torch import nn

from .part_copy import part_of_dense, tile_of
from ..spec import TileSpec


# -- a module's tiled parameters in state dicts and copies ------------------------------------------------------
# ``module.state_dict()`` holds each rank's part under the dense names. These hooks keep that from going wrong
# silently: the metadata records which tile each part is, a dense tensor loads as this rank's slice, another
# rank's part is refused, and torch.distributed.checkpoint (which would keep one rank's part per name) refuses.

def _tile_record(tile: TileSpec) -> list:
    """The tile as plain lists (kept in the state dict's metadata; survives ``torch.load(weights_only=True)``)."""
    return [list(tile.dense_shape), list(tile.offsets), list(tile.tile_shape), tile.split_dim, tile.split_size,
            tile.split_index] + ([[list(band) for band in tile.row_map]] if tile.row_map else [])


def _refuse_dcp(key: str, tile: TileSpec, *args) -> None:
    raise RuntimeError(f"{key} is this rank's part of a tensor of dense shape {tuple(tile.dense_shape)}: "
                       f"torch.distributed.checkpoint would save one rank's part under that name and restore it on "
                       f"every rank. Save with axgrid.checkpoint (save_checkpoint / CheckpointManager, loads on any "
                       f"grid), or get dense tensors with axgrid.dense_state_dict(model, grid)")


def _state_dict_post_hook(module, state_dict, prefix: str, local_metadata: dict) -> None:
    records = {}
    for name, p in module._parameters.items():
        tile = tile_of(p) if p is not None else None
        key = prefix + name
        if tile is None or key not in state_dict:
            continue
        records[name] = _tile_record(tile)
        v = state_dict[key]
        if v is not p and torch.is_tensor(v):     # a detached part (keep_vars=False): DCP must not take it
            v.__create_write_items__ = partial(_refuse_dcp, key, tile)
            v.__create_chunk_list__ = partial(_refuse_dcp, key, tile)
            v.__getstate__ = dict                 # pickled (torch.save) as a plain tensor, without the above
    if records:
        local_metadata["axgrid_tiles"] = records


def _load_pre_hook(module, state_dict, prefix: str, local_metadata: dict, strict: bool, missing_keys: list,
                   unexpected_keys: list, error_msgs: list) -> None:
    saved = local_metadata.get("axgrid_tiles", {})
    for name, p in module._parameters.items():
        tile = tile_of(p) if p is not None else None
        key = prefix + name
        if tile is None or not torch.is_tensor(state_dict.get(key)):
            continue
        v = state_dict[key]
        if tuple(v.shape) == tuple(p.shape) and (name not in saved or saved[name] == _tile_record(tile)):
            continue                                          # this rank's own part (or the dense tensor)
        if tuple(v.shape) == tuple(tile.dense_shape):
            state_dict[key] = part_of_dense(tile, v)   # a dense tensor: take our slice
        elif name in saved:
            error_msgs.append(f"{key}: the state dict holds the part of another rank or grid (tile "
                              f"{saved[name]}), this rank needs {_tile_record(tile)}; load a dense state dict "
                              f"(axgrid.dense_state_dict) or use axgrid.checkpoint, which reshards")
        else:
            error_msgs.append(f"{key}: shape {tuple(v.shape)} is neither this rank's part {tuple(p.shape)} nor "
                              f"the dense shape {tuple(tile.dense_shape)}; load a dense state dict or use "
                              f"axgrid.checkpoint")


def add_state_hooks(module: nn.Module) -> None:
    """Install the state-dict hooks above on a module whose own parameters carry TileSpecs."""
    module.register_state_dict_post_hook(_state_dict_post_hook)
    module.register_load_state_dict_pre_hook(_load_pre_hook)


def deepcopy_keeping_marks(module: nn.Module, memo: dict) -> nn.Module:
    """``copy.deepcopy`` for modules with tiled parameters: the copy's parameters keep ``axgrid_tile``,
    ``axgrid_replicated`` and ``axgrid_shared`` (``Parameter.__deepcopy__`` drops Python attributes) and the grid
    is shared, not copied (it holds process groups). Use as ``__deepcopy__ = deepcopy_keeping_marks``."""
    cls = type(module)
    new = cls.__new__(cls)
    memo[id(module)] = new
    new.__setstate__(copy.deepcopy(module.__dict__, memo))
    for name, p in module._parameters.items():
        q = new._parameters.get(name)
        if p is None or q is None:
            continue
        for attr in ("axgrid_tile", "axgrid_replicated", "axgrid_shared"):
            if hasattr(p, attr):
                setattr(q, attr, getattr(p, attr))
    return new
