"""LoRA adapters in PEFT's format: ``adapter_model.safetensors`` + ``adapter_config.json``, both ways.

    axgrid.save_adapter(model, "out", grid)      # peft.PeftModel.from_pretrained(hf_model, "out") loads it
    axgrid.load_adapter(model, "peft_dir", grid) # an adapter PEFT trained, onto a parallelized model

PEFT's names: the Linear ``model.layers.0.self_attn.q_proj`` holds ``...q_proj.lora_A.weight`` ``[r, k]`` and
``...q_proj.lora_B.weight`` ``[n, r]`` under the prefix ``base_model.model.``; axgrid's adapter parameters are
``...q_proj.lora.A`` / ``.lora.B`` (this rank's tiles of the same dense tensors, :mod:`axgrid.adapters.layer`). A fused
layer's B is one ``[n, r]`` in the file's row order (the tile's row map places this rank's rows).

Saving gathers the dense adapters on rank 0 (:func:`axgrid.iter_dense_state_dict`, collective) and writes them
with ``safetensors``; the config is ``peft.LoraConfig``'s own ``save_pretrained`` (``peft`` is needed only to save).
Loading reads on every rank only its own part of each tensor (``safe_open`` slices); every check -- the file's
``r``/``lora_alpha`` against the model's adapters, a tensor without an adapter (another base model), a shape that
differs -- raises its one line on every rank alike, before anything changes or communicates.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import torch
from torch import nn

from ..core.grid import Grid
from ..io import raise_on_any_rank
from ..io.export import iter_dense_state_dict
from ..io.part_copy import read_part
from .lora import LoraConfig, adapters, lora

WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"
PREFIX = "base_model.model."


def peft_names(layer: str) -> tuple[str, str]:
    """PEFT's keys of the A and B of the adapter on Linear ``layer``."""
    return f"{PREFIX}{layer}.lora_A.weight", f"{PREFIX}{layer}.lora_B.weight"


def save_adapter(model: nn.Module, directory: str, grid: Grid, *, rank: int = 0,
                 base_model_name_or_path: Optional[str] = None) -> str:
    """Write the model's adapters in PEFT's format into ``directory`` (collective; global rank ``rank`` writes)."""
    import axgrid
    cfg: Optional[LoraConfig] = getattr(model, "axgrid_lora", None)
    if cfg is None:
        raise ValueError("save_adapter: the model has no LoRA adapters (axgrid.lora adds them)")
    axgrid.finish_gradients(grid)                 # zero >= 1 with ODP: the adapters' all-gathers over d land first
    names = {f"{layer}.lora.{ab}": key for layer in adapters(model)
             for ab, key in zip("AB", peft_names(layer))}
    tensors = {names[n]: t.detach().cpu().contiguous() for n, t in
               iter_dense_state_dict(model, grid, rank, names=list(names))}
    err: Optional[BaseException] = None
    if grid.rank == rank:
        try:
            from peft import LoraConfig as PeftLoraConfig
            from safetensors.torch import save_file
            os.makedirs(directory, exist_ok=True)
            name = base_model_name_or_path or getattr(getattr(model, "config", None), "_name_or_path", None)
            PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.targets),
                           bias="none", task_type="CAUSAL_LM", base_model_name_or_path=name or None,
                           inference_mode=True).save_pretrained(directory)
            save_file(tensors, os.path.join(directory, WEIGHTS), metadata={"format": "pt"})
        except Exception as ex:           # reported on every rank below
            err = ex
    raise_on_any_rank(grid, err, lambda n: RuntimeError(f"save_adapter: rank {rank} could not write {directory} "
                                                        f"(see its error)"))
    return directory


def read_config(directory: str) -> LoraConfig:
    """The :class:`LoraConfig` of a PEFT adapter directory (``adapter_config.json``; a LoRA one)."""
    path = os.path.join(directory, CONFIG)
    try:
        with open(path, encoding="utf-8") as f:
            raw: dict[str, Any] = json.load(f)
    except OSError as ex:
        raise ValueError(f"load_adapter: cannot read {path} ({ex.strerror}); pass a directory that "
                         f"PeftModel.save_pretrained or axgrid.save_adapter wrote") from None
    if raw.get("peft_type", "LORA") != "LORA" or raw.get("use_dora") or raw.get("use_rslora"):
        raise ValueError(f"load_adapter: {path} is peft_type={raw.get('peft_type')!r} use_dora={raw.get('use_dora')} "
                         f"use_rslora={raw.get('use_rslora')}; axgrid loads plain LoRA adapters")
    targets = raw.get("target_modules")
    if isinstance(targets, str) or not targets:
        raise ValueError(f"load_adapter: {path} has target_modules={targets!r}; axgrid needs a list of module names")
    return LoraConfig(r=int(raw["r"]), alpha=float(raw["lora_alpha"]), targets=tuple(sorted(targets)),
                      dropout=float(raw.get("lora_dropout", 0.0)))


def load_adapter(model: nn.Module, directory: str, grid: Grid) -> nn.Module:
    """Load a PEFT LoRA adapter onto a parallelized model: adds the adapters (:func:`axgrid.lora` with the file's
    config) when the model has none, then fills each rank's parts from ``adapter_model.safetensors``."""
    from safetensors import safe_open
    file_cfg = read_config(directory)
    have: Optional[LoraConfig] = getattr(model, "axgrid_lora", None)
    if have is not None and (have.r, float(have.alpha)) != (file_cfg.r, file_cfg.alpha):
        raise ValueError(f"load_adapter: {directory} has r={file_cfg.r}, lora_alpha={file_cfg.alpha}; the model's "
                         f"adapters have r={have.r}, alpha={have.alpha}")
    path = os.path.join(directory, WEIGHTS)
    if not os.path.exists(path):
        raise ValueError(f"load_adapter: {path} does not exist (axgrid reads the safetensors form)")
    with safe_open(path, framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        if have is None:
            _check_against_layers(model, shapes, directory, file_cfg)
            lora(model, grid, file_cfg)
        load_adapter_tensors(model, shapes, directory, lambda key, box: f.get_slice(key)[box.slices()])
    return model


def _check_against_layers(model: nn.Module, shapes: dict[str, tuple[int, ...]], directory: str,
                          cfg: LoraConfig) -> None:
    """Before adding adapters: every tensor of the file names a Linear of this model, in the shape its adapter
    will have (``[r, in]`` / ``[out, r]``)."""
    from ..tensor_parallel.linear import Linear
    modules = dict(model.named_modules())
    for k in sorted(shapes):
        layer, _, ab = k[len(PREFIX):].rpartition(".lora_") if k.startswith(PREFIX) else ("", "", "")
        m = modules.get(layer)
        if not isinstance(m, Linear) or ab not in ("A.weight", "B.weight"):
            raise ValueError(f"load_adapter: {directory} holds {k!r}, which names no parallel Linear of "
                             f"{type(model).__name__} (an adapter of another base model?)")
        dense = (cfg.r, m.in_features) if ab == "A.weight" else (m.out_features, cfg.r)
        if tuple(shapes[k]) != dense:
            raise ValueError(f"load_adapter: {k} in {directory} has shape {tuple(shapes[k])}, this model's "
                             f"{layer} needs {dense} (another base model, or another r)")


def load_adapter_tensors(model: nn.Module, shapes: dict[str, tuple[int, ...]], source: str, read) -> None:
    """Fill the model's adapters from dense tensors under PEFT's names: ``shapes`` gives each name's dense shape,
    ``read(name, box)`` a box of it. Checked (names and shapes, both ways) before any parameter changes."""
    ads = adapters(model)
    want: dict[str, tuple[torch.nn.Parameter, tuple[int, ...]]] = {}
    for layer, ad in ads.items():
        for key, p in zip(peft_names(layer), (ad.A, ad.B)):
            want[key] = (p, tuple(p.axgrid_tile.dense_shape))
    extra = sorted(set(shapes) - set(want))
    if extra:
        raise ValueError(f"load_adapter: {source} holds {extra[0]!r}, which names no adapter of this model "
                         f"(an adapter of another base model, or other targets?)")
    missing = sorted(set(want) - set(shapes))
    if missing:
        raise ValueError(f"load_adapter: {source} has no {missing[0]!r} (the model has an adapter there)")
    for key, (p, dense) in want.items():
        if tuple(shapes[key]) != dense:
            raise ValueError(f"load_adapter: {key} in {source} has shape {tuple(shapes[key])}, this model's adapter "
                             f"is {dense} (another base model, or another r)")
    with torch.no_grad():
        for key, (p, _) in want.items():
            read_part(p.axgrid_tile, lambda box, key=key: read(key, box), out=p.data)
