"""A Hugging Face decoder under context parallelism: its attention through :mod:`axgrid.context_parallel`.

Under ``axgrid.init(..., cp=N)`` (``N`` dividing Gz) the plan's batch hook keeps, of every sequence of this rank's
group of ``N`` z-ranks, its two chunks (:mod:`axgrid.context_parallel.chunks`), with their own ``position_ids`` (so
rotary embeddings turn each token by its place in the whole sequence) and the labels shifted on the whole sequence
first (``shift_labels``; the loss then needs no neighbour). The attention modules' implementation becomes
:func:`attention` (registered with transformers' ``AttentionInterface`` as :data:`NAME`), which ignores the model's
mask (none is built for it) and applies the causal mask and the layer's ``sliding_window`` itself, exactly.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn
from torch.nn import functional as F

from ..context_parallel import check_sequence, context_parallel_attention, shard
from ..core.grid import Grid

#: The attention implementation's name in transformers' registry.
NAME = "axgrid_context_parallel"


def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
              sliding_window: Optional[int] = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query [b, H, 2c, d]``, ``key, value [b, H_kv, 2c, d]`` (this rank's
    chunks, local heads) -> ``[b, 2c, H, d]`` and no weights."""
    if dropout:
        raise ValueError(f"attention dropout {dropout} under context parallelism is not supported; set the "
                         f"model's attention_dropout to 0")
    out = context_parallel_attention(query, key, value, module.axgrid_comm, window=sliding_window, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def use_context_parallel_attention(model: nn.Module, attention_modules: list[nn.Module], grid: Grid) -> None:
    """Route ``model``'s attention through :func:`attention` on ``grid``'s group ``"c"``."""
    from transformers import AttentionInterface
    if not attention_modules:
        raise ValueError("axgrid plan under context parallelism: the plan names no attention modules "
                         "(TransformerPlan.attention); name them, or use cp=1")
    AttentionInterface.register(NAME, attention)
    for m in attention_modules:
        m.axgrid_comm = grid.comm
    model.config._attn_implementation = NAME


def chunk_batch(kwargs: dict, grid: Grid, rows: slice, b: int) -> dict:
    """This rank's chunks of every ``[b, S]`` batch input in ``kwargs`` (its group's sequences ``rows``), with
    ``position_ids`` and ``shift_labels`` made on the whole sequences first; a padding ``attention_mask`` and a KV
    cache (generation) are refused (one line, before any collective)."""
    cp, index = grid.size("c"), grid.index("c")
    if kwargs.get("past_key_values") is not None:
        raise ValueError(f"generation (a KV cache) under context parallelism (cp={cp}) is not supported; generate "
                         f"on a grid built with cp=1 (a checkpoint loads onto any grid)")
    kwargs["use_cache"] = False                          # no cache of chunks: each forward sees whole sequences
    s = kwargs["input_ids"].shape[1]
    check_sequence(s, cp)
    mask = kwargs.pop("attention_mask", None)
    if mask is not None and not bool(mask.all()):
        raise ValueError("axgrid plan under context parallelism: an attention_mask with padding is not supported; "
                         "pack whole sequences (no padding) or use cp=1")
    labels = kwargs.get("labels")
    if labels is not None and kwargs.get("shift_labels") is None:
        kwargs["shift_labels"] = F.pad(labels, (0, 1), value=-100)[..., 1:]
    if kwargs.get("position_ids") is None:
        kwargs["position_ids"] = torch.arange(s, device=kwargs["input_ids"].device).expand(b, s)
    for name in ("input_ids", "labels", "shift_labels", "position_ids"):
        v = kwargs.get(name)
        if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[0] == b:
            kwargs[name] = shard(v[rows], cp, index, dim=1)
    return kwargs


__all__ = ["NAME", "attention", "chunk_batch", "use_context_parallel_attention"]
