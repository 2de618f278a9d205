"""The initial weights of a Hugging Face causal LM pre-trained from its config: the same values on every grid and on
one process, each rank computing only its own parts (no communication, no dense copy).

    init_causal_lm_(model, seed=0)       # a model parallelized by its plan, or a plain transformers model

Values follow transformers' own initialisation of these families (``_init_weights``): every matrix and embedding
N(0, ``config.initializer_range``²), biases 0, norm weights 1 (0 where the norm scales by ``1 + w``, Gemma's). Each
element is a hash of ``(seed, parameter name, its index in the dense tensor)`` (:func:`axgrid.nn.init.normal_box`),
so ``init_causal_lm_`` on the dense model gives exactly the tensors whose parts the ranks of any grid hold: a
single-process reference starts from the same weights. An embedding's padding row is not zeroed. A mixture of
experts' experts are seeded per expert, by the names an expert's layers have on the grid
(``<block>.experts.<e>.gate_proj.weight``, ``up_proj``, ``down_proj``; :mod:`axgrid.plans.moe`), so transformers'
fused ``experts.gate_up_proj [E, 2f, h]`` and ``experts.down_proj [E, h, f]`` hold the same values as the grid's
experts on any expert-parallel size.
"""
from __future__ import annotations

import hashlib

import torch
from torch import nn

from ..io.part_copy import read_part, tile_of
from ..nn.init import normal_box
from ..spec.tiles import Box
from .hf import HF_FAMILIES, hf_plan


def weight_seed(seed: int, name: str) -> int:
    """The hash seed of the dense parameter ``name`` (its ``state_dict`` key) in a run of ``seed``."""
    h = hashlib.sha256(f"axgrid-hf:{seed}:{name}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def dense_name(model: nn.Module, p: nn.Parameter, names: list[str]) -> str:
    """The name whose hash seeds ``p``: the first of its names, or ``"tied-embeddings"`` for a head tied to the
    input embedding (the names of a tied tensor differ between a dense and a parallelized model)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if getattr(model.config, "tie_word_embeddings", False) and head is not None and p is head.weight:
        return "tied-embeddings"
    return min(names)


def init_causal_lm_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Fill every parameter of ``model`` (see the module docstring) in place; returns ``model``."""
    std = float(getattr(model.config, "initializer_range", 0.02))
    norm_value = 0.0 if type(model).__name__ in HF_FAMILIES and hf_plan(model).unit_offset_norms else 1.0
    names: dict[int, list[str]] = {}
    params: dict[int, nn.Parameter] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
        params[id(p)] = p
    with torch.no_grad():
        for key, p in params.items():
            name = dense_name(model, p, names[key])
            tile = tile_of(p)
            dense = tuple(tile.dense_shape) if tile is not None else tuple(p.shape)
            s = weight_seed(seed, name)

            def read(box: Box, name: str = name, dense: tuple[int, ...] = dense, s: int = s) -> torch.Tensor:
                if name.endswith("bias"):
                    return torch.zeros(box.shape, dtype=p.dtype, device=p.device)
                if len(dense) == 1 and "norm" in name:
                    return torch.full(box.shape, norm_value, dtype=p.dtype, device=p.device)
                return normal_box(s, dense, box.offsets, box.shape, std, p.dtype, p.device)
            if tile is None and fused_experts(name, p):
                fill_fused_experts_(p, name, seed, std)
            elif tile is None:
                p.copy_(read(Box((0,) * len(dense), dense)))
            else:
                read_part(tile, read, out=p.data)      # this rank's boxes only; a split part's padding zero
    return model


def fused_experts(name: str, p: torch.Tensor) -> bool:
    """Whether ``name`` is transformers' fused expert tensor of a mixture-of-experts block (``experts.gate_up_proj
    [E, 2f, h]`` or ``experts.down_proj [E, h, f]``)."""
    return p.dim() == 3 and (name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"))


def fill_fused_experts_(p: torch.Tensor, name: str, seed: int, std: float) -> None:
    """Fill the fused expert tensor ``p`` of the dense parameter ``name`` expert by expert, each expert's layer from
    the hash of its grid name (the values :func:`init_causal_lm_` gives the grid's expert layers)."""
    block = name.rsplit(".", 1)[0]                      # <block>.experts
    if name.endswith("down_proj"):
        layers = [("down_proj", slice(None))]
    else:
        f = p.shape[1] // 2
        layers = [("gate_proj", slice(0, f)), ("up_proj", slice(f, 2 * f))]
    for e in range(p.shape[0]):
        for layer, rows in layers:
            part = p[e][rows]
            dense = tuple(part.shape)
            s = weight_seed(seed, f"{block}.{e}.{layer}.weight")
            part.copy_(normal_box(s, dense, (0,) * len(dense), dense, std, p.dtype, p.device))
