"""Hugging Face decoders (Llama with GQA, Mistral with a sliding window, Qwen2, Qwen3, Gemma 3 with sliding and full
layers) under their built-in plans and context parallelism: the loss and every gradient equal single-process
transformers' on the whole sequences, and two AdamW steps track it; rotary positions come from each chunk's place
in the sequence (the plan's position_ids), the labels are shifted on the whole sequence."""
from __future__ import annotations

import pytest
import torch

import axgrid
from axgrid.io.part_copy import part_of_dense

pytest.importorskip("transformers")

SEQ = 16
MODELS = {
    "llama-gqa": ("LlamaConfig", "LlamaForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4,
                                                            sliding_window=5)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_attention_heads=8, num_key_value_heads=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4, head_dim=4)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_attention_heads=8, num_key_value_heads=4, head_dim=8, sliding_window=6, final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "full_attention"])),
}


def tiny(kind: str) -> torch.nn.Module:
    import transformers
    cfg_name, cls_name, extra = MODELS[kind]
    sizes = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64)
    cfg = getattr(transformers, cfg_name)(**{**sizes, **extra})
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(cfg)
    with torch.no_grad():                        # norms away from 1 (Gemma: 0), so each weight is seen
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape))
    return model


def rank_hf_under_cp(spec: str, cp: int, kinds: list[str]) -> dict[str, float]:
    """Per model: the largest difference of the loss and of every gradient (relative to its largest magnitude) over
    two AdamW steps, and of the parameters after them, against serial transformers."""
    grid = axgrid.init(spec, cp=cp, config=axgrid.RuntimeConfig(timeout_s=60, seed=0))
    try:
        gd, d = grid.size("d"), grid.index("d")
        worst = {}
        for kind in kinds:
            serial, par = tiny(kind), tiny(kind)
            axgrid.parallelize(par, grid)
            assert par.config._attn_implementation == "axgrid_context_parallel"
            opt_s = torch.optim.AdamW(serial.parameters(), lr=1e-2, eps=1e-4)
            opt_p = torch.optim.AdamW(par.parameters(), lr=1e-2, eps=1e-4)
            g = torch.Generator().manual_seed(1)
            per = gd * grid.size("z") // cp
            errs = []
            for _ in range(2):
                ids = torch.randint(0, 128, (per, SEQ), generator=g)
                labels = ids.clone()
                labels[:, :3] = -100
                b = per // gd
                opt_s.zero_grad()
                opt_p.zero_grad()
                loss_s = sum(serial(input_ids=ids[i * b:(i + 1) * b], labels=labels[i * b:(i + 1) * b]).loss
                             for i in range(gd)) / gd
                loss_s.backward()
                out = par(input_ids=ids[d * b:(d + 1) * b], labels=labels[d * b:(d + 1) * b])
                out.loss.backward()
                axgrid.sync_gradients(par, grid)
                loss_p = grid.comm.all_reduce(out.loss.detach().reshape(1), "d", average=True)[0]
                errs.append(abs(float(loss_p) - float(loss_s)))
                dense = dict(serial.named_parameters())
                for n, p in par.named_parameters():
                    tile = getattr(p, "axgrid_tile", None)
                    want = dense[n].grad if tile is None else part_of_dense(tile, dense[n].grad)
                    errs.append(float((p.grad - want).abs().max() / (want.abs().max() + 1e-6)))
                opt_s.step()
                opt_p.step()
            for n, p in par.named_parameters():
                tile = getattr(p, "axgrid_tile", None)
                want = dense[n].detach() if tile is None else part_of_dense(tile, dense[n].detach())
                errs.append(float((p.detach() - want).abs().max()))
            worst[kind] = max(errs)
        return worst
    finally:
        grid.destroy()


@pytest.mark.parametrize("spec,cp,kinds", [
    ("1x1x2x1", 2, ["llama-gqa", "mistral", "qwen2", "qwen3", "gemma3"]),
    ("2x1x2x1", 2, ["mistral"]),
    ("1x1x2x2", 2, ["llama-gqa"]), ("1x1x4x1", 4, ["mistral", "qwen2"]),
])
def test_hf_models_under_cp_equal_transformers(ranks, spec, cp, kinds):
    n = 1
    for v in spec.split("x"):
        n *= int(v)
    for worst in ranks(n, rank_hf_under_cp, spec, cp, kinds):
        assert all(w < 1e-4 for w in worst.values()), worst


def rank_refusals() -> list[str]:
    msgs = []
    for spec, cp, call in (("1x1x2x2", 4, None),
                           ("1x1x2x2", 2, dict(input_ids=torch.zeros(1, 14, dtype=torch.long))),
                           ("1x1x2x2", 2, dict(input_ids=torch.zeros(1, 16, dtype=torch.long),
                                               attention_mask=torch.tensor([[0] + [1] * 15]))),
                           ("1x1x2x2", 2, dict(input_ids=torch.zeros(1, 16, dtype=torch.long), use_cache=True,
                                               past_key_values="cache"))):
        grid = axgrid.init(spec, cp=cp, config=axgrid.RuntimeConfig(timeout_s=30, seed=0))
        try:
            model = tiny("llama-gqa")
            axgrid.parallelize(model, grid)
            if call.get("past_key_values") == "cache":
                from transformers import DynamicCache
                call = dict(call, past_key_values=DynamicCache(config=model.config))
            model(**call)
            msgs.append("no error")
        except ValueError as e:
            msgs.append(str(e))
        finally:
            grid.destroy()
    return msgs


def test_sizes_and_padding_it_cannot_take_are_refused_in_one_line(ranks):
    """cp not dividing Gz, a sequence not cut into 2·cp chunks, a padding mask, a KV cache: one line each, on every rank alike,
    before any collective of the step."""
    msgs = ranks(4, rank_refusals)
    assert all(m == msgs[0] for m in msgs)
    grid, seq, pad, cache = msgs[0]
    assert "cp=4: a plan splits sequences over z only, so cp must divide Gz=2; choose cp in [1, 2]" in grid, grid
    assert "sequence length 14 does not cut into 2·cp = 4 equal chunks" in seq and "12, 16" in seq, seq
    assert "attention_mask with padding is not supported" in pad, pad
    assert cache.startswith("generation (a KV cache) under context parallelism (cp=2) is not supported"), cache
    assert all("\n" not in m for m in msgs[0])
