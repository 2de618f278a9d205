"""One decoding step of each kind of model :func:`axgrid.generate` supports, behind one call.

A decoder is called with the tokens the model has not seen yet, ``[B_d, s]`` for this data-parallel rank's
sequences (the prompts first, then one token per step; the uncached path passes every token each time), and
returns this rank's logits of the last position, ``[B_d/Gz, V/Gy]`` fp32: the model itself keeps its z-rank's
sequences, and the head gives the vocabulary split over y. :attr:`Decoder.vocab_dim` names the grid dimension the
vocabulary is split over (``"y"``; None when every rank holds all of it, drop-in).

- axgrid's :class:`~axgrid.models.gpt.GPT`: a :class:`~axgrid.models.kv_cache.KVCache` of this rank's sequences
  and heads.
- A Hugging Face model parallelized with a :class:`~axgrid.plans.TransformerPlan` (the built-in Llama, Mistral,
  Qwen2 plans): its own cache (``DynamicCache``, made by the model on the first step) works per rank unchanged,
  because the plan runs Hugging Face's attention on the local heads of the local sequences, so the cache holds
  ``[B_d/Gz, H_kv/Gy, T, head_dim]`` per layer; positions come from the cache's length (equal-length prompts, no
  padding, so no attention mask or position ids are passed), and the plan's batch split keeps the z-rank's
  sequences of each step's ``[B_d, 1]`` input as it does for training batches.
- A Hugging Face causal LM parallelized drop-in (no plan: ``plan={}``, or a family without one): every rank of
  the block runs all ``B_d`` sequences with all heads (each Linear splits the tokens over z and gathers them back),
  caches all of them, and gets full logits ``[B_d, V]``; the decoder keeps its z-rank's rows, so the loop is the
  same. What that costs: each Linear redistributes its activations every step, and the dense leftovers
  (embeddings, norms, a tied head) and the whole cache sit on every rank.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from ..core.grid import Grid
from ..models.gpt import GPT
from ..models.kv_cache import KVCache



@dataclass(frozen=True)
class Decoder:
    """One step (``step(tokens [B_d, s]) -> logits [B_d/Gz, V_loc]`` fp32) and the grid dimension the vocabulary is
    split over (None: every rank holds the whole vocabulary)."""

    step: Callable[[torch.Tensor], torch.Tensor]
    vocab_dim: Optional[str] = "y"


def vocab_size(model: nn.Module, grid: Grid, length: int) -> int:
    """The dense vocabulary of a model :func:`axgrid.generate` supports, which will see sequences of up to
    ``length`` tokens; raises (no collective) for any other, naming what is missing."""
    if isinstance(model, GPT):
        if model.grid is not grid:
            raise ValueError("axgrid.generate: the GPT was built on another grid (or serial, grid=None); build it "
                             "with GPT(config, grid) on the grid passed to generate")
        shape = model.config.shape
        if length > shape.seq:
            raise ValueError(f"axgrid.generate: prompt length + max_new_tokens - 1 = {length} exceeds "
                             f"the model's seq={shape.seq} (position table rows); generate fewer tokens")
        return shape.vocab
    plan = getattr(model, "axgrid_plan", None)
    if plan is None and not _drop_in_causal_lm(model):
        raise ValueError(f"axgrid.generate: {type(model).__name__} is not a model it supports: axgrid's GPT, or a "
                         f"Hugging Face causal LM parallelized on the grid (axgrid.parallelize(model, grid) or "
                         f"axgrid.from_pretrained: its built-in plan, or drop-in)")
    if plan is not None and plan.head is None:
        raise ValueError(f"axgrid.generate: plan {plan.name!r} has no LM head (a base model); use the causal-LM "
                         f"class, e.g. LlamaForCausalLM")
    return int(model.config.vocab_size)


def _drop_in_causal_lm(model: nn.Module) -> bool:
    """A Hugging Face causal LM that :func:`axgrid.parallelize` ran drop-in (it left a summary, no plan)."""
    get = getattr(model, "get_output_embeddings", None)
    return (hasattr(model, "axgrid_summary") and callable(get) and get() is not None
            and isinstance(getattr(getattr(model, "config", None), "vocab_size", None), int))


def gpt_decoder(model: GPT, use_cache: bool) -> Decoder:
    cache = KVCache(len(model.blocks)) if use_cache else None

    def step(ids: torch.Tensor) -> torch.Tensor:
        return model(ids, cache=cache)[:, -1].float()

    return Decoder(step)


def _cache_names(model: nn.Module) -> tuple[str, str]:
    """The forward argument and output field of the model's cache (``cache`` in transformers >= 5.24,
    ``past_key_values`` before)."""
    params = inspect.signature(type(model).forward).parameters
    return ("cache", "cache") if "cache" in params else ("past_key_values", "past_key_values")


def hf_decoder(model: nn.Module, use_cache: bool, grid: Grid) -> Decoder:
    arg, field = _cache_names(model)
    state: dict[str, Optional[object]] = {"cache": None}
    planned = getattr(model, "axgrid_plan", None) is not None
    gz, z = grid.size("z"), grid.index("z")

    def step(ids: torch.Tensor) -> torch.Tensor:
        kwargs = {arg: state["cache"]} if use_cache and state["cache"] is not None else {}
        out = model(input_ids=ids, use_cache=use_cache, logits_to_keep=1, **kwargs)
        if use_cache:
            state["cache"] = getattr(out, field)
        logits = out.logits[:, -1].float()                    # planned: [B_d/Gz, V/Gy]; drop-in: [B_d, V]
        if planned:
            return logits
        b = logits.shape[0] // gz
        return logits[z * b:(z + 1) * b]

    return Decoder(step, "y" if planned else None)


def decoder_for(model: nn.Module, use_cache: bool, grid: Grid) -> Decoder:
    return gpt_decoder(model, use_cache) if isinstance(model, GPT) else hf_decoder(model, use_cache, grid)


__all__ = ["Decoder", "decoder_for", "vocab_size", "gpt_decoder", "hf_decoder"]
