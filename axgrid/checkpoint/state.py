"""What a checkpoint holds per rank: model and optimizer entries, and the RNG state."""
from __future__ import annotations

import random
import sys
from typing import Any, Mapping, Optional

import torch
from torch import nn

from ..device import cuda as device_cuda
from ..io import TensorPart, model_parts, replicated_letters, tile_of
from ..spec import TileSpec
from .format import CheckpointError, _json_safe

def _model_entries(model: nn.Module) -> list[TensorPart]:
    """The model's entries; of a model with LoRA adapters (``axgrid.lora``) only its trained parameters -- the
    frozen base comes from its pretrained files, as with PEFT."""
    try:
        parts = model_parts(model)
    except TypeError as e:
        raise CheckpointError(str(e)) from None
    if getattr(model, "axgrid_lora", None) is not None:
        trained = {"model/" + n for n, p in model.named_parameters() if p.requires_grad}
        parts = [e for e in parts if e.name in trained]
    return parts


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


#: (model parameter, the tensor the optimizer keys its state by, that tensor's TileSpec, its replicated letters)
Slot = tuple[nn.Parameter, torch.Tensor, Optional[TileSpec], str]


def optimizer_slots(opt: torch.optim.Optimizer) -> tuple[str, list[list[Slot]]]:
    """The optimizer's class name as a checkpoint records it, and per parameter group its :data:`Slot` s: a plain
    optimizer keys its state by the parameters themselves; a sharded one (``axgrid.ShardedOptimizer``, zero >= 1)
    by this d-rank's pieces of them, each with the piece's tile (so its state is saved as boxes of the dense
    tensors and loads onto any Gd or zero mode)."""
    if hasattr(opt, "checkpoint_slots"):
        return opt.checkpoint_class, opt.checkpoint_slots()
    return type(opt).__name__, [[(p, p, tile_of(p), replicated_letters(p)) for p in g["params"]]
                                for g in opt.param_groups]


def _optim_entries(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[list[TensorPart], dict[str, Any]]:
    """Entries for the optimizer's tensor state and a JSON description (class, groups, non-tensor values)."""
    names = _param_names(model)
    groups, values, keys = [], {}, {}
    entries: list[TensorPart] = []
    cls, slots = optimizer_slots(opt)
    for gi, (g, row) in enumerate(zip(opt.param_groups, slots)):
        pnames = []
        for p, _, _, _ in row:
            if id(p) not in names:
                raise CheckpointError(f"optimizer parameter group {gi} holds a tensor of shape {tuple(p.shape)} "
                                      f"that is not a parameter of the model; checkpoints name optimizer state by "
                                      f"model parameter names, so build the optimizer from model.parameters()")
            pnames.append(names[id(p)])
        groups.append({"params": pnames, **{k: _json_safe(v) for k, v in g.items() if k != "params"}})
        for (p, q, tile, rep), pname in zip(row, pnames):
            st = opt.state.get(q, {})
            for key in sorted(st):
                v = st[key]
                if not torch.is_tensor(v):
                    values.setdefault(pname, {})[key] = _json_safe(v)
                    continue
                name = f"optim/{pname}/{key}"
                if tuple(v.shape) == tuple(q.shape) and key != "step":
                    entries.append(TensorPart(name, v.detach(), tile, rep, "optim"))
                elif v.numel() == 1:
                    entries.append(TensorPart(name, v.detach(), None, "xyzd", "optim-scalar"))
                else:
                    raise CheckpointError(f"optimizer state {key!r} of parameter {pname!r} has shape "
                                          f"{tuple(v.shape)}, neither the parameter's shape {tuple(q.shape)} nor a "
                                          f"scalar: this checkpoint format cannot place it on another grid")
                keys.setdefault(pname, []).append(key)
    desc = {"class": cls, "param_groups": groups, "values": values, "state_keys": keys}
    return entries, desc


def _check_entry(e: TensorPart, grid) -> None:
    """This rank's data agrees with its TileSpec and the grid."""
    if e.tile is None:
        return
    t = e.tile
    if t.flat:
        want: tuple[int, ...] = (t.part_numel,)
        if t.split_dim and grid is not None and grid.size(t.split_dim) != t.split_size:
            raise CheckpointError(f"{e.name}: its TileSpec splits over {t.split_dim} in {t.split_size} parts but "
                                  f"the grid has G{t.split_dim}={grid.size(t.split_dim)}")
    else:
        want = tuple(t.tile_shape)
    if tuple(e.tensor.shape) != want:
        raise CheckpointError(f"{e.name}: this rank holds shape {tuple(e.tensor.shape)} but its TileSpec says "
                              f"{want}; the parameter and its axgrid_tile disagree")
    if grid is None and (t.split_size > 1 or tuple(t.tile_shape) != tuple(t.dense_shape)):
        raise CheckpointError(f"{e.name} is a tile of a larger tensor, but no grid was given: pass grid=...")


def _rng_state(generators: Optional[Mapping[str, torch.Generator]]) -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    st: dict[str, Any] = {"torch": torch.get_rng_state(),
                          "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64),
                                     "gauss": gauss},
                          "generators": {k: g.get_state() for k, g in (generators or {}).items()}}
    gpu = device_cuda.rng_state()
    if gpu is not None:
        st["cuda"] = gpu
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        st["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached": float(cached)}
    return st


def _restore_rng(st: Mapping[str, Any], generators: Optional[Mapping[str, torch.Generator]], where: str) -> None:
    torch.set_rng_state(st["torch"])
    py = st["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    if "cuda" in st:
        device_cuda.set_rng_state(st["cuda"])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in st:
        n = st["numpy"]
        np.random.set_state((n["kind"], n["keys"].numpy().astype("uint32"), n["pos"], n["has_gauss"], n["cached"]))
    saved = st.get("generators", {})
    for k, g in (generators or {}).items():
        if k not in saved:
            raise CheckpointError(f"generator {k!r} is not in the checkpoint ({where}); it holds "
                                  f"{sorted(saved) or 'none'}: pass the same generators= to save and load")
        g.set_state(saved[k])
