"""Built-in plans for Hugging Face ``transformers`` decoder families: Llama, Mistral, Qwen2, Qwen3, Gemma 3 (text),
Phi-3, and the mixtures of experts Mixtral, Qwen2-MoE (with its shared expert) and Qwen3-MoE.

All share one structure (``modeling_llama``): ``embed_tokens``; per layer an input norm, ``self_attn`` with its
projections, a norm before the MLP, ``mlp``; a final ``norm``; ``lm_head`` on the causal-LM class (tied to
``embed_tokens`` when ``tie_word_embeddings``: one sharded parameter, :mod:`axgrid.tensor_parallel.tied_embedding`).
What differs:

=========================  ============================================================================
family                     what its plan adds
=========================  ============================================================================
Llama, Mistral, Qwen2      nothing (Qwen2's q/k/v biases split with their rows; Mistral's sliding window
                           is a per-sequence mask)
Qwen3                      ``q_norm``/``k_norm``: RMS norms over each head's features (``head_norms``)
Gemma 3 (text)             the embedding scaled by ``sqrt(hidden)``; norms ``1 + w`` in fp32; extra norms
                           after attention and around the MLP; q/k norms; sliding-window layers (masks);
                           ``head_dim`` set by the config (not ``hidden / heads``)
Phi-3                      fused ``qkv_proj`` ``[(H + 2·H_kv)·d, h]`` and ``gate_up_proj`` ``[2f, h]``: each
                           rank holds its own heads' q, k, v rows and its share of gate and up
                           (``Pair.segments``; the tiles map the rows back to the files' order); its
                           attention reads the head counts, so it sees this rank's (``local_heads``)
Mixtral, Qwen2/3-MoE       each ``mlp`` a mixture of experts (``moe``): its router and only this rank's
                           experts, each expert's FC layers 3D Linear layers, the experts spread over
                           the expert-parallel group (:mod:`axgrid.plans.moe`); Qwen2-MoE's shared expert
                           a 3D Linear pair beside them; the Qwen-MoE dense layers (``mlp_only_layers``,
                           ``decoder_sparse_step``) keep the MLP pair
=========================  ============================================================================

The config fields read are ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` (when
set; else ``hidden_size / num_attention_heads``), ``intermediate_size`` and, for the grid check, ``vocab_size``.
:func:`builtin_plan` recognises the classes by name and module (``transformers`` is never imported here).
"""
from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Callable, Optional

from torch import nn

from ..core.grid import Grid
from ..spec import hf_head_dim
from .transformer import Pair, TransformerPlan, resolve


def _llama(p: str, cfg, name: str) -> TransformerPlan:
    layer = p + "layers.*."
    return TransformerPlan(
        embedding=p + "embed_tokens",
        norms=(layer + "input_layernorm", layer + "post_attention_layernorm", p + "norm"),
        pairs=(Pair((layer + "self_attn.q_proj", layer + "self_attn.k_proj", layer + "self_attn.v_proj"),
                    layer + "self_attn.o_proj", unit=hf_head_dim(cfg)),
               Pair((layer + "mlp.gate_proj", layer + "mlp.up_proj"), layer + "mlp.down_proj")),
        head="lm_head" if p else None, attention=(layer + "self_attn",), name=name)


def _qwen3(p: str, cfg, name: str) -> TransformerPlan:
    layer = p + "layers.*."
    return replace(_llama(p, cfg, name), head_norms=(layer + "self_attn.q_norm", layer + "self_attn.k_norm"))


def _gemma3(p: str, cfg, name: str) -> TransformerPlan:
    layer = p + "layers.*."
    norms = tuple(layer + n for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                      "post_feedforward_layernorm")) + (p + "norm",)
    return replace(_qwen3(p, cfg, name), norms=norms, embedding_scale=cfg.hidden_size ** 0.5, unit_offset_norms=True)


def _moe_dense_layers(cfg) -> bool:
    """Whether some decoder layer of a Qwen-MoE config keeps a dense MLP (``mlp_only_layers``, or a sparse step
    above 1)."""
    return bool(getattr(cfg, "mlp_only_layers", None)) or getattr(cfg, "decoder_sparse_step", 1) > 1


def _mixtral(p: str, cfg, name: str) -> TransformerPlan:
    layer = p + "layers.*."
    return replace(_llama(p, cfg, name), pairs=_llama(p, cfg, name).pairs[:1], moe=(layer + "mlp",))


def _qwen3_moe(p: str, cfg, name: str) -> TransformerPlan:
    layer = p + "layers.*."
    plan = _qwen3(p, cfg, name)
    if not _moe_dense_layers(cfg):
        return replace(plan, pairs=plan.pairs[:1], moe=(layer + "mlp",))
    return replace(plan, moe=tuple(f"{p}layers.{i}.mlp" for i in range(cfg.num_hidden_layers)
                                   if i not in (cfg.mlp_only_layers or []) and (i + 1) % cfg.decoder_sparse_step == 0))


def _qwen2_moe(p: str, cfg, name: str) -> TransformerPlan:
    layer = p + "layers.*."
    plan = _llama(p, cfg, name)
    if not _moe_dense_layers(cfg):
        return replace(plan, pairs=plan.pairs[:1], moe=(layer + "mlp",))
    return replace(plan, moe=tuple(f"{p}layers.{i}.mlp" for i in range(cfg.num_hidden_layers)
                                   if i not in (cfg.mlp_only_layers or []) and (i + 1) % cfg.decoder_sparse_step == 0))


def _phi3(p: str, cfg, name: str) -> TransformerPlan:
    layer = p + "layers.*."
    d, f = hf_head_dim(cfg), cfg.intermediate_size
    qkv = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.num_key_value_heads * d)
    return TransformerPlan(
        embedding=p + "embed_tokens",
        norms=(layer + "input_layernorm", layer + "post_attention_layernorm", p + "norm"),
        pairs=(Pair((layer + "self_attn.qkv_proj",), layer + "self_attn.o_proj", unit=d, segments=qkv),
               Pair((layer + "mlp.gate_up_proj",), layer + "mlp.down_proj", segments=(f, f))),
        head="lm_head" if p else None, local_heads=(layer + "self_attn",), attention=(layer + "self_attn",),
        name=name)


#: Hugging Face class name -> (where its decoder, the ``*Model``, sits: ``""`` itself, ``"model."`` under it;
#: the plan builder).
HF_FAMILIES: dict[str, tuple[str, Callable[[str, object, str], TransformerPlan]]] = {
    "LlamaModel": ("", _llama), "LlamaForCausalLM": ("model.", _llama),
    "MistralModel": ("", _llama), "MistralForCausalLM": ("model.", _llama),
    "Qwen2Model": ("", _llama), "Qwen2ForCausalLM": ("model.", _llama),
    "Qwen3Model": ("", _qwen3), "Qwen3ForCausalLM": ("model.", _qwen3),
    "Gemma3TextModel": ("", _gemma3), "Gemma3ForCausalLM": ("model.", _gemma3),
    "Phi3Model": ("", _phi3), "Phi3ForCausalLM": ("model.", _phi3),
    "MixtralModel": ("", _mixtral), "MixtralForCausalLM": ("model.", _mixtral),
    "Qwen3MoeModel": ("", _qwen3_moe), "Qwen3MoeForCausalLM": ("model.", _qwen3_moe),
    "Qwen2MoeModel": ("", _qwen2_moe), "Qwen2MoeForCausalLM": ("model.", _qwen2_moe),
}


def _is_hf(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.models.")


def hf_plan(model: nn.Module) -> TransformerPlan:
    """The built-in plan of a recognised Hugging Face model (``*Model`` or ``*ForCausalLM`` of the families above)."""
    name = type(model).__name__
    if name not in HF_FAMILIES:
        raise ValueError(f"hf_plan: {name} is not one of {sorted(HF_FAMILIES)}; write a TransformerPlan or use "
                         f"plan={{}} (drop-in)")
    prefix, build = HF_FAMILIES[name]
    return build(prefix, model.config, name)


def builtin_plan(model: nn.Module, grid: Grid) -> Optional[TransformerPlan]:
    """The built-in plan when ``model`` is a recognised Hugging Face model; it must fit ``grid`` (a ValueError names
    the size and the grids that fit, before any collective). None for any other model, so that
    :func:`axgrid.parallelize` runs it drop-in (with one warning for a Hugging Face model: it has no plan)."""
    if not _is_hf(model):
        return None
    if type(model).__name__ not in HF_FAMILIES:
        warnings.warn(f"axgrid.parallelize: {type(model).__name__} has no built-in plan and runs drop-in: every "
                      f"nn.Linear takes and returns replicated activations (redistributed around each layer), and "
                      f"everything else (embeddings, norms, a tied head) stays dense on every rank; see "
                      f"docs/models.md#other-models", stacklevel=3)
        return None
    plan = hf_plan(model)
    resolve(model, grid, plan)
    return plan
