"""A user's first hour, run as the user runs it (real launchers, the real entry points as processes): the project's
errors are one line, said once, with a non-zero exit and no MPI banner -- under ``axgrid launch`` and a bare
``mpiexec`` alike; the launcher refuses a bad ``--grid`` before any rank starts; a script run alone says how to launch
it; an error on one rank only (not rank 0) is said once, by that rank, under every launcher. (In-process:
tests/unit/test_entry_errors.py; report and finetune: tests/scripts/test_cli_errors.py.)"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from axgrid.launch.local import find_mpiexec
from axgrid.testing.faults import run_job
from helpers import ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TRAIN = [sys.executable, "experiments/train/train_gpt.py"]
BAD_HEADS = ["--heads", "3", "--hidden", "96", "--grid", "1x2x1x1", "--steps", "1", "--no-progress"]
HEADS = "train_gpt: GPT gpt-tiny: heads=3 is not divisible by Gy=2 of grid 1x2x1x1"
MPIEXEC = find_mpiexec()


def run(cmd: list[str], timeout: float = 300) -> tuple[int, list[str]]:
    res = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    return res.returncode, [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]


@pytest.mark.parametrize("launcher", ["axgrid launch"] + (["mpiexec"] if MPIEXEC else []))
def test_a_bad_model_size_is_one_line_said_once(launcher):
    """Raised on both ranks after the grid is built: one line (the launcher's record of it, or rank 0's)."""
    cmd = ([sys.executable, "-m", "axgrid.cli", "launch", "-n", "2", "--"] if launcher == "axgrid launch"
           else [MPIEXEC, "-n", "2"])
    code, out = run(cmd + TRAIN + BAD_HEADS)
    assert code == 1 and len(out) == 1, out
    assert out[0].split("] ", 1)[-1].startswith(HEADS), out


def test_the_launcher_checks_the_grid_before_starting_a_rank():
    code, out = run([sys.executable, "-m", "axgrid.cli", "launch", "-n", "4", "--", *TRAIN, "--grid", "2x2xlx1"])
    assert code == 1 and out == ["axgrid: --grid 2x2xlx1: grid '2x2xlx1' is not of the form GXxGYxGZxGD, e.g. "
                                 "'2x2x2x1'"], out


def test_a_script_run_alone_says_how_to_launch_it():
    code, out = run([sys.executable, "examples/tour.py"])
    assert code == 1 and len(out) == 1, out
    assert out[0].startswith("tour: grid 2x2x2x1 needs 8 ranks, but this process runs alone") and \
        "`axgrid launch -n 8 -- python examples/tour.py`" in out[0], out


SHARD = "shard-00007.bin: bad magic on rank 3; rerun preprocessing"


ONE_RANK_LAUNCHERS = {"axgrid launch": "mpiexec", "torchrun": "torchrun", "mpiexec": "bare-mpiexec"}


@pytest.mark.parametrize("launcher", [v for k, v in ONE_RANK_LAUNCHERS.items() if MPIEXEC or "mpiexec" not in v],
                         ids=[k for k, v in ONE_RANK_LAUNCHERS.items() if MPIEXEC or "mpiexec" not in v])
def test_an_error_on_one_rank_is_said_once_by_it(launcher, tmp_path):
    """Rank 3 of 4 stops on one of the project's errors (a bad shard: axgrid.testing.fault_rank refuse) while the
    others are in an all-reduce with it. Its line is said once, by it, under every launcher (before, only rank 0
    spoke, so under torchrun and mpiexec nobody did); the others' "Connection closed" failures and flight records,
    consequences, say nothing. (torchrun adds its own report of the failed worker, with its own traceback.)"""
    job = run_job(launcher, "refuse", tmp_path, ranks=4, bad=3)
    said = [line for line in job.output.splitlines() if SHARD in line]
    assert job.code != 0 and len(said) == 1, job.output
    assert said[0].startswith("[3] ") and said[0].endswith(f"axgrid.testing.fault_rank: {SHARD}"), job.output
    assert job.output.count("Traceback") == (1 if launcher == "torchrun" else 0), job.output
    assert "Connection closed" not in job.output and "flight recorder" not in job.output, job.output
