"""perfmodel's Hugging Face decoder (axgrid/perfmodel/parameters.py, memory.py): the tensors a rank trains are the model's (their dense
total is the published parameter count of LLaMA-3.1-405B and the count of the model transformers builds from
SmolLM2-135M's config), and a config.json of a family it does not model is refused in one line. That its collectives
and parameter, gradient and optimizer bytes equal the runtime's is tests/ranks/test_dryrun.py's."""
from __future__ import annotations

import json
import os

import pytest

from axgrid.perfmodel.memory import static_bytes
from axgrid.perfmodel.parameters import trainable_parameters
from axgrid.spec import TransformerShape

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA_405B = os.path.join(HERE, "..", "..", "experiments", "configs", "llama-3.1-405b", "config.json")


def test_the_405b_config_has_llama_3_1_405bs_published_parameter_count():
    spec = TransformerShape.from_config_json(LLAMA_405B, 8192)
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.ffn, spec.vocab, spec.tied) == \
        (126, 16384, 128, 8, 53248, 128256, False)
    assert sum(p.elems for p in trainable_parameters(spec, (1, 1, 1, 1))) == 405_853_388_800
    # on 4x4x8x64: every tensor split as the plan splits it (weights over x, y, z; norms over x; the table over x)
    params, grads, optimizer = static_bytes(spec, (4, 4, 8, 64))
    assert params == grads and optimizer == 2 * params + 4 * len(trainable_parameters(spec, (4, 4, 8, 64)))


@pytest.mark.slow
@pytest.mark.realmodel
def test_a_tied_config_counts_what_transformers_builds(smollm2):
    """The real SmolLM2-135M's config (converted once per session by the ``smollm2`` fixture, shared with the
    realmodel tests): tied, GQA with 3 KV heads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    config = os.path.join(smollm2, "config.json")
    spec = TransformerShape.from_config_json(config, 2048)
    assert spec.tied and spec.kv_heads == 3
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(smollm2))
    assert sum(p.elems for p in trainable_parameters(spec, (1, 1, 1, 1))) == sum(p.numel() for p in model.parameters())


def test_a_family_it_does_not_model_is_refused_in_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]}))
    with pytest.raises(ValueError, match=r"model_type 'gemma2' \(Gemma2ForCausalLM\) is not a family the "
                                             r"dry run models; use a config of gemma3_text, llama, mistral, mixtral, "
                                             r"olmoe, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe \(or gemma3 with a "
                                             r"text_config\)"):
        TransformerShape.from_config_json(str(tmp_path), 2048)
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ValueError, match="num_hidden_layers, num_attention_heads, intermediate_size, vocab_size "
                                             "missing"):
        TransformerShape.from_config_json(str(path), 2048)
