"""A Hugging Face model built from its config on the grid (``causal_lm_from_config``, what pretrain.py trains) starts
from the same weights on every grid as the dense transformers model given ``init_causal_lm_`` on one process: every
rank's part of every parameter equals its slice of the dense one, for the families whose layouts differ most
(Phi-3's fused qkv and gate_up rows over y, Gemma 3's tied head and ``1 + w`` norms that start at 0, Mistral's GQA),
on grids that split over x, y and z. (Llama and Qwen3 are covered through training: tests/scripts/test_pretrain.py.)"""
from __future__ import annotations

import os

import pytest
import torch

import axgrid
from axgrid.io.part_copy import part_of_dense

pytest.importorskip("transformers")

SIZES = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64,
             num_attention_heads=8, num_key_value_heads=4)
CONFIGS = {
    "phi3": ("Phi3Config", dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=8, sliding_window=4,
                                        layer_types=["sliding_attention", "full_attention"])),
    "mistral": ("MistralConfig", dict(sliding_window=4)),
}


def rank_parts_equal_dense(spec: str, root: str) -> dict:
    import transformers
    from axgrid.plans.causal_lm import causal_lm_from_config
    from axgrid.plans.initial_weights import init_causal_lm_
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60))
    try:
        out = {}
        for kind in CONFIGS:
            path = os.path.join(root, kind, "config.json")
            par = causal_lm_from_config(path, grid, seed=7)
            dense = dict(init_causal_lm_(transformers.AutoModelForCausalLM.from_config(
                transformers.AutoConfig.from_pretrained(os.path.dirname(path))), seed=7).named_parameters())
            wrong = []
            for name, p in par.named_parameters():
                tile = getattr(p, "axgrid_tile", None)
                want = dense[name].detach() if tile is None else part_of_dense(tile, dense[name].detach())
                if not torch.equal(p.detach(), want):
                    wrong.append(name)
            norms = [float(p.detach()[0]) for n, p in par.named_parameters() if n.endswith("norm.weight")]
            out[kind] = (wrong, sorted(set(norms)))
        return out
    finally:
        grid.destroy()


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    import transformers
    root = tmp_path_factory.mktemp("configs")
    for kind, (cls, extra) in CONFIGS.items():
        getattr(transformers, cls)(**SIZES, **extra).save_pretrained(root / kind)
    return str(root)


@pytest.mark.parametrize("spec", ["1x2x2x1", "2x1x1x2"])
def test_every_rank_holds_its_slice_of_the_dense_initial_weights(ranks, configs, spec):
    for out in ranks(4, rank_parts_equal_dense, spec, configs):
        for kind, (wrong, norms) in out.items():
            assert wrong == [], (kind, wrong)
            assert norms == ([0.0] if kind == "gemma3" else [1.0]), (kind, norms)
