"""Mixtures of experts as shapes (``axgrid.spec.TransformerShape`` of Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): the
total and active parameter counts against the models transformers builds from the same configs (meta device),
the config round trip, the published models' counts, and the one-line refusals."""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from axgrid.spec import PUBLIC_MODELS, TransformerShape

DEEP = bool(os.environ.get("AXGRID_DEEP"))


def hf_model(config: dict):
    """The causal LM transformers builds from a config.json's dict, on the meta device."""
    import transformers
    fields = dict(config)
    hf_config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hf_config)


def counted(model, experts: int, top_k: int) -> tuple[int, int]:
    """(total, active) parameters of a transformers MoE model: every tensor's elements; the routed experts' tensors
    (names with ``.experts.``, all ``experts`` in one tensor) count ``top_k / experts`` of theirs as active."""
    total = active = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if ".experts." in name:
            assert p.shape[0] == experts, name
            active += p.numel() // experts * top_k
        else:
            active += p.numel()
    return total, active


MOE_CONFIGS = st.fixed_dictionaries({
    "model_type": st.sampled_from(["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]),
    "num_hidden_layers": st.integers(1, 4), "num_key_value_heads": st.sampled_from([1, 2]),
    "group": st.sampled_from([1, 2]), "head_dim": st.sampled_from([4, 8]), "experts": st.integers(1, 9),
    "top_k": st.integers(1, 9), "width": st.integers(1, 24), "shared": st.integers(0, 16),
    "step": st.integers(1, 3), "only": st.lists(st.integers(0, 3), max_size=2), "norm_topk": st.booleans(),
    "vocab_size": st.integers(8, 40), "tied": st.booleans(), "bias": st.booleans()})


def moe_config(d: dict) -> dict:
    """A tiny config.json of the drawn family and sizes (hidden = heads · head_dim)."""
    heads = d["num_key_value_heads"] * d["group"]
    family, k = d["model_type"], min(d["top_k"], d["experts"])
    out = {"model_type": family, "hidden_size": heads * d["head_dim"], "num_hidden_layers": d["num_hidden_layers"],
           "num_attention_heads": heads, "num_key_value_heads": d["num_key_value_heads"],
           "vocab_size": d["vocab_size"], "tie_word_embeddings": d["tied"], "num_experts_per_tok": k,
           "intermediate_size": d["width"] + 3}
    if family == "mixtral":
        out.update(num_local_experts=d["experts"], intermediate_size=d["width"])
    else:
        out.update(num_experts=d["experts"], norm_topk_prob=d["norm_topk"])
    if family == "olmoe":
        out.update(intermediate_size=d["width"], attention_bias=d["bias"])
    if family in ("qwen2_moe", "qwen3_moe"):
        out.update(moe_intermediate_size=d["width"], decoder_sparse_step=d["step"], mlp_only_layers=d["only"],
                   head_dim=d["head_dim"])
    if family == "qwen2_moe":
        out.update(shared_expert_intermediate_size=d["shared"] or 1, qkv_bias=d["bias"])
    if family == "qwen3_moe":
        out.update(attention_bias=d["bias"])
    return out


@settings(max_examples=300 if DEEP else 12, deadline=None)
@given(d=MOE_CONFIGS)
def test_total_and_active_parameters_are_transformers(d):
    """Every family, with dense layers (Qwen's sparse step and mlp-only layers), a shared expert, biases, tied
    tables: the shape's ``params`` and ``active_params`` are the built model's; its config fields read back."""
    config = moe_config(d)
    shape = TransformerShape.from_hf_config(config, 16)
    model = hf_model(config)
    assert (shape.params, shape.active_params) == counted(model, shape.experts, shape.top_k)
    assert TransformerShape.from_hf_config(shape.hf_config(), 16) == shape


@pytest.mark.parametrize("name,total,active", [("mixtral-8x7b", 46.7e9, 12.9e9), ("qwen3-30b-a3b", 30.5e9, 3.3e9),
                                               ("olmoe-1b-7b", 6.9e9, 1.3e9)])
def test_the_public_moe_models_hold_their_published_counts(name, total, active):
    """The model cards' totals and active counts (billions, as rounded there), and transformers' count of the
    config the named shape writes."""
    shape = PUBLIC_MODELS[name]
    assert abs(shape.params / total - 1) < 0.005 and abs(shape.active_params / active - 1) < 0.03
    assert TransformerShape.from_hf_config(shape.hf_config(), shape.seq, name=name) == shape
    assert counted(hf_model(shape.hf_config()), shape.experts, shape.top_k) == (shape.params, shape.active_params)


def test_moe_flops_count_the_active_weights():
    """6·T·(active matrices + attention): the FLOPs of the active parameters less the tables and norms."""
    shape = PUBLIC_MODELS["mixtral-8x7b"]
    tokens = 2 * shape.seq
    matrices = shape.active_params - shape.vocab * shape.hidden - (2 * shape.layers + 1) * shape.hidden
    attention = 2 * shape.layers * shape.seq * shape.attention_width
    assert shape.flops_per_iteration(2, False) == 6 * tokens * (matrices + attention)


@pytest.mark.parametrize("fields,match", [
    ({"top_k": 9}, r"top_k=9 experts per token is more than the 8 experts"),
    ({"experts": 0}, r"experts=0 must be an integer >= 1"),
    ({"shared_expert_ffn": 64}, r"shared_expert_ffn=64 is Qwen2-MoE's shared expert"),
    ({"router_scoring": "relu"}, r"router_scoring='relu'"),
])
def test_bad_moe_fields_are_refused_in_one_line(fields, match):
    from dataclasses import replace
    with pytest.raises(ValueError, match=match) as e:
        replace(PUBLIC_MODELS["mixtral-8x7b"], **fields)
    assert "\n" not in str(e.value)


def test_a_dense_family_refuses_expert_fields():
    with pytest.raises(ValueError, match="describe a mixture of experts"):
        TransformerShape("x", 2, 64, 4, 16, 32, bias=False, family="llama", experts=4, top_k=1, expert_ffn=8)
