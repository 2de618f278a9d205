"""experiments/train/finetune.py on a tiny local Llama (save_pretrained, no network), in-process on real gloo ranks:
a run interrupted by SIGUSR1 (SaveOnSignal) and resumed gives the uninterrupted run's losses step for step (the
interrupted part with its optimizer state sharded over d, ``--zero 1``, the rest resumed without); the
Goldfish loss over 4 ranks (d and z splits, micro-batches) equals one serial rank's, so it is normalised over the
global batch; the checkpoint's own tokenizer is used and the export loads back with from_pretrained; a model with
no built-in plan (a tied SmolLM3) fine-tunes drop-in, on 4 ranks as on one. Instruction fine-tuning on the shipped
conversations: the loss over 4 ranks covers only the assistant tokens and equals a serial computation of exactly
that; held-out loss and perplexity are logged before and after; a malformed chat line ends the run on every rank,
naming the file, the line and what is wrong, before anything is written."""
import json
import math
import os
import signal

import pytest

from helpers import load_script
from helpers.tiny_hf import tiny_llama

from axgrid.data import KJV_INSTRUCTIONS

pytest.importorskip("transformers")
COMMON = ["--seq", "16", "--batch", "8", "--microbatches", "2", "--lr", "1e-2", "--warmup", "1", "--timeout", "60"]


def _finetune():
    return load_script("train/finetune.py")


def rank_run(argv: list, signal_after: int = -1) -> dict:
    """main(argv); with ``signal_after`` >= 0, rank 0 sends itself SIGUSR1 after that step."""
    mod = _finetune()
    if signal_after >= 0:
        step_fn = mod.run_step

        def run_step(model, opt, grid, s, step, *batch, **kw):
            rec = step_fn(model, opt, grid, s, step, *batch, **kw)
            if step == signal_after and grid.rank == 0:
                os.kill(os.getpid(), signal.SIGUSR1)
            return rec
        mod.run_step = run_step
    return mod.main(argv)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {"bytes": tiny_llama(str(root / "bytes")),
            "bpe": tiny_llama(str(root / "bpe"), vocab=320, tokenizer=True),
            "chat": tiny_llama(str(root / "chat"), vocab=320, tokenizer=True, chat=True)}


def test_resume_after_a_signal_equals_the_uninterrupted_run(ranks, checkpoints, tmp_path):
    argv = ["--checkpoint", checkpoints["bytes"], "--grid", "1x2x1x2", "--steps", "4", "--recompute"] + COMMON
    whole = ranks(4, rank_run, argv)[0]
    ck, log = str(tmp_path / "ck"), str(tmp_path / "run.jsonl")
    first = ranks(4, rank_run, argv + ["--save", str(ck), "--log", log, "--zero", "1"], 1)[0]
    assert first["steps"] == 2 and first["exported"] is None          # stopped by the signal after step 1
    rest = ranks(4, rank_run, argv + ["--save", str(ck), "--resume", str(ck), "--log", log])[0]
    assert rest["start_step"] == 2
    assert first["losses"] + rest["losses"] == pytest.approx(whole["losses"], rel=1e-6, abs=1e-7)
    records = [json.loads(line) for line in open(log)]
    config = records[0]
    assert config["tokenizer"].startswith("byte-level fallback")
    steps = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2, 3]
    for key in ("loss", "lr", "tokens_per_s", "tflops", "grad_norm", "step_s"):
        assert all(key in r for r in steps), key
    assert steps[0]["lr"] < steps[1]["lr"] and steps[3]["lr"] < steps[1]["lr"]    # warm-up, then cosine decay


def test_goldfish_is_normalised_over_the_global_batch(ranks, checkpoints, tmp_path):
    argv = ["--checkpoint", checkpoints["bpe"], "--steps", "3", "--goldfish-k", "3", "--goldfish-h", "3"] + COMMON
    serial = ranks(1, rank_run, argv + ["--grid", "1x1x1x1"])[0]
    out = str(tmp_path / "export")
    log = str(tmp_path / "gf.jsonl")
    split = ranks(4, rank_run, argv + ["--grid", "1x1x2x2", "--export", out, "--log", log])
    assert split[0]["losses"] == pytest.approx(serial["losses"], rel=1e-5)
    assert all(r["losses"] == split[0]["losses"] for r in split)
    records = [json.loads(line) for line in open(log)]
    assert records[0]["tokenizer"] != "byte-level fallback (no tokenizer in checkpoint)"
    assert 0.6 < [r for r in records if r["event"] == "step"][0]["kept_fraction"] < 0.95
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == 320
    assert AutoTokenizer.from_pretrained(out)("In the beginning")["input_ids"]


def _tiny_smollm3(path: str) -> str:
    """A tiny tied SmolLM3 (Llama-shaped, no built-in plan in axgrid): it runs drop-in."""
    import torch
    from transformers import SmolLM3Config, SmolLM3ForCausalLM
    torch.manual_seed(0)
    cfg = SmolLM3Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    SmolLM3ForCausalLM(cfg).save_pretrained(path)
    return path


def test_a_model_without_a_plan_finetunes_drop_in(ranks, tmp_path):
    path = _tiny_smollm3(str(tmp_path / "smollm3"))
    argv = ["--checkpoint", path, "--steps", "3"] + COMMON
    serial = ranks(1, rank_run, argv + ["--grid", "1x1x1x1"])[0]
    out = str(tmp_path / "export")
    split = ranks(4, rank_run, argv + ["--grid", "2x1x2x1", "--export", out])     # the grid of the crash report
    assert split[0]["losses"] == pytest.approx(serial["losses"], rel=1e-5)
    assert split[0]["losses"][-1] < split[0]["losses"][0]
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_sft_loss_is_over_the_assistant_tokens_only_and_equals_a_serial_computation(ranks, checkpoints, tmp_path):
    import torch
    from torch.nn import functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from axgrid.data.chat import load_chat
    path = checkpoints["chat"]
    log = str(tmp_path / "sft.jsonl")
    argv = ["--checkpoint", path, "--chat-file", str(KJV_INSTRUCTIONS), "--grid", "1x1x2x2", "--steps", "2",
            "--log", log, "--heldout-rows", "8", "--sample-prompt", "Hi.", "--sample-tokens", "3"] + COMMON
    got = ranks(4, rank_run, argv)
    assert all(r["losses"] == got[0]["losses"] for r in got)
    # serially: the first global batch of the same rows, cross entropy over the assistant targets only
    tok = AutoTokenizer.from_pretrained(path)
    rows = load_chat(KJV_INSTRUCTIONS, tok, seq=16, layout="pack", heldout_frac=0.1, seed=0).train
    inputs, targets, mask = rows.batch(0, 8)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        per_token = F.cross_entropy(model(input_ids=inputs).logits.flatten(0, 1), targets.flatten(),
                                    reduction="none").view_as(mask)
    assistant_only = float((per_token * mask).sum() / mask.sum())
    every_token = float(per_token.mean())
    assert 0.05 < float(mask.mean()) < 0.95 and abs(assistant_only - every_token) > 1e-3
    assert got[0]["losses"][0] == pytest.approx(assistant_only, rel=1e-5)
    records = [json.loads(line) for line in open(log)]
    config, evals = records[0], [r for r in records if r["event"] == "eval"]
    assert config["data"] == "chat" and config["conversations"] == 339 and config["heldout_rows"] == 8
    steps = [r for r in records if r["event"] == "step"]
    assert steps[0]["kept_fraction"] == pytest.approx(float(mask.mean()), rel=1e-6)
    assert [e["step"] for e in evals] == [0, 2]                                 # before and after
    for e in evals:
        assert e["valid_ppl"] == pytest.approx(math.exp(e["valid_loss"]))
    summary = got[0]
    assert summary["valid_loss_before"] == pytest.approx(evals[0]["valid_loss"])
    assert summary["valid_loss"] == pytest.approx(evals[1]["valid_loss"])        # the last evaluation: after
    assert summary["valid_loss"] < summary["valid_loss_before"]                 # lr 1e-2 on a random model
    assert isinstance(summary["answer_before"], str) and isinstance(summary["answer_after"], str)
    held = load_chat(KJV_INSTRUCTIONS, tok, seq=16, layout="pack", heldout_frac=0.1, seed=0).heldout
    with torch.no_grad():
        hx, hy, hm = held.inputs[:8], held.targets[:8], held.mask[:8]
        ce = F.cross_entropy(model(input_ids=hx).logits.flatten(0, 1), hy.flatten(), reduction="none").view_as(hm)
    assert summary["valid_loss_before"] == pytest.approx(float((ce * hm).sum() / hm.sum()), rel=1e-5)
    assert evals[0]["valid_tokens"] == int(hm.sum())


def rank_bad_chat(argv: list) -> str:
    try:
        _finetune().main(argv)
    except SystemExit as e:
        return str(e)
    return "no error"


def test_a_malformed_chat_line_ends_the_run_on_every_rank_before_anything_is_written(ranks, checkpoints, tmp_path):
    bad = tmp_path / "chat.jsonl"
    lines = KJV_INSTRUCTIONS.read_text().splitlines()[:5]
    lines[3] = '{"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}]}'
    bad.write_text("\n".join(lines) + "\n")
    log, save = tmp_path / "run.jsonl", tmp_path / "ckpt"
    argv = ["--checkpoint", checkpoints["chat"], "--chat-file", str(bad), "--grid", "1x1x2x2", "--steps", "2",
            "--log", str(log), "--save", str(save), "--export", str(tmp_path / "out")] + COMMON
    for msg in ranks(4, rank_bad_chat, argv):
        assert msg == f"--chat-file {bad}:4: message 2 has role 'bot'; use one of system, user, assistant", msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl"]


def test_lora_finetune_on_conversations_matches_one_rank_and_exports_both_forms(ranks, checkpoints, tmp_path):
    """--lora-r with --chat-file: 4 ranks (zero=1) give one rank's losses; the adapter written to
    export/adapter loads with PEFT onto the base and gives the merged export's logits."""
    argv = ["--checkpoint", checkpoints["chat"], "--chat-file", str(KJV_INSTRUCTIONS), "--steps", "3",
            "--lora-r", "4", "--lora-targets", "q_proj,v_proj,down_proj"] + COMMON
    serial = ranks(1, rank_run, argv + ["--grid", "1x1x1x1"])[0]
    out = str(tmp_path / "export")
    split = ranks(4, rank_run, argv + ["--grid", "1x2x1x2", "--zero", "1", "--export", out])
    assert split[0]["losses"] == pytest.approx(serial["losses"], rel=1e-5)
    assert split[0]["losses"][-1] < split[0]["losses"][0]
    import peft
    import torch
    from transformers import AutoModelForCausalLM
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    adapted = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(checkpoints["chat"]),
                                             os.path.join(out, "adapter")).eval()
    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (merged(input_ids=ids).logits - adapted(input_ids=ids).logits).abs().max() < 1e-4


def rank_refusal(argv: list) -> str:
    try:
        _finetune().main(argv)
    except SystemExit as e:
        return str(e)
    return "no error"


def test_instruction_finetuning_under_context_parallelism_equals_one_rank(ranks, checkpoints, tmp_path):
    """--cp 2: each packed row's chunks on two z-ranks (the loss over the assistant tokens of whole rows), beside
    data parallelism: the losses and the held-out loss before and after equal one rank's; a sequence that does not
    cut into 2·cp chunks is refused on every rank alike, in one line, before the grid."""
    argv = ["--checkpoint", checkpoints["chat"], "--chat-file", str(KJV_INSTRUCTIONS), "--steps", "2",
            "--heldout-rows", "4"] + COMMON
    serial = ranks(1, rank_run, argv + ["--grid", "1x1x1x1"])[0]
    log = str(tmp_path / "cp.jsonl")
    split = ranks(4, rank_run, argv + ["--grid", "1x1x2x2", "--cp", "2", "--log", log])
    assert all(r["losses"] == split[0]["losses"] for r in split)
    assert split[0]["losses"] == pytest.approx(serial["losses"], rel=1e-5)
    for key in ("valid_loss_before", "valid_loss"):
        assert split[0][key] == pytest.approx(serial[key], rel=1e-5), key
    records = [json.loads(line) for line in open(log)]
    assert records[0]["cp"] == 2 and "c" in [r for r in records if r["event"] == "step"][0]["comm_bytes"]
    msgs = ranks(2, rank_refusal, argv + ["--grid", "1x1x2x1", "--cp", "2", "--seq", "14"])
    assert all(m.startswith("--seq 14 with --cp 2: sequence length 14 does not cut into 2·cp = 4") and "12, 16" in m
               and "\n" not in m for m in msgs), msgs
