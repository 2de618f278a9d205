"""experiments/train/train_gpt.py, called in-process through main(argv) on real gloo ranks: the same run (micro-batches,
data parallelism, goldfish, recompute, clipping, AdamW) gives the same losses on different grids and on one rank (also
with the optimizer state and gradients sharded over d, ``--zero 2``), writes the JSON-lines log, refuses a batch
that does not split into whole sequences per rank and ``--zero`` without data parallelism, and keeps --keep N
checkpoints (never the one it resumed from)."""
import json

import pytest

from helpers import load_script

COMMON = ["--model", "gpt-tiny", "--hidden", "48", "--heads", "4", "--seq", "16", "--data", "text", "--steps", "3",
          "--batch", "8", "--microbatches", "2", "--goldfish-k", "3", "--goldfish-h", "4", "--recompute",
          "--no-progress", "--lr", "3e-3"]


def _train_gpt():
    return load_script("train/train_gpt.py")


def rank_run(argv: list) -> dict:
    return _train_gpt().main(argv)


def rank_bad_batch(argv: list) -> str:
    try:
        _train_gpt().main(argv)
    except SystemExit as e:
        return str(e)
    return "no error"


def test_train_gpt_same_losses_on_every_grid(ranks, tmp_path):
    log = str(tmp_path / "run.jsonl")
    ref = ranks(1, rank_run, COMMON + ["--grid", "1x1x1x1"])[0]
    a = ranks(4, rank_run, COMMON + ["--grid", "1x2x2x1", "--log", log])
    b = ranks(4, rank_run, COMMON + ["--grid", "2x1x1x2"])
    c = ranks(4, rank_run, COMMON + ["--grid", "1x1x1x4", "--zero", "2", "--overlap", "all"])
    for run in (a[0], b[0], c[0]):
        assert run["losses"] == pytest.approx(ref["losses"], rel=1e-4)
    assert all(r["losses"] == a[0]["losses"] for r in a)       # every rank reports the same losses
    records = [json.loads(line) for line in open(log)]
    assert [r["event"] for r in records] == ["config", "step", "step", "step", "summary"]
    step = records[1]
    for key in ("loss", "step_s", "tokens_per_s", "tflops", "mfu", "peak_mem_bytes", "comm_bytes", "comm_s",
                "energy_j", "energy_source", "lr", "kept_fraction"):
        assert key in step, key
    assert set(step["comm_bytes"]) >= {"y", "z"} and "x" not in step["comm_bytes"]   # grid 1x2x2x1: Gx = 1
    assert 0.5 < step["kept_fraction"] < 0.9
    assert records[0]["flop_formula"].startswith("96*")       # recompute on


def test_train_gpt_rejects_a_batch_that_does_not_split(ranks):
    msgs = ranks(4, rank_bad_batch, COMMON[:-4] + ["--grid", "1x1x2x2", "--batch", "6", "--microbatches", "1"])
    assert all("not divisible by Gd*Gz = 2*2" in m for m in msgs)
    msgs = ranks(4, rank_bad_batch, COMMON + ["--grid", "2x2x1x1", "--zero", "1"])
    assert all(m.startswith("--zero 1 with grid 2x2x1x1: Gd = 1") and "\n" not in m for m in msgs)


def test_train_gpt_under_context_parallelism_gives_the_same_losses(ranks, tmp_path):
    """--cp 2 (each sequence over two z-ranks, in chunks) and --cp 4 (keys and values around a ring) trains as one
    rank does, and its checkpoint resumes without context parallelism; bad sizes are refused
    before step 0 in one line naming what works."""
    ref = ranks(1, rank_run, COMMON + ["--grid", "1x1x1x1"])[0]
    log, ck = str(tmp_path / "cp.jsonl"), str(tmp_path / "ck")
    two = ranks(2, rank_run, COMMON + ["--grid", "1x1x2x1", "--cp", "2", "--log", log, "--save", ck,
                                       "--save-every", "1"])
    four = ranks(4, rank_run, COMMON + ["--grid", "1x1x4x1", "--cp", "4", "--overlap", "all", "--cp-exchange", "ring"])
    for run in (two[0], four[0]):
        assert run["losses"] == pytest.approx(ref["losses"], rel=1e-4)
    # the parameters' layout does not depend on cp: a checkpoint saved under --cp 2 resumes on one rank
    resumed = ranks(1, rank_run, COMMON + ["--grid", "1x1x1x1", "--resume", f"{ck}/step-00000002"])[0]
    assert resumed["losses"] == pytest.approx(ref["losses"][2:], rel=1e-4)
    records = [json.loads(line) for line in open(log)]
    assert records[0]["cp"] == 2 and "c" in records[1]["comm_bytes"]      # keys and values went over the group
    msgs = ranks(2, rank_bad_batch, COMMON + ["--grid", "1x1x2x1", "--cp", "2", "--seq", "18"])
    assert all(m.startswith("--seq 18 with --cp 2: sequence length 18 does not cut into 2·cp = 4") and "16, 20" in m
               and "\n" not in m for m in msgs), msgs
    msgs = ranks(2, rank_bad_batch, COMMON + ["--grid", "1x1x1x2", "--cp", "2"])
    assert all(m.startswith("--cp 2 with grid 1x1x1x2: a sequence is split over the z-ranks, so --cp must divide Gz = 1") and "[1]" in m
               for m in msgs), msgs


def test_keep_n_checkpoints_but_never_the_one_resumed_from(ranks, tmp_path):
    """--keep N deletes all but the newest N after each save, except the checkpoint --resume named (rank 0)."""
    import os
    ck = str(tmp_path / "ck")
    tiny = COMMON[:-4] + ["--grid", "1x1x1x1", "--save", ck, "--save-every", "1"]
    names = lambda: sorted(n for n in os.listdir(ck) if n.startswith("step-"))   # noqa: E731
    ranks(1, rank_run, tiny + ["--keep", "0"])                                    # 3 steps, all kept
    assert names() == ["step-00000001", "step-00000002", "step-00000003"]
    first = os.path.join(ck, "step-00000001")
    ranks(1, rank_run, tiny + ["--keep", "1", "--steps", "5", "--resume", first, "--allow-config-change", "steps"])
    assert names() == ["step-00000001", "step-00000005"]
    assert rank_bad_batch(tiny + ["--keep", "-1"]).startswith("--keep -1: the number of checkpoints to keep")
