"""Command lines answer bad input with one clear line (and a non-zero exit), never a traceback: ``axgrid describe``,
``python -m axgrid.kernels tune``, ``experiments/train/train_gpt.py``; a 0-d input to a parallel Linear fails before any
collective, on every rank."""
import os
import subprocess
import sys

import pytest
import torch

import axgrid

from helpers import ROOT, load_script

TRAIN_GPT = str(ROOT / "experiments" / "train" / "train_gpt.py")


@pytest.mark.parametrize("argv,msg", [
    (["describe", "2x2x3x1", "--world", "8"], "has 12 ranks but the world size is 8"),
    (["describe", "2x2x1x1", "--order", "xyzq"], "must be a permutation of the letters 'xyzd'"),
    (["describe", "2x0x1x1"], "gy=0 is invalid"),
    (["describe", "2x2x1x1", "--gpus-per-node", "0"], "--gpus-per-node 0 must be >= 1"),
])
def test_describe_bad_grid_is_one_line(capsys, argv, msg):
    from axgrid.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("axgrid describe: ") and msg in err and err.count("\n") == 1, err


def rank_scalar_input() -> list[str]:
    grid = axgrid.init("2x1x1x1", timeout_s=30)
    try:
        layer = axgrid.nn.Linear(4, 6)
        try:
            layer(torch.tensor(1.0))
            msg = "no error"
        except ValueError as e:
            msg = str(e)
        after = grid.comm.all_reduce(torch.ones(2), "x")     # nothing was posted: the ranks are still in step
        return [msg, str(after.tolist())]
    finally:
        grid.destroy()


def test_zero_dim_input_to_linear(ranks):
    for msg, after in ranks(2, rank_scalar_input):
        assert "got a 0-d tensor" in msg and "[..., 4]" in msg and after == "[2.0, 2.0]", msg


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_kernels_tune_on_cuda_without_gpu(capsys, tmp_path):
    from axgrid.kernels.cli import main
    argv = ["tune", "--model", "gpt-tiny", "--grid", "1x1x1x1", "--cache", str(tmp_path / "g.json"), "--device"]
    assert main(argv + ["cuda"]) == 2
    assert "no CUDA GPU is visible here" in capsys.readouterr().err
    assert main(argv + ["tpu"]) == 2
    assert "use cpu, cuda or cuda:N" in capsys.readouterr().err
    assert not (tmp_path / "g.json").exists()


def _train_gpt_main():
    return load_script("train/train_gpt.py").main


@pytest.mark.parametrize("argv,msg", [
    (["--overlap", "bogus"], "--overlap bogus: unknown overlap switch(es) ['bogus']"),
    (["--timeout", "0"], "--timeout 0.0: the seconds a stuck collective may take must be a number > 0"),
    (["--timeout", "nan"], "--timeout nan"),
    (["--data", "text", "--text-file", "/nonexistent/corpus.txt"], "--text-file /nonexistent/corpus.txt does not exist"),
    (["--resume", "/nonexistent/ckpt"], "--resume /nonexistent/ckpt: no checkpoint there (the path does not exist)"),
])
def test_train_gpt_bad_arguments(argv, msg):
    """Checked before the grid is built (so in this process, with no ranks)."""
    with pytest.raises(SystemExit) as e:
        _train_gpt_main()(argv + ["--steps", "1"])
    assert msg in str(e.value), str(e.value)


def test_train_gpt_bad_argument_is_one_line_on_stderr():
    res = subprocess.run([sys.executable, TRAIN_GPT, "--overlap", "bogus"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "--overlap bogus" in res.stderr, res.stderr


def test_kernels_export_to_unwritable_path_is_one_line(capsys, tmp_path):
    """Review fix: an unwritable export-efficiency target leaked a FileNotFoundError traceback."""
    from axgrid.kernels.cli import main
    assert main(["export-efficiency", str(tmp_path / "missing" / "eff.json"), "--cache", str(tmp_path / "g.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write") and "choose a writable path" in err and err.count("\n") == 1, err


def test_finetune_refuses_an_axgrid_checkpoint_folder_as_its_model_in_one_line(tmp_path):
    """An easy mistake: --checkpoint pointed at a --save folder (4 tracebacks and a FutureWarning before)."""
    (tmp_path / "step-00000002").mkdir()
    (tmp_path / "step-00000002" / "manifest.json").write_text("{}")
    (tmp_path / "latest").write_text("step-00000002\n")
    for folder in (tmp_path, tmp_path / "step-00000002"):
        with pytest.raises(SystemExit) as e:
            load_script("train/finetune.py").main(["--checkpoint", str(folder)])
        assert str(e.value).startswith(f"--checkpoint {folder} is an axgrid checkpoint folder (written by --save), "
                                       f"not a Hugging Face model folder: continue that run with --resume")


@pytest.mark.parametrize("content,msg", [(None, "no such file (a shell pattern that matched no file)"),
                                         ("", "empty: the run wrote no metrics")])
def test_report_says_a_missing_or_empty_log_in_one_line(tmp_path, capsys, content, msg):
    from axgrid.launch.errors import run
    log = tmp_path / "runs" / ("*.jsonl" if content is None else "a.jsonl")
    if content is not None:
        log.parent.mkdir()
        log.write_text(content)
    with pytest.raises(SystemExit) as e:
        run(load_script("plots/report.py").main, "report", [str(log), "--out", str(tmp_path / "r")])
    assert e.value.code == 1 and capsys.readouterr().err == f"report: {log}: {msg}" + (
        "; pass the --log files of axgrid runs (train_gpt --log)\n" if content is None else
        " (did it stop before its first step?)\n")


@pytest.mark.parametrize("script,extra,msg", [
    ("finetune", ["--seq", "18", "--cp", "2"], "--seq 18 with --cp 2: sequence length 18 does not cut into 2·cp = 4 "
                                               "equal chunks (cp=2, causal balance); use a multiple of 4, e.g. 12, "
                                               "16, 20, 24"),
    ("finetune", ["--seq", "16", "--cp", "2"], "--cp 2 with grid 1x1x1x1: a sequence is split over the z-ranks, so "
                                               "--cp must divide Gz = 1; use --cp in [1]"),
    ("finetune", ["--seq", "16", "--cp", "0"], "--cp 0: the context-parallel size must be >= 1"),
    ("finetune", ["--seq", "16", "--cp", "2", "--sample-prompt", "Hi"], "--sample-prompt with --cp 2: generation"),
    ("pretrain", ["--seq", "30", "--cp", "4"], "--seq 30 with --cp 4: sequence length 30 does not cut into 2·cp = 8 "
                                               "equal chunks (cp=4, causal balance); use a multiple of 8, e.g. 16, "
                                               "24, 32, 40"),
    ("pretrain", ["--seq", "32", "--cp", "4"], "--cp 4 with grid 1x1x1x1: a sequence is split over the z-ranks"),
    ("train_gpt", ["--seq", "18", "--cp", "2"], "--seq 18 with --cp 2: sequence length 18 does not cut into 2·cp"),
])
def test_drivers_refuse_context_parallel_sizes_that_do_not_work_in_one_line(tmp_path, script, extra, msg):
    """--cp: a sequence not cut into 2·cp chunks, or cp not dividing Gz (the token shard a model splits over z),
    refused by every driver in one line naming what works, before the grid (so before any collective; the
    multi-rank case is in test_finetune.py and test_gpt_train.py)."""
    from transformers import LlamaConfig
    LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64).save_pretrained(tmp_path)
    model = {"finetune": ["--checkpoint", str(tmp_path)], "pretrain": ["--config", str(tmp_path)],
             "train_gpt": ["--model", "gpt-tiny"]}[script]
    with pytest.raises(SystemExit) as e:
        load_script(f"train/{script}.py").main(model + ["--grid", "1x1x1x1", "--steps", "1"] + extra)
    assert str(e.value).startswith(msg) and "\n" not in str(e.value), str(e.value)


def rank_pretrain_refusal(argv: list) -> str:
    """pretrain.py's one-line SystemExit on this rank (or "no error")."""
    try:
        load_script("train/pretrain.py").main(argv)
    except SystemExit as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("experts,top_k,extra,msg", [
    (4, 2, ["--ep", "4"], "--ep 4 with grid 1x1x1x2: the experts spread over d-ranks, so --ep must divide Gd=2; "
                          "choose --ep in [1, 2] or a grid whose Gd is a multiple of 4"),
    (3, 1, ["--ep", "2"], "with --config {config}: its 3 experts do not divide over 2 ranks; choose --ep in [1]"),
    (2, 3, [], "--config {config}: num_experts_per_tok=3 (top-k) but the model has 2 experts; choose "
               "num_experts_per_tok in 1..2"),
    (0, 0, ["--ep", "2"], "with --config {config}: the model is not a mixture of experts"),
])
def test_pretrain_refuses_expert_parallel_sizes_that_do_not_work_on_every_rank(ranks, tmp_path, experts, top_k,
                                                                               extra, msg):
    """--ep: not dividing Gd, experts not divisible by it, top-k above the experts (and --ep on a dense model),
    refused by pretrain.py in one line, the same on both ranks, before step 0 (the ranks start no collective: the
    grid is not made)."""
    from transformers import LlamaConfig, MixtralConfig
    common = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
    cfg = MixtralConfig(**common, num_local_experts=experts, num_experts_per_tok=top_k) if experts else \
        LlamaConfig(**common)
    cfg.save_pretrained(tmp_path / "model")
    config = str(tmp_path / "model")
    argv = ["--config", config, "--grid", "1x1x1x2", "--steps", "1", "--seq", "16", "--batch", "2", "--no-progress",
            "--timeout", "30"] + [w.replace("{out}", str(tmp_path / "out")) for w in extra]
    got = ranks(2, rank_pretrain_refusal, argv)
    assert got[0] == got[1], got
    assert msg.replace("{config}", config) in got[0] and "\n" not in got[0], got[0]
    assert not (tmp_path / "out").exists()
