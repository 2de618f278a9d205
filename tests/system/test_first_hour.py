"""A user's first hour, run as the user runs it (real launchers, the real entry points as processes): the project's
errors are one line, said once, with a non-zero exit and no MPI banner -- under ``axgrid launch`` and a bare
``mpiexec`` alike; the launcher refuses a bad ``--grid`` before any rank starts; a script run alone says how to launch
it. (In-process: tests/unit/test_entry_errors.py; report and finetune: tests/scripts/test_cli_errors.py.)"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from axgrid.launch.local import find_mpiexec
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
