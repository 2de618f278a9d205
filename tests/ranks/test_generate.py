"""axgrid.generate: greedy decoding equals the dense model's (a plain loop for axgrid's GPT, Hugging Face
``generate(do_sample=False)`` for Llama/Mistral/Qwen2) token for token on every grid of 4 ranks, cached and
uncached, and so does it for a tied Llama, Qwen3, Gemma 3 and Phi-3 under their plans and for drop-in models;
sampling picks the same tokens on every rank, reproducibly, within the top-k (drop-in: the planned model's draws);
EOS stops and pads as Hugging Face does, and with no EOS or pad id given both come from the model's generation
config (a saved folder's generation_config.json through axgrid.from_pretrained) as in Hugging Face's own
``generate``, whose output (shape included: it ends when every sequence has stopped) the default call equals; bad
input raises on every rank before any collective (the ledger is untouched); a batch that does not split over the grid is padded and only its rows come back."""
from __future__ import annotations

import importlib.util
import warnings

import pytest

from helpers import slow_where
import torch

import axgrid
from axgrid.spec.layout import all_shapes
from axgrid.models import GPT, GPTConfig, KVCache
from axgrid.spec import TransformerShape

HAS_HF = importlib.util.find_spec("transformers") is not None
CFG = GPTConfig(TransformerShape("test", layers=2, hidden=32, heads=4, seq=32, vocab=128), seed=3)
HF_KINDS = ("llama-gqa", "mistral", "qwen2") if HAS_HF else ()
KINDS = ("gpt", *HF_KINDS)
B, S, NEW = 4, 5, 5


def prompts(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, CFG.shape.vocab, (B, S), generator=torch.Generator().manual_seed(seed))


#: Planned beyond the LLaMA family (tied, q/k norms, Gemma's norms and scaled embedding, fused rows), and drop-in:
#: a Llama given plan={}, and GPT-2 (no plan: Conv1D layers and a tied head, all dense).
FAMILY_KINDS = ("llama-tied", "qwen3", "gemma3", "phi3") if HAS_HF else ()
DROP_IN_KINDS = ("llama-drop-in", "gpt2") if HAS_HF else ()


def build(kind: str, grid):
    """The model ``kind`` on ``grid`` (parallel) or dense (``grid=None``), the same weights either way."""
    if kind == "gpt":
        return GPT(CFG, grid)
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=32,
                                           bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                           attn_pdrop=0.0))
    else:
        from test_hf_plans import tiny            # the tiny random Hugging Face configurations of the plan tests
        model = tiny("llama-gqa" if kind == "llama-drop-in" else kind)
    if grid is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # GPT-2: no plan, runs drop-in (warned)
            axgrid.parallelize(model, grid, plan={} if kind == "llama-drop-in" else None)
    return model


def dense_greedy(kind: str, ids: torch.Tensor, new: int, eos=None, pad: int = 0) -> torch.Tensor:
    """The dense reference: HF ``generate`` (padded to ``new`` tokens) or a plain argmax loop for the GPT."""
    model = build(kind, None)
    with torch.no_grad():
        if kind != "gpt":
            model.generation_config.eos_token_id = eos
            out = model.generate(ids, do_sample=False, max_new_tokens=new, eos_token_id=eos, pad_token_id=pad)
            return torch.nn.functional.pad(out, (0, ids.shape[1] + new - out.shape[1]), value=pad)
        for _ in range(new):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids


@pytest.fixture(scope="module")
def greedy_refs() -> dict[str, torch.Tensor]:
    return {k: dense_greedy(k, prompts(), NEW) for k in KINDS}


@pytest.fixture(scope="module")
def family_greedy_refs() -> dict[str, torch.Tensor]:
    """The dense references of the other families and the drop-in models, decoded once for every grid."""
    return {k: dense_greedy(k, prompts(), NEW) for k in FAMILY_KINDS + DROP_IN_KINDS}


def test_gpt_cache_equals_the_full_forward():
    """Prefill, then one token at a time and a chunk of two (the offset causal mask): the logits of the whole
    sequence run at once."""
    model, ids = GPT(CFG, None), prompts()
    with torch.no_grad():
        full = model(ids)
        cache = KVCache(CFG.shape.layers)
        parts = [model(ids[:, :2], cache=cache), model(ids[:, 2:3], cache=cache), model(ids[:, 3:], cache=cache)]
    assert cache.length == S
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="exceeds the model's seq=32"):
        model(torch.zeros(B, 28, dtype=torch.long), cache=cache)


def rank_greedy(spec: str, kinds: tuple[str, ...]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        out = {}
        for kind in kinds:
            model = build(kind, grid)
            grid.ledger.reset()
            out[kind] = (axgrid.generate(model, prompts(), grid, NEW),
                         axgrid.generate(model, prompts(), grid, NEW, use_cache=False))
            if kind == "gpt":       # the only gathers over y are the argmax's [b, 2] (value, index) per step
                gy, b = grid.size("y"), B // grid.size("zd")
                gathered = grid.ledger.entries.get(("y", "all_gather"))
                assert (gathered.bytes if gathered else 0) == (2 * NEW * gy * b * 2 * 8 if gy > 1 else 0)
        return out
    finally:
        grid.destroy()


@pytest.mark.parametrize("spec", slow_where([str(s) for s in all_shapes(4)], lambda s: s != "1x2x2x1"))
def test_greedy_equals_dense_on_every_4_rank_grid(ranks, greedy_refs, spec):
    for rank, got in enumerate(ranks(4, rank_greedy, spec, KINDS)):
        for kind, (cached, uncached) in got.items():
            assert torch.equal(cached, greedy_refs[kind]), (spec, rank, kind, cached, greedy_refs[kind])
            assert torch.equal(uncached, greedy_refs[kind]), (spec, rank, kind, uncached, greedy_refs[kind])


@pytest.mark.parametrize("spec", slow_where(["1x2x2x1", "2x1x1x2", "1x4x1x1"], lambda s: True))   # fast: from_pretrained's
def test_other_families_and_drop_in_greedy_equals_dense(ranks, family_greedy_refs, spec):
    kinds, want = FAMILY_KINDS + DROP_IN_KINDS, family_greedy_refs
    for rank, got in enumerate(ranks(4, rank_greedy, spec, kinds)):
        for kind, (cached, uncached) in got.items():
            assert torch.equal(cached, want[kind]) and torch.equal(uncached, want[kind]), (spec, rank, kind)


def rank_drop_in_sampling(spec: str) -> dict:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        return {kind: axgrid.generate(build(kind, grid), prompts(), grid, NEW, temperature=1.5, top_k=4, seed=5)
                for kind in ("llama-drop-in", "llama-gqa")}
    finally:
        grid.destroy()


def test_drop_in_sampling_picks_the_planned_models_tokens(ranks):
    """The same weights drop-in (full logits on every rank) and planned (vocabulary over y): the same draws."""
    for got in ranks(4, rank_drop_in_sampling, "1x2x2x1"):
        assert torch.equal(got["llama-drop-in"], got["llama-gqa"]), got


def vocab_selection_on_ties(grid) -> bool:
    """The vocabulary-parallel argmax and k-th largest value equal torch's on the whole row, ties included
    (across y slices, inside one, a constant row)."""
    from axgrid.generation.select import vocab_parallel_argmax, vocab_parallel_top_k_floor
    v_loc, gy, y = 4, grid.size("y"), grid.index("y")
    full = torch.randn(4, v_loc * gy, generator=torch.Generator().manual_seed(1))
    full[0, [1, v_loc * gy - 1]] = 9.0                    # tie between the first and the last slice
    full[1, [v_loc * (gy - 1) + 1, v_loc * (gy - 1) + 3]] = 9.0   # tie inside the last slice
    full[2] = 0.5                                         # a constant row
    mine = full[:, y * v_loc:(y + 1) * v_loc]
    ok = torch.equal(vocab_parallel_argmax(mine, grid), full.argmax(-1))
    for k in (1, 3, v_loc + 1, 100):
        want = full.topk(min(k, full.shape[-1]), dim=-1).values[:, -1:]
        ok &= torch.equal(vocab_parallel_top_k_floor(mine, k, grid), want)
    return ok


def rank_sampling(spec: str, kinds: tuple[str, ...]) -> dict[str, dict[str, torch.Tensor]]:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        out = {"ties": vocab_selection_on_ties(grid)}
        for kind in kinds:
            model = build(kind, grid)
            run = lambda **kw: axgrid.generate(model, prompts(), grid, NEW, temperature=1.5, **kw)  # noqa: E731
            out[kind] = {"top_k": run(top_k=4, seed=5), "again": run(top_k=4, seed=5), "seed6": run(top_k=4, seed=6),
                         "all": run(seed=5), "top_1": run(top_k=1, seed=7)}
        return out
    finally:
        grid.destroy()


@pytest.mark.slow
def test_sampling_same_on_every_rank_reproducible_and_within_top_k(ranks, greedy_refs):
    kinds = KINDS[:2]
    by_grid = [ranks(4, rank_sampling, spec, kinds) for spec in ("1x2x2x1", "2x1x1x2")]
    assert all(r["ties"] for results in by_grid for r in results)
    for kind in kinds:
        first = by_grid[0][0][kind]
        for results in by_grid:                  # every rank of both grids: the same tokens (noise is per batch)
            for r in results:
                assert all(torch.equal(r[kind][k], first[k]) for k in first), (kind, r[kind], first)
        assert torch.equal(first["top_k"], first["again"])
        assert not torch.equal(first["top_k"], first["seed6"]) and not torch.equal(first["top_k"], first["all"])
        assert torch.equal(first["top_1"], greedy_refs[kind])       # top-1 sampling is greedy
        dense = build(kind, None)
        with torch.no_grad():
            logits = dense(first["top_k"]).logits if kind != "gpt" else dense(first["top_k"])
        picked = first["top_k"][:, S:]                                # each new token among the 4 largest logits
        rank_of = (logits[:, S - 1:-1] > logits[:, S - 1:-1].gather(-1, picked.unsqueeze(-1))).sum(-1)
        assert int(rank_of.max()) < 4, rank_of


def rank_eos(spec: str, kinds: tuple[str, ...], eos: dict[str, int], pad: int) -> dict[str, torch.Tensor]:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        out = {k: axgrid.generate(build(k, grid), prompts(), grid, NEW, eos_token_id=eos[k], pad_token_id=pad)
               for k in kinds}
        model, calls = GPT(CFG, grid), []
        for kw in (dict(max_new_tokens=1), dict(max_new_tokens=NEW, eos_token_id=range(CFG.shape.vocab))):
            grid.ledger.reset()                      # every id an EOS: all stop after one token, no second step
            out["every id"] = axgrid.generate(model, prompts(), grid, pad_token_id=pad, **kw)
            calls.append({k: e.calls for k, e in grid.ledger.entries.items()})
        out["same collectives as one step"] = calls[0] == calls[1]
        return out
    finally:
        grid.destroy()


def test_eos_stops_a_sequence_and_pads_after_it(ranks, greedy_refs):
    """EOS = the second new token of sequence 0: it stops there (others where they meet it); the same as
    Hugging Face ``generate`` with that EOS, and as the greedy reference cut after the first EOS."""
    kinds, pad = KINDS[:2], 127
    eos = {k: int(greedy_refs[k][0, S + 1]) for k in kinds}
    for got in ranks(4, rank_eos, "1x1x2x2", kinds, eos, pad):
        for kind in kinds:
            want = greedy_refs[kind].clone()
            for row in want:
                hits = (row[S:] == eos[kind]).nonzero()
                if len(hits):
                    row[S + int(hits[0]) + 1:] = pad
            assert torch.equal(got[kind], want), (kind, got[kind], want)
            assert (got[kind][0, S + 2:] == pad).all()
            if kind != "gpt":
                assert torch.equal(got[kind], dense_greedy(kind, prompts(), NEW, eos=eos[kind], pad=pad))
        assert torch.equal(got["every id"][:, :S + 1], greedy_refs["gpt"][:, :S + 1])
        assert (got["every id"][:, S + 1:] == pad).all()
        assert got["same collectives as one step"]


#: The saved folder's generation config: EOS ids the greedy decoding of ``prompts()`` meets after 2, 2, 2 and 4 new
#: tokens (so the data-parallel rank of rows 0-1 stops first and the output ends after 4), and a pad id; config.json
#: keeps Llama's EOS 2, which that decoding never meets.
SAVED_EOS, SAVED_PAD = [95, 102, 18], 127


def rank_default_special_tokens(spec: str, path: str) -> dict[str, torch.Tensor]:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        model = axgrid.from_pretrained(path, grid)
        return {"default": axgrid.generate(model, prompts(), grid, NEW),
                "never stop": axgrid.generate(model, prompts(), grid, NEW, eos_token_id=[])}
    finally:
        grid.destroy()


def test_default_eos_and_pad_come_from_the_generation_config_as_in_transformers(ranks, greedy_refs, tmp_path):
    """A tiny Llama saved with a generation_config.json of its own: ``axgrid.generate`` given no ids returns what
    transformers' ``generate`` given none returns for the same folder, shape included."""
    from transformers import AutoModelForCausalLM
    model = build("llama-gqa", None)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = SAVED_EOS, SAVED_PAD
    model.save_pretrained(tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path).generate(prompts(), max_new_tokens=NEW, do_sample=False)
    assert ref.shape == (B, S + 4) and (ref[:3, S + 2:] == SAVED_PAD).all()     # the case meant: stops, pads, ends
    for got in ranks(4, rank_default_special_tokens, "1x1x2x2", str(tmp_path)):
        assert got["default"].shape == ref.shape and torch.equal(got["default"], ref), (got["default"], ref)
        assert torch.equal(got["never stop"], greedy_refs["llama-gqa"])


def rank_bad_input(spec: str) -> list[str]:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        model, ids = GPT(CFG, grid), prompts()
        cases = [dict(max_new_tokens=-1), dict(input_ids=ids.float()),
                 dict(input_ids=ids + CFG.shape.vocab), dict(temperature=-1.0), dict(top_k=0), dict(eos_token_id=CFG.shape.vocab),
                 dict(max_new_tokens=CFG.shape.seq), dict(model=torch.nn.Linear(4, 4)), dict(model=GPT(CFG, None))]
        messages = []
        before = grid.ledger.snapshot()
        for case in cases:
            args = {"model": model, "input_ids": ids, "max_new_tokens": 2, **case}
            try:
                axgrid.generate(args.pop("model"), args.pop("input_ids"), grid, args.pop("max_new_tokens"), **args)
                messages.append("no error")
            except ValueError as e:
                messages.append(str(e))
        assert grid.ledger.snapshot() == before, "a collective was posted before the error"
        try:                                          # a rank given other prompts: every rank raises
            axgrid.generate(model, prompts(seed=grid.rank % 2), grid, 1)
            messages.append("no error")
        except ValueError as e:
            messages.append(str(e))
        whole = axgrid.generate(model, ids, grid, 2)                         # nothing left half-posted
        # a batch that does not split over Gd*Gz is padded, and only its own rows come back
        messages += [f"padded {n}: {torch.equal(axgrid.generate(model, ids[:n], grid, 2), whole[:n])}" for n in (1, 3)]
        return messages
    finally:
        grid.destroy()


def test_bad_input_raises_a_clear_error_before_any_collective(ranks):
    want = ["max_new_tokens=-1 must be an integer >= 0", "must be integer token ids", "outside the vocabulary [0, 128)",
            "temperature=-1.0 must be",
            "top_k=0 must be an integer >= 1", "eos_token_id=128 must be a token id", "exceeds the model's seq=32",
            "Linear is not a model it supports", "built on another grid (or serial", "were given different input_ids",
            "padded 1: True", "padded 3: True"]
    for messages in ranks(4, rank_bad_input, "1x1x2x2"):
        assert len(messages) == len(want)
        for expected, got in zip(want, messages):
            assert expected in got, (expected, got)
