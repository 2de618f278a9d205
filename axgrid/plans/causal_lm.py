"""A causal language model on the grid, as the training drivers use it: loaded from a Hugging Face folder onto the
grid, and its loss over kept targets, for axgrid's GPT and Hugging Face models alike.

    model = load_causal_lm("path/to/hf_folder", grid, recompute=True)        # training mode, fp32
    model = causal_lm_from_config("path/to/config.json", grid, seed=0)      # pre-training: initial weights
    model = causal_lm_from_config("path/to/config.json", grid, init=False)  # no weights (a dry run)
    loss = causal_lm_loss(model, inputs, targets, mask, normalizer)          # inputs/targets/mask [b, S]
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Optional

import torch

from ..core.grid import Grid
from ..models.gpt import GPT


def load_causal_lm(path: str, grid: Grid, recompute: bool = False) -> torch.nn.Module:
    """The Hugging Face causal LM at ``path`` in fp32 on ``grid`` (``axgrid.from_pretrained``: each rank reads its
    own parts), in training mode; ``recompute``: activation checkpointing of the decoder layers (non-reentrant)."""
    from ..io.pretrained import from_pretrained
    model = from_pretrained(path, grid, torch_dtype=torch.float32)
    model.config.use_cache = False
    if recompute:
        enable_recompute(model)
    return model.train()


def enable_recompute(model: torch.nn.Module) -> None:
    """Activation checkpointing of a Hugging Face model's decoder layers (non-reentrant): each layer keeps its input
    and runs its forward again in the backward."""
    kw = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):          # transformers >= 5.x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def read_hf_config(path: "str | Mapping[str, Any]"):
    """The transformers config of ``path``: a config.json, or a Hugging Face folder holding one (its weights are
    not read), or a config.json's fields (``TransformerShape.hf_config`` of a named public model). A Gemma 3
    multimodal config (``"gemma3"``) gives its text decoder's (``text_config``: ``Gemma3ForCausalLM``), as
    ``axgrid.spec.TransformerShape`` reads it. A ValueError names the path and what is wrong."""
    import json
    import os

    from transformers import AutoConfig
    if isinstance(path, Mapping):
        fields = _text_decoder(dict(path))
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            fields = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: no readable config.json ({e}); pass a Hugging Face config.json or a folder "
                         f"holding one") from None
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise ValueError(f"{file}: no model_type field, so it is not a Hugging Face model config; pass the "
                         f"config.json of a causal LM (e.g. one written by save_pretrained)")
    fields = _text_decoder(fields)
    try:
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None


def _text_decoder(fields: dict) -> dict:
    """A config.json's fields, or its text decoder's for a Gemma 3 multimodal config (its vision tower untrained)."""
    if fields.get("model_type") == "gemma3" and isinstance(fields.get("text_config"), dict):
        return {**fields["text_config"], "model_type": "gemma3_text"}
    return fields


def causal_lm_from_config(config_json: "str | Mapping[str, Any]", grid: Grid, recompute: bool = False, init: bool = True,
                          attention: str = "sdpa", seed: int = 0) -> torch.nn.Module:
    """The Hugging Face causal LM of the config.json at ``config_json`` (or a folder holding one, or its fields) on
    ``grid``, in
    fp32 and training mode, without weights from any file: built with its parameters on the meta device and
    parallelized by its plan, so no dense copy exists (a dry run builds a 405B model this way). ``init``: each rank
    fills its parts with the run's initial weights (:func:`axgrid.plans.initial_weights.init_causal_lm_` of
    ``seed``: the same model on every grid and on one process), else they stay uninitialised (fake tensors have
    no values). ``recompute``: as :func:`load_causal_lm`; ``attention``: transformers' attention implementation."""
    from transformers import AutoModelForCausalLM

    from ..io.meta import parameters_on_meta
    from .initial_weights import init_causal_lm_
    from .parallelize import parallelize
    config = read_hf_config(config_json)
    config.use_cache = False
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attention)
    parallelize(model, grid)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if left:
        raise ValueError(f"{config_json}: {left[:4]} stay on the meta device after the plan; only models whose plan "
                         f"places every parameter are built from a config")
    if init:
        init_causal_lm_(model, seed)
    if recompute:
        enable_recompute(model)
    return model.train()


def causal_lm_loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                   mask: Optional[torch.Tensor], normalizer: float) -> torch.Tensor:
    """The summed cross entropy over the kept targets of ``inputs/targets [b, S]`` divided by ``normalizer``, for
    axgrid's GPT or a Hugging Face causal LM (dropped targets, ``mask == 0``, become ``-100`` labels;
    ``shift_labels`` are the targets, so no shift happens inside the model's loss). A drop-in model's own loss
    (transformers' ``ForCausalLMLoss``) views the labels flat, so they are made contiguous here."""
    if isinstance(model, GPT):
        return model(inputs, targets, mask, normalizer=normalizer)
    labels = (targets if mask is None else targets.masked_fill(mask == 0, -100)).contiguous()   # transformers' loss
    out = model(input_ids=inputs, labels=labels, shift_labels=labels, num_items_in_batch=normalizer, use_cache=False)
    return out.loss


def dense_parameters(model: torch.nn.Module, ep: int = 1) -> int:
    """Parameters of the dense model (a parallel parameter counts its dense shape, ``axgrid_tile``); under expert
    parallelism of size ``ep`` a rank holds ``1/ep`` of the experts (``axgrid_expert``), so theirs count ``ep`` times."""
    return sum((math.prod(t.dense_shape) if (t := getattr(p, "axgrid_tile", None)) is not None else p.numel())
               * (ep if getattr(p, "axgrid_expert", False) else 1) for p in model.parameters())
