"""perfmodel prices every family the runtime trains: a Hugging Face decoder's step (GQA, SwiGLU, RoPE, tied or
not) is priced by the same model as the GPT's, and what it prices agrees with the references it did not write
itself: the bytes per grid dimension equal the collective replay of the decoder's step (``perfmodel.step``,
which tests/ranks/test_dryrun.py checks against the runtime), the parameter, gradient and optimizer bytes equal the
replay's, the FLOPs equal ``axgrid.spec.llama_flops`` (the formula of the Llama 3 paper's accounting), and the
public models' shapes hold their published parameter counts; over generated shapes and grids."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import axgrid.perfmodel as pm
from axgrid.perfmodel.memory import static_bytes
from axgrid.perfmodel.step import step_collective_events
from axgrid.perfmodel.memory import memory_per_gpu
from axgrid.spec import PUBLIC_MODELS, TransformerShape, llama_flops

#: generated examples: a few in CI, hundreds with AXGRID_DEEP=1
DEEP = bool(os.environ.get("AXGRID_DEEP"))


def examples(ci: int, deep: int) -> int:
    return deep if DEEP else ci


@st.composite
def decoders(draw) -> TransformerShape:
    """A small Llama-structured decoder: GQA (key-value heads dividing the heads), its own head size or not, tied
    or not, Qwen2's q/k/v biases or Llama's none, Qwen3's q/k norms."""
    kv = draw(st.sampled_from([1, 2, 4]))
    heads = kv * draw(st.sampled_from([1, 2]))
    head_dim = draw(st.sampled_from([4, 8]))
    family = draw(st.sampled_from(["llama", "qwen2", "mistral", "qwen3"]))
    return TransformerShape(
        f"gen-{family}", draw(st.integers(1, 3)), draw(st.sampled_from([16, 32])), heads,
        seq=draw(st.sampled_from([8, 16])), vocab=draw(st.sampled_from([32, 64])), bias=False,
        ffn=draw(st.sampled_from([16, 48])), family=family, kv_heads=kv, head_dim=head_dim,
        tied=draw(st.booleans()), attention_bias=family == "qwen2", head_norms=family == "qwen3")


GRIDS = [(1, 1, 1, 2), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (2, 2, 1, 2), (1, 2, 2, 1), (2, 1, 2, 2)]


@settings(max_examples=examples(40, deep=300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=decoders(), grid=st.sampled_from(GRIDS), zero=st.sampled_from([0, 1, 2]), mb=st.sampled_from([1, 2]),
       keep=st.booleans(), recompute=st.booleans(), tied=st.booleans())
def test_a_decoders_bytes_per_dimension_equal_its_replay(spec, grid, zero, mb, keep, recompute, tied):
    from dataclasses import replace
    spec = replace(spec, tied=tied)
    if spec.divisibility(grid) or (zero and grid[3] == 1):
        return
    batch = 2 * mb * grid[2] * grid[3]
    opt = pm.Options(microbatches=mb, keep_gathered=keep, recompute=recompute, zero=zero)
    ev = pm.evaluate(pm.Problem(spec, batch, int(np.prod(grid)), "bf16", opt), pm.load_machine("perlmutter"),
                     pm.Grids.of([grid]))
    events = step_collective_events(spec, grid, batch // mb * spec.seq, mb, 2, keep, recompute, opt.grad_bytes,
                                       opt.bucket_bytes, zero, clip=opt.clip)
    for d in ("x", "y", "z", "d", "xyz"):
        assert ev.step_bytes[d][0] == sum(n for dd, _, n in events if dd == d), (grid, d)
    params, grads, optimizer = static_bytes(spec, grid, zero, opt.bucket_bytes)
    mem = memory_per_gpu(spec, *grid, batch // mb * spec.seq / (grid[2] * grid[3]), 2, False, opt)
    assert (float(mem.params), float(mem.grads), float(mem.optimizer)) == (params, grads, optimizer)


def test_the_public_models_hold_their_published_parameter_counts():
    """Meta's, Mistral's and Qwen's model cards (billions, rounded as published)."""
    published = {"llama-3.1-8b": 8.03, "llama-3.1-70b": 70.55, "llama-3.1-405b": 405.85, "llama-2-7b": 6.74,
                 "llama-2-13b": 13.02, "llama-2-70b": 68.98, "mistral-7b": 7.25, "qwen2.5-7b": 7.62,
                 "qwen2.5-32b": 32.76}
    for name, billions in published.items():
        assert abs(PUBLIC_MODELS[name].params / 1e9 - billions) < 0.006, name


@settings(max_examples=examples(30, deep=300), deadline=None)
@given(spec=decoders(), batch=st.integers(1, 8), recompute=st.booleans())
def test_a_decoders_flops_are_llama_flops(spec, batch, recompute):
    from types import SimpleNamespace
    c = SimpleNamespace(hidden_size=spec.hidden, num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                        num_key_value_heads=spec.kv_heads, intermediate_size=spec.ffn, vocab_size=spec.vocab,
                        head_dim=spec.head_dim)
    # llama_flops counts the matrices' weights (no biases) and the dense attention, as the shape does
    assert spec.flops_per_iteration(batch, recompute) == llama_flops(c, batch, spec.seq, recompute)


def test_key_value_heads_change_bytes_not_attention_flops_and_a_window_cuts_them():
    base = PUBLIC_MODELS["llama-3.1-8b"]
    from dataclasses import replace
    mha = replace(base, kv_heads=32)
    machine = pm.load_machine("dgx-h100")
    grid = pm.Grids.of([(1, 2, 4, 8)])

    def ev(spec):
        return pm.evaluate(pm.Problem(spec, 256, 64, "bf16", pm.Options(microbatches=8)), machine, grid)
    gqa, full = ev(base), ev(mha)
    assert gqa.extra["attention"][0] == full.extra["attention"][0]
    assert gqa.step_bytes["z"][0] < full.step_bytes["z"][0]                  # k, v blocks 4x narrower
    windowed = replace(base, sliding_window=1024, sliding_layers=base.layers)
    assert ev(windowed).extra["attention"][0] < 0.3 * gqa.extra["attention"][0]


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mistral-7b", "qwen2.5-7b"])
def test_rank_answers_for_a_public_model_in_seconds(name):
    """The new user's question: which grid for this model on 64 H100s, how fast, will it fit."""
    start = time.process_time()
    rk = pm.rank(pm.Problem(PUBLIC_MODELS[name], 512, 64, "bf16", pm.Options(zero=None)), pm.load_machine("dgx-h100"))
    assert time.process_time() - start < 10                  # CPU seconds; the goal (2 s) is checked by hand
    best = rk.feasible[0]
    assert best.memory_bytes <= 0.9 * pm.load_machine("dgx-h100").memory_bytes
    assert 0.1 < best.pct_peak / 100 < 0.9


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-2-7b", "mistral-7b", "qwen2.5-7b"])
def test_a_public_models_config_fields_build_its_shape_in_transformers(name):
    """``TransformerShape.hf_config`` (what the dry run and ``--emit-slurm`` build a named public model from) reads
    back as the same shape, and transformers builds from it a model of the published parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    shape = PUBLIC_MODELS[name]
    fields = shape.hf_config()
    back = TransformerShape.from_hf_config(fields, shape.seq, name=name)
    assert back == shape
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == shape.params
