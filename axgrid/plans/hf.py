"""Built-in plans for the LLaMA family in Hugging Face ``transformers``: Llama, Mistral, Qwen2.

They share one structure (``modeling_llama``): ``embed_tokens``; per layer ``input_layernorm``,
``self_attn.{q,k,v,o}_proj``, ``post_attention_layernorm``, ``mlp.{gate,up,down}_proj``; ``norm``; ``lm_head``
on the causal-LM class. The config fields read are ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim`` (when set; else ``hidden_size / num_attention_heads``),
``intermediate_size``, ``vocab_size`` and ``tie_word_embeddings``. Qwen2's q/k/v biases and Mistral's sliding
window need nothing special: biases split with their rows, masks are per sequence.

:func:`builtin_plan` recognises these classes by name and module (``transformers`` is never imported here).
"""
from __future__ import annotations

import warnings
from typing import Optional

from torch import nn

from ..grid import Grid
from .transformer import Pair, TransformerPlan, resolve

#: Hugging Face class name -> where its decoder (the ``*Model``) sits: ``""`` itself, ``"model."`` under it.
LLAMA_FAMILY: dict[str, str] = {
    "LlamaModel": "", "LlamaForCausalLM": "model.",
    "MistralModel": "", "MistralForCausalLM": "model.",
    "Qwen2Model": "", "Qwen2ForCausalLM": "model.",
}


def _is_hf(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.models.") and type(model).__name__ in LLAMA_FAMILY


def head_dim(config) -> int:
    """The attention head size of a Llama-family ``config``."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def llama_plan(model: nn.Module) -> TransformerPlan:
    """The plan of a Llama / Mistral / Qwen2 model (``*Model`` or ``*ForCausalLM``) from ``transformers``."""
    name = type(model).__name__
    if name not in LLAMA_FAMILY:
        raise ValueError(f"llama_plan: {name} is not one of {sorted(LLAMA_FAMILY)}; write a TransformerPlan")
    p = LLAMA_FAMILY[name]
    cfg = model.config
    layer = p + "layers.*."
    return TransformerPlan(
        embedding=p + "embed_tokens",
        norms=(layer + "input_layernorm", layer + "post_attention_layernorm", p + "norm"),
        pairs=(Pair((layer + "self_attn.q_proj", layer + "self_attn.k_proj", layer + "self_attn.v_proj"),
                    layer + "self_attn.o_proj", unit=head_dim(cfg)),
               Pair((layer + "mlp.gate_proj", layer + "mlp.up_proj"), layer + "mlp.down_proj")),
        head="lm_head" if p else None,
        name=name,
    )


def builtin_plan(model: nn.Module, grid: Grid) -> Optional[TransformerPlan]:
    """The built-in plan when ``model`` is a recognised Hugging Face model that fits ``grid``; None (with a
    warning saying why, when recognised) so that :func:`axgrid.parallelize` falls back to drop-in."""
    if not _is_hf(model):
        return None
    plan = llama_plan(model)
    if getattr(model.config, "tie_word_embeddings", False) and plan.head is not None:
        why = "tie_word_embeddings=True (the sharded stream needs an untied head)"
    else:
        try:
            resolve(model, grid, plan)
            return plan
        except ValueError as e:
            why = str(e)
    warnings.warn(f"axgrid.parallelize: {type(model).__name__} runs drop-in (activations redistributed around "
                  f"every Linear), not with its built-in plan: {why}", stacklevel=3)
    return None
