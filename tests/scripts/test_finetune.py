"""experiments/train/finetune.py on a tiny local Llama (save_pretrained, no network), in-process on real gloo ranks:
a run interrupted by SIGUSR1 (SaveOnSignal) and resumed gives the uninterrupted run's losses step for step (the
interrupted part with its optimizer state sharded over d, ``--zero 1``, the rest resumed without); the
Goldfish loss over 4 ranks (d and z splits, micro-batches) equals one serial rank's, so it is normalised over the
global batch; the checkpoint's own tokenizer is used and the export loads back with from_pretrained."""
import json
import os
import signal

import pytest

from helpers import load_script
from helpers.tiny_hf import tiny_llama

pytest.importorskip("transformers")
COMMON = ["--seq", "16", "--batch", "8", "--microbatches", "2", "--lr", "1e-2", "--warmup", "1", "--timeout", "60"]


def _finetune():
    return load_script("train/finetune.py")


def rank_run(argv: list, signal_after: int = -1) -> dict:
    """main(argv); with ``signal_after`` >= 0, rank 0 sends itself SIGUSR1 after that step."""
    mod = _finetune()
    if signal_after >= 0:
        step_fn = mod.run_step

        def run_step(model, opt, grid, s, step, *batch):
            rec = step_fn(model, opt, grid, s, step, *batch)
            if step == signal_after and grid.rank == 0:
                os.kill(os.getpid(), signal.SIGUSR1)
            return rec
        mod.run_step = run_step
    return mod.main(argv)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {"bytes": tiny_llama(str(root / "bytes")),
            "bpe": tiny_llama(str(root / "bpe"), vocab=320, tokenizer=True)}


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
    assert 0.6 < records[1]["kept_fraction"] < 0.95
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == 320
    assert AutoTokenizer.from_pretrained(out)("In the beginning")["input_ids"]
