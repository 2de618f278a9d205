"""train_gpt and finetune on a preprocessed corpus, in-process on real gloo ranks: a run saved on one grid and
resumed on another sees the samples of an uninterrupted run (the checkpoint holds the data position) and gives its
losses; validation loss and perplexity become eval rows, TensorBoard scalars and report.py columns; bad data stops
every rank with one line before training; memorization takes its held-out text from the validation split."""
import io
import json
import math

import pytest

from axgrid.data.preprocess import PreprocessSettings, Progress, preprocess
from helpers import load_script
from helpers.corpus import kjv_chapters, random_dataset, write_jsonl

COMMON = ["--model", "gpt-tiny", "--hidden", "32", "--heads", "2", "--seq", "16", "--batch", "8", "--microbatches",
          "2", "--lr", "3e-3", "--no-progress", "--split", "90,10,0", "--eval-interval", "2", "--eval-iters", "2"]


@pytest.fixture(scope="module")
def kjv(tmp_path_factory):
    root = tmp_path_factory.mktemp("kjv")
    path = write_jsonl(root / "kjv.jsonl", kjv_chapters())
    preprocess(PreprocessSettings([path], str(root / "kjv")), Progress(io.StringIO(), bar=False, every_s=0))
    return str(root / "kjv")


def rank_train(argv: list) -> dict:
    return load_script("train/train_gpt.py").main(argv)


def rank_error(argv: list) -> str:
    try:
        load_script("train/train_gpt.py").main(argv)
    except SystemExit as e:
        return str(e)
    return "no error"


def test_resumed_on_another_grid_sees_the_uninterrupted_runs_samples(ranks, kjv, tmp_path):
    data = ["--data-path", "0.5", kjv, "0.5", kjv + "_b"]
    random_dataset(kjv + "_b", docs=80, vocab=256, max_len=200, seed=3)
    whole = ranks(4, rank_train, COMMON + data + ["--grid", "1x1x2x2", "--steps", "4"])[0]
    ck, log = str(tmp_path / "ck"), str(tmp_path / "run.jsonl")
    first = ranks(2, rank_train, COMMON + data + ["--grid", "1x2x1x1", "--steps", "4", "--save", ck, "--save-every",
                                                   "2", "--log", log])
    assert first[0]["losses"] == pytest.approx(whole["losses"], rel=1e-4)
    manifest = json.load(open(f"{ck}/step-00000002/manifest.json"))
    assert manifest["extra"]["data"] == {"consumed_samples": 16}
    rest = ranks(4, rank_train, COMMON + data + ["--grid", "1x1x2x2", "--steps", "4", "--resume",
                                                  f"{ck}/step-00000002"])
    assert first[0]["losses"][:2] + rest[0]["losses"] == pytest.approx(whole["losses"], rel=1e-4)
    assert rest[0]["valid_loss"] == pytest.approx(whole["valid_loss"], rel=1e-4)
    rows = [json.loads(line) for line in open(log)]
    evals = [r for r in rows if r["event"] == "eval"]
    assert [e["step"] for e in evals] == [2, 4]
    assert evals[1]["valid_ppl"] == pytest.approx(math.exp(evals[1]["valid_loss"]))
    assert evals[1]["valid_loss"] == pytest.approx(whole["valid_loss"], rel=1e-4)
    report = load_script("plots/report.py").main([log, "--out", str(tmp_path / "report")])
    assert report[0]["valid_loss"] == pytest.approx(evals[1]["valid_loss"])
    assert "valid loss" in (tmp_path / "report" / "report.md").read_text()


def test_validation_goes_to_tensorboard(ranks, kjv, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tb = str(tmp_path / "tb")
    ranks(1, rank_train, COMMON + ["--data-path", kjv, "--steps", "2", "--tensorboard", tb])
    acc = EventAccumulator(tb)
    acc.Reload()
    assert {"valid/loss", "valid/ppl"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("valid/loss")] == [2]


def test_bad_data_stops_every_rank_with_one_line(ranks, kjv, tmp_path):
    import shutil
    for ext in (".idx", ".bin"):
        shutil.copy(kjv + ext, str(tmp_path / "short") + ext)
    with open(tmp_path / "short.bin", "r+b") as f:
        f.truncate(1000)
    random_dataset(tmp_path / "big", docs=50, vocab=300)
    cases = {"missing": (["--data-path", str(tmp_path / "nothing")], "nothing.idx does not exist"),
             "short": (["--data-path", str(tmp_path / "short")], "short.bin is 1000 bytes but"),
             "vocab": (["--data-path", str(tmp_path / "big")], "token id 299 >= the model's vocabulary 256"),
             "weights": (["--data-path", "0.5", kjv, "half", kjv], "weight 'half' (word 3) does not parse"),
             "split": (["--data-path", kjv, "--split", "90,x,0"], "--split 90,x,0:")}
    for name, (argv, want) in cases.items():
        msgs = ranks(2, rank_error, COMMON + argv + ["--grid", "1x1x1x2", "--steps", "1"])
        assert len(set(msgs)) == 1 and want in msgs[0] and "\n" not in msgs[0], (name, msgs)


def rank_finetune(argv: list) -> dict:
    return load_script("train/finetune.py").main(argv)


def test_finetune_on_a_corpus_with_validation(ranks, tmp_path):
    pytest.importorskip("transformers")
    from helpers.tiny_hf import tiny_llama
    folder = tiny_llama(str(tmp_path / "hf"), vocab=320, tokenizer=True)
    path = write_jsonl(tmp_path / "k.jsonl", kjv_chapters()[:40])
    preprocess(PreprocessSettings([path], str(tmp_path / "k"), tokenizer=folder),
               Progress(io.StringIO(), bar=False, every_s=0))
    out = ranks(2, rank_finetune, ["--checkpoint", folder, "--data-path", str(tmp_path / "k"), "--split", "80,20,0",
                                   "--seq", "16", "--batch", "4", "--steps", "2", "--eval-interval", "1",
                                   "--eval-iters", "1", "--grid", "1x2x1x1", "--no-progress", "--lr", "1e-3"])
    assert out[0]["valid_loss"] == out[1]["valid_loss"] and 0 < out[0]["valid_loss"] < 10
    assert len(out[0]["losses"]) == 2


def test_memorization_holds_out_the_validation_split(kjv, tmp_path):
    from axgrid.data import DataSettings, split_tokens
    mod = load_script("train/memorization.py")
    args = mod.parse_args(["--out", str(tmp_path / "x"), "--data-path", kjv, "--split", "90,10,0", "--passages", "8", "--batch",
                           "6", "--other", "2", "--heldout", "4", "--epochs", "2", "--warmup", "2"])
    mod.check_args(args)
    text = mod._text(args, None)
    length = args.prompt + args.continuation
    valid = split_tokens(DataSettings((kjv,), "90,10,0"), "valid", 4 * length + 1)
    train = split_tokens(DataSettings((kjv,), "90,10,0"), "train", 8 * length)
    assert text.heldout.tolist() == valid.tolist()
    assert text.passages.reshape(-1).tolist() == train.tolist()
