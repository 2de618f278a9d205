"""One description of a transformer's shape (``axgrid.spec.TransformerShape``): a named size, a vTrain suite row and a
Hugging Face config each give one shape, and the runtime's GPT, the dry run and perfmodel read that same shape, so
the model that is priced is the model that is built. The parameter counts are checked against what torch and
transformers build (``numel`` of the built model's parameters), references we did not write."""
from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch

from axgrid import perfmodel as pm
from axgrid.dryrun.config import resolve
from axgrid.models.gpt import GPT, GPTConfig
from axgrid.perfmodel.decoder import decoder_collective_events, decoder_parameters
from axgrid.perfmodel.gpt import gpt_parameters
from axgrid.perfmodel.suites import vtrain_problem, vtrain_rows
from axgrid.spec import NAMED_SIZES, TransformerShape

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA_405B = os.path.join(HERE, "..", "..", "experiments", "configs", "llama-3.1-405b", "config.json")


def built_parameters(shape: TransformerShape) -> int:
    """Elements of every parameter of the runtime's serial GPT of ``shape`` (built without values, FC layers on
    the meta device)."""
    with torch.device("meta"):
        model = GPT(GPTConfig(shape), None, init=False)
    return sum(p.numel() for p in model.parameters())


def perfmodel_parameters(shape: TransformerShape) -> int:
    """perfmodel's count: the tensors of one rank of the 1x1x1x1 grid (``perfmodel.gpt`` / ``perfmodel.decoder``)."""
    tensors = gpt_parameters(shape, (1, 1, 1, 1)) if shape.is_gpt else decoder_parameters(shape, (1, 1, 1, 1))
    return sum(p.elems for p in tensors)


def test_a_named_size_is_one_shape_for_the_runtime_perfmodel_and_the_dry_run():
    for name in ("gpt-tiny", "gpt-mini"):
        shape = NAMED_SIZES[name]
        assert GPTConfig.named(name).shape == shape == pm.get_model(name) == TransformerShape.named(name.upper())
        assert resolve(name, 4, 8, grid="2x2x1x1").gpt_config().shape == shape
        assert shape.params == built_parameters(shape) == perfmodel_parameters(shape)
        cfg = GPTConfig.named(name, recompute=True)
        assert cfg.flops_per_iteration(8) == pm.model_flops(shape, 8, True)
    # the big sizes: the same count without building them
    for name in ("gpt-5b", "gpt-405b"):
        shape = NAMED_SIZES[name]
        assert shape.params == perfmodel_parameters(shape) == GPTConfig.named(name).shape.params


def test_changing_a_named_size():
    shape = TransformerShape.named("gpt-tiny", hidden=32, heads=2, layers=1)
    assert (shape.hidden, shape.heads, shape.kv_heads, shape.head_dim) == (32, 2, 2, 16)
    assert shape.ffn == 256                  # the named size's 4·64, as GPTConfig.named has always built it
    assert shape.params == built_parameters(shape) == perfmodel_parameters(shape)
    cfg = GPTConfig.named("gpt-tiny", hidden=32, heads=2, layers=1, seed=3, recompute=True)
    assert cfg.shape == shape and (cfg.seed, cfg.recompute) == (3, True)
    with pytest.raises(ValueError, match=r"unknown TransformerShape field\(s\) \['width'\]"):
        GPTConfig.named("gpt-tiny", width=3)


@pytest.mark.parametrize("index", [0, 1, 2, 777])
def test_a_vtrain_row_prices_the_model_the_runtime_builds(index):
    row = vtrain_rows()[index]
    shape = TransformerShape.from_vtrain_row(row)
    problem = vtrain_problem(row)
    assert problem.model == shape and shape.name == f"vtrain-h{row['hidden']}-a{row['heads']}-l{row['layers']}"
    assert (shape.layers, shape.hidden, shape.heads, shape.seq, shape.vocab) == \
        (row["layers"], row["hidden"], row["heads"], row["seq"], 51200)
    assert shape.params == built_parameters(shape) == perfmodel_parameters(shape)


def tiny_config(family: str, **extra) -> dict:
    base = {"model_type": family, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128, "max_position_embeddings": 64}
    return {**base, **extra}


@pytest.mark.parametrize("family, extra", [("llama", {}), ("llama", {"tie_word_embeddings": True}),
                                           ("llama", {"attention_bias": True, "mlp_bias": True}),
                                           ("qwen2", {"tie_word_embeddings": False}), ("mistral", {"head_dim": 32})])
def test_a_hugging_face_config_counts_what_transformers_builds(family, extra, tmp_path):
    import transformers
    config = tiny_config(family, **extra)
    shape = TransformerShape.from_hf_config(config, 32)
    hf_config = transformers.AutoConfig.for_model(**config)
    assert TransformerShape.from_hf_config(hf_config, 32) == shape       # a PretrainedConfig reads the same
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    read = TransformerShape.from_config_json(str(folder), 32)
    assert (read.name, read.path) == ("tiny", str(folder / "config.json"))
    assert {**vars(read), "name": "", "path": ""} == {**vars(shape), "name": "", "path": ""}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert shape.params == perfmodel_parameters(shape) == sum(p.numel() for p in model.parameters())
    # perfmodel's layer list is the model's Linear modules, layer by layer
    linears = {n.split(".")[-1]: (m.out_features, m.in_features, m.bias is not None)
               for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers.0." in n}
    assert linears == {layer.name: (layer.n, layer.k, layer.bias) for layer in shape.block_layers()}


def test_the_405b_config():
    shape = TransformerShape.from_config_json(LLAMA_405B, 8192)
    assert (shape.family, shape.layers, shape.hidden, shape.kv_heads, shape.ffn, shape.tied) == \
        ("llama", 126, 16384, 8, 53248, False)
    assert shape.params == perfmodel_parameters(shape) == 405_853_388_800      # LLaMA-3.1-405B's published count


def test_bad_shapes_are_refused_in_one_line():
    with pytest.raises(ValueError, match="hidden=10 is not divisible by heads=4"):
        TransformerShape("t", 1, 10, 4)
    with pytest.raises(ValueError, match=r"TransformerShape.layers=0 must be an integer >= 1"):
        TransformerShape("t", 0, 8, 2)
    with pytest.raises(ValueError, match="kv_heads, tied describe the Llama-structured families"):
        TransformerShape("t", 1, 8, 2, kv_heads=1, tied=True)
    with pytest.raises(ValueError, match="family='bert': choose one of gpt, llama, mistral, qwen2"):
        TransformerShape("t", 1, 8, 2, family="bert")
    with pytest.raises(ValueError, match="give bias=False"):
        TransformerShape("t", 1, 8, 2, family="llama")
    with pytest.raises(ValueError, match="heads=4 is not a multiple of kv_heads=3"):
        TransformerShape.from_hf_config(tiny_config("llama", num_key_value_heads=3), 32)
    with pytest.raises(ValueError, match="GPTConfig.shape=.* must be a TransformerShape of family 'gpt'"):
        GPTConfig(TransformerShape.from_hf_config(tiny_config("llama"), 32))
    # perfmodel prices every family (tests/unit/test_perfmodel_families.py), a GPT with its own MLP width too
    llama = TransformerShape.from_hf_config(tiny_config("llama"), 32)
    assert pm.Problem(llama, 8, 4).model.family == "llama"
    assert pm.Problem(TransformerShape("t", 1, 8, 2, ffn=100), 8, 4).model.ffn == 100


def test_grid_rules():
    gpt = TransformerShape("t", 1, 24, 6, vocab=42)
    assert gpt.divisibility((1, 4, 1, 1)) == ["heads 6 not divisible by Gy=4", "vocab 42 not divisible by Gy=4"]
    assert gpt.divisibility((2, 2, 3, 5)) == []
    llama = TransformerShape.from_hf_config(tiny_config("llama"), 32)
    assert llama.divisibility((1, 4, 1, 1)) == ["num_key_value_heads 2 not divisible by Gy=4"]


def test_a_decoders_shape_replays_the_decoders_step():
    """``perfmodel.collective_events`` of a shape replays the step of the model it describes."""
    llama = TransformerShape.from_hf_config(tiny_config("llama", tie_word_embeddings=True), 32)
    events = pm.collective_events(llama, (2, 2, 1, 2), 4 * 32, 1, 2, clip=True)
    assert events == decoder_collective_events(llama, (2, 2, 1, 2), 4 * 32, 1, 2, clip=True)
    assert events != pm.collective_events(replace(llama, family="gpt", kv_heads=None, head_dim=None, ffn=None,
                                                  tied=False), (2, 2, 1, 2), 4 * 32, 1, 2, clip=True)
