"""A causal language model on the grid, as the training drivers use it: loaded from a Hugging Face folder onto the
grid, and its loss over kept targets, for axgrid's GPT and Hugging Face models alike.

    model = load_causal_lm("path/to/hf_folder", grid, recompute=True)        # training mode, fp32
    model = causal_lm_from_config("path/to/config.json", grid, init=False)  # no weights (a dry run)
    loss = causal_lm_loss(model, inputs, targets, mask, normalizer)          # inputs/targets/mask [b, S]
"""
from __future__ import annotations

import math
from typing import Optional

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


def causal_lm_from_config(config_json: str | dict, grid: Grid, recompute: bool = False, init: bool = True,
                          attention: str = "sdpa") -> torch.nn.Module:
    """The Hugging Face causal LM of the config.json at ``config_json`` (or of its fields, a dict) on ``grid``, in fp32 and training mode,
    without weights from any file: built with its parameters on the meta device and parallelized by its plan, so no
    dense copy exists (a dry run builds a 405B model this way). A Gemma 3 multimodal config (``"gemma3"``) builds
    its text decoder (``Gemma3ForCausalLM`` of its ``text_config``), as ``axgrid.spec.TransformerShape`` reads it. ``init``: fill the parts (normal, std 0.02; norms
    ones), else leave them uninitialised (fake tensors have no values). ``recompute``: as :func:`load_causal_lm`;
    ``attention``: transformers' attention implementation."""
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    from ..io.meta import parameters_on_meta
    from .parallelize import parallelize
    if isinstance(config_json, dict):
        fields = dict(config_json)
    else:
        with open(config_json) as f:
            fields = json.load(f)
    if fields.get("model_type") == "gemma3" and isinstance(fields.get("text_config"), dict):
        fields = {**fields["text_config"], "model_type": "gemma3_text"}    # Gemma 3's text decoder
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.use_cache = False
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attention)
    parallelize(model, grid)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if left:
        where = config_json if isinstance(config_json, str) else f"the {type(model).__name__} config"
        raise ValueError(f"{where}: {left[:4]} stay on the meta device after the plan; the dry run builds "
                         f"only models whose plan places every parameter")
    if init:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1 and "norm" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)
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


def dense_parameters(model: torch.nn.Module) -> int:
    """Parameters of the dense model (a parallel parameter counts its dense shape, ``axgrid_tile``)."""
    return sum(math.prod(t.dense_shape) if (t := getattr(p, "axgrid_tile", None)) is not None else p.numel()
               for p in model.parameters())
