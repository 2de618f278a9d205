"""One decoding step of each kind of model :func:`axgrid.generate` supports, behind one call.

A decoder is called with the tokens the model has not seen yet, ``[B_d, s]`` for this data-parallel rank's
sequences (the prompts first, then one token per step; the uncached path passes every token each time), and
returns this rank's logits of the last position, ``[B_d/Gz, V/Gy]`` fp32: the model itself keeps its z-rank's
sequences, and the head gives the vocabulary split over y.

- axgrid's :class:`~axgrid.models.gpt.GPT`: a :class:`~axgrid.models.kv_cache.KVCache` of this rank's sequences
  and heads.
- A Hugging Face model parallelized with a :class:`~axgrid.plans.TransformerPlan` (the built-in Llama, Mistral,
  Qwen2 plans): its own cache (``DynamicCache``, made by the model on the first step) works per rank unchanged,
  because the plan runs Hugging Face's attention on the local heads of the local sequences, so the cache holds
  ``[B_d/Gz, H_kv/Gy, T, head_dim]`` per layer; positions come from the cache's length (equal-length prompts, no
  padding, so no attention mask or position ids are passed), and the plan's batch split keeps the z-rank's
  sequences of each step's ``[B_d, 1]`` input as it does for training batches.
"""
from __future__ import annotations

import inspect
from typing import Callable, Optional

import torch
from torch import nn

from ..grid import Grid
from ..models.gpt import GPT
from ..models.kv_cache import KVCache

Decoder = Callable[[torch.Tensor], torch.Tensor]


def vocab_size(model: nn.Module, grid: Grid, length: int) -> int:
    """The dense vocabulary of a model :func:`axgrid.generate` supports, which will see sequences of up to
    ``length`` tokens; raises (no collective) for any other, naming what is missing."""
    if isinstance(model, GPT):
        if model.grid is not grid:
            raise ValueError("axgrid.generate: the GPT was built on another grid (or serial, grid=None); build it "
                             "with GPT(config, grid) on the grid passed to generate")
        if length > model.config.seq:
            raise ValueError(f"axgrid.generate: prompt length + max_new_tokens - 1 = {length} exceeds "
                             f"GPTConfig.seq={model.config.seq} (position table rows); generate fewer tokens")
        return model.config.vocab
    plan = getattr(model, "axgrid_plan", None)
    if plan is None:
        raise ValueError(f"axgrid.generate: {type(model).__name__} has no axgrid plan; it supports axgrid's GPT "
                         f"and models parallelized with a TransformerPlan (axgrid.parallelize(model, grid) applies "
                         f"the built-in Llama/Mistral/Qwen2 plans)")
    if plan.head is None:
        raise ValueError(f"axgrid.generate: plan {plan.name!r} has no LM head (a base model); use the causal-LM "
                         f"class, e.g. LlamaForCausalLM")
    return int(model.config.vocab_size)


def gpt_decoder(model: GPT, use_cache: bool) -> Decoder:
    cache = KVCache(len(model.blocks)) if use_cache else None

    def step(ids: torch.Tensor) -> torch.Tensor:
        return model(ids, cache=cache)[:, -1].float()

    return step


def _cache_names(model: nn.Module) -> tuple[str, str]:
    """The forward argument and output field of the model's cache (``cache`` in transformers >= 5.24,
    ``past_key_values`` before)."""
    params = inspect.signature(type(model).forward).parameters
    return ("cache", "cache") if "cache" in params else ("past_key_values", "past_key_values")


def hf_decoder(model: nn.Module, use_cache: bool) -> Decoder:
    arg, field = _cache_names(model)
    state: dict[str, Optional[object]] = {"cache": None}

    def step(ids: torch.Tensor) -> torch.Tensor:
        kwargs = {arg: state["cache"]} if use_cache and state["cache"] is not None else {}
        out = model(input_ids=ids, use_cache=use_cache, logits_to_keep=1, **kwargs)
        if use_cache:
            state["cache"] = getattr(out, field)
        return out.logits[:, -1].float()

    return step


def decoder_for(model: nn.Module, use_cache: bool) -> Decoder:
    return gpt_decoder(model, use_cache) if isinstance(model, GPT) else hf_decoder(model, use_cache)


__all__ = ["Decoder", "decoder_for", "vocab_size", "gpt_decoder", "hf_decoder"]
