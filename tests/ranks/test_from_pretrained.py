"""axgrid.from_pretrained: equal to parallelize(transformers' from_pretrained) in logits, loss and every gradient
on every grid of 4 ranks and on 2x2x2x1 (Llama with GQA single-file, Mistral sharded, Qwen2, a tied Qwen2, Qwen3,
a tied Gemma 3 and Phi-3 with its fused rows, all under their plans); each rank reads exactly its own parts' bytes
(a tied parameter once); every bad input raises one line on every rank."""
from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest

from helpers import slow_where
import torch

import axgrid
from axgrid.spec.layout import all_shapes

pytest.importorskip("transformers")

SEQ = 8
SIZES = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64)
#: name -> (config class, model class, config fields, shard size for save_pretrained: None = one file)
MODELS = {
    "llama-gqa": ("LlamaConfig", "LlamaForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4), None),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4,
                                                            sliding_window=4), "40KB"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4), None),
    "qwen2-tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=4,
                                                           tie_word_embeddings=True), "40KB"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4, head_dim=4), None),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4, head_dim=8,
                                                             sliding_window=4), "40KB"),          # tied
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_attention_heads=8, num_key_value_heads=4, pad_token_id=0,
                                                   bos_token_id=1, eos_token_id=2), "40KB"),     # fused rows
}


def save_tiny(root: str, name: str, seed: int = 0, folder: str = "", **over) -> str:
    import transformers
    cfg_name, cls_name, extra, shard = MODELS[name]
    cfg = getattr(transformers, cfg_name)(**{**SIZES, **extra, **over})
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(cfg)
    with torch.no_grad():                         # norms start at 1 (Gemma: 0): random, so each one is checked
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape))
    path = os.path.join(root, folder or name)
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("pretrained"))
    paths = {name: save_tiny(root, name, seed=i) for i, name in enumerate(MODELS)}
    assert os.path.isfile(os.path.join(paths["mistral"], "model.safetensors.index.json"))
    assert os.path.isfile(os.path.join(paths["llama-gqa"], "model.safetensors"))
    return paths


def own_bytes(model: torch.nn.Module, itemsize: int) -> int:
    """What this rank keeps: its parameters' real elements (a split part's padding excluded), each tensor once."""
    n = 0
    for p in model.parameters():
        tile = getattr(p, "axgrid_tile", None)
        start, stop = tile.part_range() if tile is not None else (0, p.numel())
        n += (stop - start) * itemsize
    return n


def rank_equals_parallelized_hf(spec: str, paths: dict[str, str], drop_in: tuple[str, ...]) -> dict:
    from transformers import AutoModelForCausalLM
    grid = axgrid.init(spec, timeout_s=60)
    try:
        gd, gz, d = grid.size("d"), grid.size("z"), grid.index("d")
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 128, (gd * 2 * gz, SEQ), generator=g)
        b = ids.shape[0] // gd
        mine = ids[d * b:(d + 1) * b]
        out = {}
        for name, path in paths.items():
            plan = {} if name in drop_in else None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = axgrid.parallelize(AutoModelForCausalLM.from_pretrained(path), grid, plan)
                got = axgrid.from_pretrained(path, grid, plan=plan)
            assert not got.training and type(got) is type(ref)
            assert getattr(got, "axgrid_plan", None) == getattr(ref, "axgrid_plan", None)
            left = [n for n, t in [*got.named_parameters(), *got.named_buffers()] if t.device.type == "meta"]
            assert not left, left
            # each tensor owns exactly its bytes: none is a view of a file's mapping (safetensors' slices are; a
            # mapped storage is not resizable)
            alias = [n for n, t in [*got.named_parameters(), *got.named_buffers()]
                     if t.untyped_storage().nbytes() != t.numel() * t.element_size()
                     or not t.untyped_storage().resizable()]
            assert not alias, alias
            rb, gb = dict(ref.named_buffers()), dict(got.named_buffers())
            assert rb.keys() == gb.keys() and all(torch.equal(rb[k], gb[k]) for k in rb), "buffers differ"
            errs = []
            for m in (ref, got):
                o = m(input_ids=mine, labels=mine)
                o.loss.backward()
                axgrid.sync_gradients(m, grid)
                errs.append(o)
            (a, c) = errs
            worst = max(abs(float(a.loss) - float(c.loss)), float((a.logits - c.logits).abs().max()))
            rp, gp = dict(ref.named_parameters()), dict(got.named_parameters())
            assert rp.keys() == gp.keys()
            for n in rp:
                assert torch.equal(rp[n].detach(), gp[n].detach()), f"{name}: {n} loaded differently"
                worst = max(worst, float((rp[n].grad - gp[n].grad).abs().max()))
            report = got.axgrid_load_report
            out[name] = (worst, report.bytes_read, own_bytes(got, 4), report.plan)
        return out
    finally:
        grid.destroy()


def _check(results: list[dict]) -> None:
    for per_rank in results:
        for name, (worst, read, own, plan) in per_rank.items():
            assert worst < 1e-5, (name, worst)
            assert read == own, f"{name}: read {read} bytes, keeps {own}"      # nothing of another rank's part
            assert plan in ("drop-in", MODELS[name][1]), (name, plan)


FAMILIES = ("qwen3", "gemma3", "phi3")


@pytest.mark.parametrize("spec", slow_where([str(s) for s in all_shapes(4)], lambda s: s != "2x2x1x1"))
def test_every_4_rank_grid_equals_parallelized_hf(ranks, checkpoints, spec):
    drop_in = ("llama-gqa",) if spec == "2x2x1x1" else ()                 # plan={} given explicitly once
    llama = {k: v for k, v in checkpoints.items() if k not in FAMILIES}
    _check(ranks(4, rank_equals_parallelized_hf, spec, llama, drop_in))


@pytest.mark.parametrize("spec", slow_where(["1x2x2x1", "1x4x1x1", "2x1x1x2"], lambda s: s != "1x2x2x1"))
def test_other_families_equal_parallelized_hf(ranks, checkpoints, spec):
    """Qwen3 (q/k norms), Gemma 3 (tied, scaled, its own norms) and Phi-3 (fused rows, read band by band)."""
    _check(ranks(4, rank_equals_parallelized_hf, spec, {k: checkpoints[k] for k in FAMILIES}, ()))


@pytest.mark.slow
def test_2x2x2x1_equals_parallelized_hf(ranks, checkpoints):
    _check(ranks(8, rank_equals_parallelized_hf, "2x2x2x1", checkpoints, ()))


# -- bad input: one line naming the file or tensor and the fix, on every rank, no model -----------------------

def _bad_checkpoints(root: str, good: dict[str, str]) -> dict[str, tuple[str, dict, str]]:
    """case -> (path, from_pretrained keywords, text the error must contain)."""
    from safetensors.torch import load_file, save_file
    cases = {}

    def copy(name: str, case: str) -> str:
        dst = os.path.join(root, case)
        shutil.copytree(good[name], dst)
        return dst

    p = copy("mistral", "missing-shard")
    index = json.load(open(os.path.join(p, "model.safetensors.index.json")))["weight_map"]
    gone = sorted(set(index.values()))[1]
    os.remove(os.path.join(p, gone))
    cases["missing-shard"] = (p, {}, gone)
    p = copy("mistral", "truncated")
    shard = os.path.join(p, sorted(set(index.values()))[0])
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 64)
    cases["truncated"] = (p, {}, os.path.basename(shard))
    p = copy("llama-gqa", "corrupt")
    with open(os.path.join(p, "model.safetensors"), "r+b") as f:
        f.write(b"\xff" * 16)
    cases["corrupt"] = (p, {}, "model.safetensors")
    p = copy("llama-gqa", "missing-tensor")
    sd = load_file(os.path.join(p, "model.safetensors"))
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, os.path.join(p, "model.safetensors"), metadata={"format": "pt"})
    cases["missing-tensor"] = (p, {}, "model.layers.1.mlp.up_proj.weight")
    cases["wrong-shape"] = (good["llama-gqa"], {"intermediate_size": 96}, "model.layers.0.mlp.gate_proj.weight")
    p = copy("llama-gqa", "wrong-dtype")
    sd = load_file(os.path.join(p, "model.safetensors"))
    sd["model.norm.weight"] = sd["model.norm.weight"].to(torch.int64)
    save_file(sd, os.path.join(p, "model.safetensors"), metadata={"format": "pt"})
    cases["wrong-dtype"] = (p, {}, "model.norm.weight")
    os.makedirs(os.path.join(root, "empty"))
    cases["not-a-checkpoint"] = (os.path.join(root, "empty"), {}, "config.json")
    cases["no-such-path"] = (os.path.join(root, "nowhere"), {}, "nowhere")
    p = copy("llama-gqa", "bin-only")
    os.rename(os.path.join(p, "model.safetensors"), os.path.join(p, "pytorch_model.bin"))
    cases["bin-only"] = (p, {}, "save_pretrained")
    odd = save_tiny(root, "llama-gqa", folder="odd-vocab", vocab_size=130)     # 130 rows over Gy=4
    cases["grid-does-not-divide"] = (odd, {"plan": "hf"}, "vocabulary=130 is not divisible by Gy=4")
    three = save_tiny(root, "llama-gqa", folder="three-kv-heads", num_attention_heads=6, num_key_value_heads=3,
                      hidden_size=24, intermediate_size=48, vocab_size=96)    # SmolLM2's 9/3 heads in small
    cases["heads-do-not-divide-Gy"] = (three, {}, "q_proj head count (24 rows of head_dim 4)=6 is not divisible by "
                                                  "Gy=4 of grid 1x4x1x1; Gx must divide 24 and Gy must divide 3: "
                                                  "grids of 4 ranks that fit: 1x1x1x4, 1x1x2x2, 1x1x4x1, 2x1x1x2, "
                                                  "2x1x2x1, 4x1x1x1 (or plan={}: drop-in)")
    p = copy("qwen2-tied", "tied-with-a-head")                                 # config tied, files untied
    index = json.load(open(os.path.join(p, "model.safetensors.index.json")))["weight_map"]
    shard = os.path.join(p, index["model.embed_tokens.weight"])
    sd = load_file(shard)
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    save_file(sd, shard, metadata={"format": "pt"})
    index["lm_head.weight"] = os.path.basename(shard)
    json.dump({"metadata": {}, "weight_map": index}, open(os.path.join(p, "model.safetensors.index.json"), "w"))
    cases["tied-config-separate-head"] = (p, {}, "set \"tie_word_embeddings\": false")
    p = copy("qwen2-tied", "untied-without-a-head")                            # config untied, files tied
    cfg = json.load(open(os.path.join(p, "config.json")))
    json.dump({**cfg, "tie_word_embeddings": False}, open(os.path.join(p, "config.json"), "w"))
    cases["untied-config-no-head"] = (p, {}, "the files hold no lm_head.weight, only model.embed_tokens.weight (a tied "
                                             "checkpoint): set \"tie_word_embeddings\": true")
    return cases


def rank_bad_inputs(spec: str, cases: dict) -> dict[str, str]:
    from transformers import AutoConfig, AutoModelForCausalLM
    grid = axgrid.init(spec, timeout_s=60)
    try:
        out = {}
        for case, (path, kw, _) in cases.items():
            kw = dict(kw)
            if kw.get("plan") == "hf":          # an explicit TransformerPlan raises like the built-in one
                with torch.device("meta"):
                    meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
                kw["plan"] = axgrid.plans.hf_plan(meta)
            try:
                axgrid.from_pretrained(path, grid, **kw)
                out[case] = "no error"
            except ValueError as e:
                out[case] = f"{type(e).__name__}: {e}"
        return out
    finally:
        grid.destroy()


def test_bad_input_raises_one_line_on_every_rank(ranks, checkpoints, tmp_path):
    cases = _bad_checkpoints(str(tmp_path), checkpoints)
    results = ranks(4, rank_bad_inputs, "1x4x1x1", cases)
    for case, (_, _, must) in cases.items():
        msgs = {r[case] for r in results}
        assert len(msgs) == 1, (case, msgs)                   # the same error on every rank
        (msg,) = msgs
        assert must in msg and "\n" not in msg, (case, msg)
