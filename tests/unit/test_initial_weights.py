"""The hashed normal initialisation of models pre-trained from a config (axgrid.nn.init.normal_box): any box of
the dense tensor equals the slice of the whole (generated shapes, boxes and slab sizes), and the values are N(0, std²) by
scipy's Kolmogorov-Smirnov test; init_causal_lm_ gives a transformers Llama what transformers' own init does (norms
1, matrices of std initializer_range, one seed one model, another seed another)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from axgrid.nn.init import normal_box


@st.composite
def shape_and_box(draw):
    shape = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    offsets = [draw(st.integers(0, n - 1)) for n in shape]
    sizes = [draw(st.integers(1, n - o)) for n, o in zip(shape, offsets)]
    return tuple(shape), tuple(offsets), tuple(sizes)


@settings(max_examples=40, deadline=None)
@given(shape_and_box(), st.integers(0, 2**31 - 1), st.integers(1, 30))
def test_a_box_is_the_slice_of_the_whole(case, seed, chunk):
    shape, offsets, sizes = case
    whole = normal_box(seed, shape, (0,) * len(shape), shape, 0.02)
    box = normal_box(seed, shape, offsets, sizes, 0.02, chunk=chunk)     # in slabs of rows of ~chunk elements
    assert torch.equal(box, whole[tuple(slice(o, o + n) for o, n in zip(offsets, sizes))])


def test_the_values_are_normal_with_the_asked_deviation():
    stats = pytest.importorskip("scipy.stats")
    x = normal_box(7, (200, 100), (0, 0), (200, 100), 0.02).double().flatten().numpy()
    assert stats.kstest(x, "norm", args=(0.0, 0.02)).pvalue > 1e-3
    assert stats.kstest(x, "norm", args=(0.0, 0.025)).pvalue < 1e-6      # the test tells a wrong deviation apart


def test_a_transformers_llama_gets_its_own_initialisation_scheme():
    transformers = pytest.importorskip("transformers")
    from axgrid.plans.initial_weights import init_causal_lm_
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, initializer_range=0.05)
    a = init_causal_lm_(transformers.LlamaForCausalLM(cfg), seed=1)
    b = init_causal_lm_(transformers.LlamaForCausalLM(cfg), seed=1)
    c = init_causal_lm_(transformers.LlamaForCausalLM(cfg), seed=2)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), name
        if p.dim() == 1:
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            assert not torch.equal(p, r) and abs(p.std().item() - 0.05) < 0.01, name
