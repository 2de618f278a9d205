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
from hypothesis import given, settings
from hypothesis import strategies as st

from axgrid import perfmodel as pm
from axgrid.dryrun.config import resolve
from axgrid.models.gpt import GPT, GPTConfig
from axgrid.perfmodel.parameters import trainable_parameters
from axgrid.perfmodel.step import step_collective_events
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
    """perfmodel's count: the tensors of one rank of the 1x1x1x1 grid (``perfmodel.parameters``)."""
    tensors = trainable_parameters(shape, (1, 1, 1, 1))
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
                                           ("qwen2", {"tie_word_embeddings": False}), ("mistral", {"head_dim": 32}),
                                           ("qwen3", {"head_dim": 8, "attention_bias": True}),
                                           ("gemma3_text", {"head_dim": 32, "sliding_window": 16}),
                                           ("phi3", {"tie_word_embeddings": True, "sliding_window": 16,
                                                     "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2})])
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
    with pytest.raises(ValueError, match="kv_heads, tied describe the Hugging Face decoders"):
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
    assert events == step_collective_events(llama, (2, 2, 1, 2), 4 * 32, 1, 2, clip=True)
    assert events != pm.collective_events(replace(llama, family="gpt", kv_heads=None, head_dim=None, ffn=None,
                                                  tied=False), (2, 2, 1, 2), 4 * 32, 1, 2, clip=True)


# ------------------------------------------------------------------ Qwen3, Gemma 3, Phi-3 beside the Llama structure

def transformers_model(config: dict):
    """The causal LM transformers builds from ``config`` (a config.json's dict), on the meta device."""
    import transformers
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        return hf_config, transformers.AutoModelForCausalLM.from_config(hf_config)


def block_linears(model) -> dict[str, tuple[int, int, bool]]:
    """Layer 0's Linear modules: name -> (out_features, in_features, bias)."""
    return {n.split(".")[-1]: (m.out_features, m.in_features, m.bias is not None)
            for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers.0." in n}


FAMILY_SIZES = st.fixed_dictionaries({
    "family": st.sampled_from(["llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3"]),
    "layers": st.integers(1, 7), "kv_heads": st.sampled_from([1, 2, 4]), "group": st.sampled_from([1, 2, 3]),
    "head_dim": st.sampled_from([4, 8, 12]), "hidden": st.sampled_from([24, 48]), "ffn": st.integers(8, 40),
    "vocab": st.integers(16, 70), "tied": st.booleans(), "bias": st.booleans(),
    "window": st.sampled_from([None, 8]), "pattern": st.sampled_from([None, 2, 3]), "layer_types": st.booleans(),
    "use_sliding_window": st.booleans()})


def family_config(p: dict) -> dict:
    """A config.json dict of family ``p["family"]`` with the drawn sizes (head_dim stated: Gemma's is not h/H)."""
    heads = p["kv_heads"] * p["group"]
    config = {"model_type": p["family"], "hidden_size": p["hidden"], "num_hidden_layers": p["layers"],
              "num_attention_heads": heads, "num_key_value_heads": p["kv_heads"], "head_dim": p["head_dim"],
              "intermediate_size": p["ffn"], "vocab_size": p["vocab"], "max_position_embeddings": 64,
              "tie_word_embeddings": p["tied"], "attention_bias": p["bias"], "pad_token_id": 0, "bos_token_id": 0,
              "eos_token_id": 0}
    if p["family"] == "gemma3_text" and p["hidden"] % heads:
        config["num_attention_heads"] = config["num_key_value_heads"] = p["kv_heads"]   # Gemma: H divides h
    if p["window"] is not None:
        config["sliding_window"] = p["window"]
    if p["family"] in ("qwen2", "qwen3"):
        config.update(use_sliding_window=p["use_sliding_window"], max_window_layers=p["layers"] // 2)
    if p["family"] == "gemma3_text":
        if p["layer_types"]:
            config["layer_types"] = ["sliding_attention" if i % 3 else "full_attention" for i in range(p["layers"])]
        elif p["pattern"] is not None:
            config["sliding_window_pattern"] = p["pattern"]
    if p["family"] == "phi3":
        del config["head_dim"]                       # Phi-3's head is h / H
        config["num_attention_heads"] = config["num_key_value_heads"] = p["kv_heads"] * (1 if p["hidden"] % (
            p["kv_heads"] * p["group"]) else p["group"])
    return config


@given(FAMILY_SIZES)
@settings(max_examples=20, deadline=None)
def test_every_familys_shape_is_the_model_transformers_builds(p):
    """Generated configs of every family a plan trains: the shape's FC layers are the model's Linear modules
    (Phi-3's fused ones at their fused sizes), its parameter count is the model's ``numel``, its norms are the
    model's norms, and its sliding layers are those transformers' config marks ``sliding_attention`` (Mistral,
    Phi-3: every layer when a window is set)."""
    config = family_config(p)
    hf_config, model = transformers_model(config)
    shape = TransformerShape.from_hf_config(config, 32)
    assert TransformerShape.from_hf_config(hf_config, 32) == shape         # a PretrainedConfig reads the same
    assert TransformerShape.from_hf_config(shape.hf_config(), 32) == shape  # and the config a shape writes
    assert block_linears(model) == {layer.name: (layer.n, layer.k, layer.bias) for layer in shape.block_layers()}
    assert shape.params == sum(p.numel() for p in model.parameters()) == perfmodel_parameters(shape)
    layer0 = [n.split(".")[-1] for n, m in model.named_modules() if ".layers.0." in n and n.endswith("norm")]
    hidden_norms = [n for n in layer0 if n.endswith("layernorm")]
    assert len(hidden_norms) == shape.block_norms()
    assert [n for n in layer0 if n in ("q_norm", "k_norm")] == (["q_norm", "k_norm"] if shape.head_norms else [])
    assert {layer.post_norm for layer in shape.block_layers()} - {""} == set(hidden_norms) - {
        layer.norm for layer in shape.block_layers()}
    # perfmodel's tensors are the model's, in model.parameters() order
    names = [n for n, _ in model.named_parameters()]
    assert [t.elems for t in trainable_parameters(shape, (1, 1, 1, 1))] == [
        p.numel() for p in model.parameters()], names
    types = getattr(hf_config, "layer_types", None)
    window = getattr(hf_config, "sliding_window", None) if shape.family != "llama" else None   # Llama: no window
    if types is not None and shape.family not in ("mistral", "phi3"):
        sliding = sum(t == "sliding_attention" for t in types)
    else:
        sliding = hf_config.num_hidden_layers if window else 0
    assert (shape.sliding_window, shape.sliding_layers) == ((window, sliding) if window and sliding else (0, 0))


def test_a_gemma3_multimodal_config_is_its_text_decoder():
    """Gemma 3's published configs are multimodal (``gemma3``): the shape is its ``text_config``'s, with
    transformers' defaults for what the text config leaves out (head_dim 256, the 262,208-token vocabulary, tied,
    5 sliding layers in 6)."""
    import transformers
    text = {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 12,
            "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 32}
    shape = TransformerShape.from_hf_config({"model_type": "gemma3", "text_config": text}, 32)
    assert shape == TransformerShape.from_hf_config(text, 32)
    assert shape == TransformerShape.from_hf_config(transformers.AutoConfig.for_model("gemma3", text_config=text), 32)
    assert (shape.family, shape.head_dim, shape.vocab, shape.tied, shape.head_norms) == \
        ("gemma3_text", 256, 262208, True, True)
    assert (shape.sliding_window, shape.sliding_layers, shape.block_norms()) == (32, 10, 4)
    _, model = transformers_model(text)
    assert type(model).__name__ == "Gemma3ForCausalLM" and shape.params == sum(p.numel() for p in model.parameters())


def test_fc_layers_of_the_gpt_and_llama_have_no_post_norm():
    """The post norm is Gemma's alone: the GPT's and the Llama structure's modules stay as they were."""
    assert TransformerShape.named("gpt-tiny").block_modules() == ("ln1", "qkv", "proj", "ln2", "up", "down")
    llama = TransformerShape.from_hf_config(tiny_config("llama"), 32)
    assert not any(layer.post_norm for layer in llama.block_layers()) and llama.layer_norms() == 2 * 2 + 1
    gemma = TransformerShape.from_hf_config(tiny_config("gemma3_text", head_dim=16), 32)
    assert gemma.block_modules() == ("input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj",
                                     "post_attention_layernorm", "pre_feedforward_layernorm", "gate_proj", "up_proj",
                                     "down_proj", "post_feedforward_layernorm")
    assert gemma.layer_norms() == 4 * 2 + 1


#: the fields of each public model's published config.json (Hugging Face hub: Qwen/Qwen3-8B, Qwen/Qwen3-32B,
#: google/gemma-3-12b-it and google/gemma-3-27b-it -- multimodal, their text decoder in text_config, which leaves out
#: what Gemma3TextConfig defaults --, microsoft/Phi-3-mini-4k-instruct, microsoft/Phi-3-medium-4k-instruct), and the
#: published parameter count (Qwen3 model cards: 8.2B, 32.8B; the Gemma 3 technical report's Table 1, embedding +
#: non-embedding: 1,012M + 10,759M and 1,416M + 25,600M; Phi-3-mini's 3,821,079,552 (its safetensors); Phi-3
#: technical report: 14B)
PUBLISHED = {
    "qwen3-8b": ({"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                  "max_window_layers": 36, "sliding_window": None, "use_sliding_window": False,
                  "tie_word_embeddings": False, "attention_bias": False}, 8.2e9),
    "qwen3-32b": ({"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                   "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                   "max_window_layers": 64, "sliding_window": None, "use_sliding_window": False,
                   "tie_word_embeddings": False, "attention_bias": False}, 32.8e9),
    "gemma-3-12b": ({"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "hidden_size": 3840, "intermediate_size": 15360, "num_hidden_layers": 48,
        "num_attention_heads": 16, "num_key_value_heads": 8, "sliding_window": 1024,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}}, (1012 + 10759) * 1e6),
    "gemma-3-27b": ({"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
        "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
        "sliding_window": 1024, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}}, (1416 + 25600) * 1e6),
    "phi-3-mini": ({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
                    "max_position_embeddings": 4096, "sliding_window": 2047, "tie_word_embeddings": False},
                   3_821_079_552),
    "phi-3-medium": ({"model_type": "phi3", "hidden_size": 5120, "intermediate_size": 17920, "num_hidden_layers": 40,
                      "num_attention_heads": 40, "num_key_value_heads": 10, "vocab_size": 32064,
                      "max_position_embeddings": 4096, "sliding_window": 2047, "tie_word_embeddings": False}, 14e9),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_public_models_config_json_is_its_named_shape(name):
    """A config.json with the published values gives the named shape (``PUBLIC_MODELS``), whose parameter count is
    the published one to 1%."""
    from axgrid.spec import PUBLIC_MODELS
    config, published = PUBLISHED[name]
    named = TransformerShape.named(name)
    assert named == PUBLIC_MODELS[name]
    assert TransformerShape.from_hf_config(config, named.seq, name=name) == named
    assert abs(named.params / published - 1) < 0.01, (named.params, published)
    assert named.params == perfmodel_parameters(named)
    # the config a named shape writes (what the dry run builds for `--model NAME`) is that model for transformers
    assert TransformerShape.from_hf_config(named.hf_config(), named.seq, name=name) == named
    _, model = transformers_model(named.hf_config())
    assert sum(p.numel() for p in model.parameters()) == named.params
