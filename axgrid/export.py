"""Dense tensors, a dense model, or a Hugging Face export from a parallel model.

A parallel model's ``state_dict()`` holds each rank's part under the dense names (a Linear's weight is a 1-D
shard of its ``[n/Gy, k/Gx]`` block): loadable back on the same rank of the same grid, useless elsewhere. The
dense forms are gathered here through the parameters' :class:`~axgrid.spec.TileSpec` (the checkpoint
package's entries and z-gather), so anything a checkpoint can save can be exported:

    sd = axgrid.dense_state_dict(model, grid)          # {name: dense tensor} on every rank
    dense = axgrid.to_dense(model, grid)               # a dense copy: every axgrid.nn.Linear -> nn.Linear
    axgrid.export_pretrained(model, "out", grid)       # HF model: safetensors + config, written by rank 0

All three are collective: every rank of the grid calls them. Training state (optimizer, RNG, resharding on
another grid) belongs in :mod:`axgrid.checkpoint`.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from .grid import Grid
from .io import agree, fingerprint, model_parts, whole_tile
from .nn.linear import Linear


def dense_state_dict(model: nn.Module, grid: Grid) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.state_dict()`` in its dense shape, on every rank (collective over the grid).

    Parameters with a TileSpec are all-gathered over z (their whole tile) then over the tensor-parallel block
    (every rank's tile, placed at its offsets); the others are copied. Tensors stay on their device.
    """
    entries = model_parts(model)
    fp = fingerprint(entries)
    s1, s2 = agree(grid, [fp, fp * fp])
    if s1 != grid.world_size * fp or s2 != grid.world_size * fp * fp:
        raise ValueError("dense_state_dict: ranks hold different tensors (names, shapes or dtypes): every rank "
                         "must build and parallelise the same model")
    tiled = [e for e in entries if e.tile is not None]
    ndim = max((len(e.dense_shape) for e in tiled), default=1)
    meta = torch.zeros(max(len(tiled), 1), 2 * ndim, dtype=torch.int64)
    for i, e in enumerate(tiled):
        meta[i, : len(e.offsets)] = torch.tensor(e.offsets)
        meta[i, ndim: ndim + len(e.tile_shape)] = torch.tensor(e.tile_shape)
    every = grid.comm.all_gather(meta.to(grid.device), "xyz").cpu()        # [Gxyz, tensors, 2*ndim]
    out: dict[str, torch.Tensor] = {}
    i = 0
    for e in entries:
        key = e.name[len("model/"):]
        if e.tile is None:
            out[key] = e.tensor.detach().clone()
            continue
        whole = whole_tile(grid, e).reshape(-1)                              # this rank's tile, flattened
        nd = len(e.dense_shape)
        shapes = [tuple(int(s) for s in every[r, i, ndim: ndim + nd]) for r in range(every.shape[0])]
        big = max(_numel(s) for s in shapes)
        flat = torch.cat([whole, whole.new_zeros(big - whole.numel())])
        tiles = grid.comm.all_gather(flat, "xyz")                             # [Gxyz, big]
        dense = torch.empty(e.dense_shape, dtype=e.tensor.dtype, device=e.tensor.device)
        seen = torch.zeros(e.dense_shape, dtype=torch.bool)
        for r, shape in enumerate(shapes):
            where = tuple(slice(int(o), int(o) + s) for o, s in zip(every[r, i, :nd], shape))
            dense[where] = tiles[r, : _numel(shape)].view(shape)
            seen[where] = True
        if not bool(seen.all()):
            raise ValueError(f"dense_state_dict: the tiles of {key} cover {int(seen.sum())} of {seen.numel()} "
                             f"elements; its parameters' axgrid_tile marks are wrong")
        out[key] = dense
        i += 1
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _is_hf(model: nn.Module) -> bool:
    return callable(getattr(type(model), "save_pretrained", None)) and hasattr(model, "config")


def to_dense(model: nn.Module, grid: Grid) -> nn.Module:
    """A dense copy of a parallel model (collective; every rank gets one). The original is untouched.

    A Hugging Face model is rebuilt from its config (``type(model)(model.config)``, tying what the config ties)
    and loaded with the dense tensors, whatever plan parallelised it. Any other model is deep-copied with each
    ``axgrid.nn.Linear`` turned back into the ``nn.Linear`` it stands for (tied weights stay tied: they were
    never parallelised); if it holds other parallel modules (axgrid's Embedding/LayerNorm/RMSNorm) this raises
    before any collective: use :func:`dense_state_dict` for those."""
    if _is_hf(model):
        state = dense_state_dict(model, grid)
        fresh = type(model)(model.config)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        fresh.to(device=grid.device, dtype=dtype)
        fresh.load_state_dict(state)
        return fresh.train(model.training)
    for name, mod in model.named_modules():
        if not isinstance(mod, Linear) and any(getattr(p, "axgrid_tile", None) is not None
                                               for p in mod._parameters.values() if p is not None):
            raise TypeError(f"to_dense: {name or 'the model'} ({type(mod).__name__}) holds parallel parameters but "
                            f"has no dense nn.Module counterpart; use axgrid.dense_state_dict(model, grid), or "
                            f"load an axgrid.checkpoint into a serial model (grid=None)")
    state = dense_state_dict(model, grid)
    dense = copy.deepcopy(model)
    for attr in ("save_pretrained", "axgrid_summary"):          # set on the instance by parallelize
        dense.__dict__.pop(attr, None)
    made: dict[int, nn.Linear] = {}
    for path, mod in list(dense.named_modules(remove_duplicate=False)):
        if not isinstance(mod, Linear):
            continue
        if id(mod) not in made:
            made[id(mod)] = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None,
                                      dtype=mod.weight.dtype, device=mod.weight.device)
            for p, q in ((made[id(mod)].weight, mod.weight), (made[id(mod)].bias, mod.bias)):
                if p is not None:
                    p.requires_grad_(q.requires_grad)
        if path:                                                     # (the root itself: below)
            parent = dense.get_submodule(path.rsplit(".", 1)[0]) if "." in path else dense
            setattr(parent, path.rsplit(".", 1)[-1], made[id(mod)])
    if isinstance(dense, Linear):
        dense = made[id(dense)]
    dense.load_state_dict(state)
    return dense


def export_pretrained(model: nn.Module, save_directory: str, grid: Grid, **save_kwargs: Any) -> nn.Module:
    """Write a parallelised Hugging Face model as a dense HF checkpoint (safetensors + config) that
    ``from_pretrained`` loads. Collective: every rank calls it; rank 0 writes. ``save_kwargs`` go to
    ``save_pretrained``. Returns the dense model (on every rank)."""
    if not _is_hf(model):
        raise TypeError(f"export_pretrained: {type(model).__name__} is not a Hugging Face model (no "
                        f"save_pretrained); use axgrid.to_dense(model, grid) or axgrid.dense_state_dict(model, grid)")
    dense = to_dense(model, grid)
    err = None
    if grid.rank == 0:
        try:
            dense.save_pretrained(save_directory, **save_kwargs)
        except Exception as ex:  # reported on every rank below
            err = ex
    (failed,) = agree(grid, [int(err is not None)])
    if err is not None:
        raise err
    if failed:
        raise RuntimeError(f"export_pretrained: rank 0 could not write {save_directory} (see its error)")
    return dense


def _refuse_save_pretrained(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("save_pretrained on a model parallelised by axgrid would write each rank's 1-D shards "
                       "under the dense names (from_pretrained then fails): call "
                       "axgrid.export_pretrained(model, save_directory, grid) on every rank instead")


def guard_save_pretrained(model: nn.Module) -> None:
    """Make ``model.save_pretrained`` (and ``push_to_hub``, which calls it) refuse with the way out."""
    if callable(getattr(model, "save_pretrained", None)):
        model.__dict__["save_pretrained"] = _refuse_save_pretrained
