"""Tied embeddings and fused rows through every path tensors take in and out of a parallel model: a tied Gemma 3
and a Phi-3 (fused qkv_proj and gate_up_proj) trained one step on 1x2x2x1, then

- deep-copied (the copy's embedding reads the copy's head);
- exported in slabs of one row (every slab cuts the fused bands): transformers loads the export -- tied, its files
  without lm_head.weight -- with the parallel model's logits;
- checkpointed, and loaded onto 1x4x1x1 (another row map for the fused tensors, no z split) with the same logits;
- the export read back by axgrid.from_pretrained on 1x4x1x1, the same logits again."""
from __future__ import annotations

import copy
import os

import pytest
import torch

import axgrid

pytest.importorskip("transformers")

KINDS = ("gemma3", "phi3")


def ids() -> torch.Tensor:
    return torch.randint(0, 128, (4, 6), generator=torch.Generator().manual_seed(7))


def rank_train_export_save(tmp: str) -> dict:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    from axgrid.checkpoint import save_checkpoint
    from test_hf_plans import tiny
    logging.set_verbosity_error()
    grid = axgrid.init("1x2x2x1", timeout_s=60)
    try:
        out = {}
        for kind in KINDS:
            model = axgrid.parallelize(tiny(kind), grid)
            x = ids()
            model(input_ids=x, labels=x).loss.backward()
            with torch.no_grad():                         # one SGD step: the weights are no longer the files'
                for p in model.parameters():
                    p -= 0.1 * p.grad
            with torch.no_grad():
                logits = axgrid.plans.gather_logits(model(input_ids=x).logits, grid)
            where = os.path.join(tmp, kind)
            axgrid.export_pretrained(model, where + "-export", grid, chunk_bytes=1)      # one row per slab
            save_checkpoint(where + "-ckpt", model, None, grid, step=1)
            twin = copy.deepcopy(model)                   # shares the grid; ties and local head counts copied
            with torch.no_grad():
                o = {"logits": logits, "twin": float((axgrid.plans.gather_logits(twin(input_ids=x).logits, grid)
                                                      - logits).abs().max())}
            emb = twin.model.embed_tokens
            o["twin_tied"] = (emb.weight is twin.lm_head.weight and emb.head is twin.lm_head) if kind == "gemma3" \
                else twin.model.layers[0].self_attn.config.num_attention_heads == 4
            if kind == "phi3":                            # a fused layer back to dense: the files' row order
                dense = axgrid.dense_state_dict(model, grid)
                qkv = model.model.layers[0].self_attn.qkv_proj
                o["to_dense"] = torch.equal(qkv.to_dense().weight, dense["model.layers.0.self_attn.qkv_proj.weight"])
            if grid.rank == 0:
                loaded = AutoModelForCausalLM.from_pretrained(where + "-export")
                with torch.no_grad():
                    o["hf"] = float((loaded(input_ids=x).logits - logits).abs().max())
                o["hf_tied"] = loaded.lm_head.weight is loaded.model.embed_tokens.weight
                names = set()
                for f in os.listdir(where + "-export"):
                    if f.endswith(".safetensors"):
                        with safe_open(os.path.join(where + "-export", f), "pt") as fh:
                            names |= set(fh.keys())
                o["files_have_head"] = "lm_head.weight" in names
            out[kind] = o
        return out
    finally:
        grid.destroy()


def rank_load_elsewhere(tmp: str) -> dict:
    from axgrid.checkpoint import load_checkpoint
    from test_hf_plans import tiny
    grid = axgrid.init("1x4x1x1", timeout_s=60)
    try:
        out = {}
        for kind in KINDS:
            where = os.path.join(tmp, kind)
            model = axgrid.parallelize(tiny(kind, seed=5), grid)          # other weights, then the checkpoint's
            load_checkpoint(where + "-ckpt", model, None, grid)
            back = axgrid.from_pretrained(where + "-export", grid)
            with torch.no_grad():
                out[kind] = [axgrid.plans.gather_logits(m(input_ids=ids()).logits, grid) for m in (model, back)]
        return out
    finally:
        grid.destroy()


@pytest.mark.slow
def test_tied_and_fused_models_export_checkpoint_and_reshard(ranks, tmp_path):
    first = ranks(4, rank_train_export_save, str(tmp_path))
    for kind in KINDS:
        o = first[0][kind]
        assert o["hf"] < 1e-5, (kind, o["hf"])
        assert o["hf_tied"] == (kind == "gemma3") and o["files_have_head"] == (kind == "phi3"), (kind, o)
    assert all(r["phi3"]["to_dense"] for r in first)
    assert all(r[k]["twin"] < 1e-6 and r[k]["twin_tied"] for r in first for k in KINDS), first
    for got in ranks(4, rank_load_elsewhere, str(tmp_path)):
        for kind in KINDS:
            want = first[0][kind]["logits"]
            for label, logits in zip(("checkpoint", "export"), got[kind]):
                assert float((logits - want).abs().max()) < 1e-5, (kind, label)
