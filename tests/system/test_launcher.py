"""The local launcher: both ways of starting ranks, rank-prefixed output, failure ends the job."""
import io
import sys
import time

import pytest

from axgrid.launch.local import find_mpiexec, launch

MODES = [False] + ([True] if find_mpiexec() else [])


@pytest.mark.parametrize("use_mpi", MODES)
def test_ranks_see_the_environment_contract(use_mpi):
    out = io.StringIO()
    code = ("from axgrid.launch.env import detect_launch; e = detect_launch(); "
            "print('ME', e.rank, e.world_size, e.local_rank, e.launcher)")
    assert launch(3, [sys.executable, "-c", code], use_mpi=use_mpi, out=out) == 0
    lines = sorted(line for line in out.getvalue().splitlines() if "ME" in line)
    want_launcher = "mpich" if use_mpi else "torchrun"
    assert lines == [f"[{r}] ME {r} 3 {r} {want_launcher}" for r in range(3)]


@pytest.mark.parametrize("use_mpi", MODES)
def test_a_failing_rank_ends_the_others(use_mpi):
    out = io.StringIO()
    code = ("import os, sys, time; from axgrid.launch.env import detect_launch; r = detect_launch(use_mpi=False).rank; "
            "sys.exit(7) if r == 1 else time.sleep(60)")
    t = time.monotonic()
    rc = launch(3, [sys.executable, "-c", code], use_mpi=use_mpi, out=out)
    assert rc == 7
    assert time.monotonic() - t < 30
    assert "the other ranks were ended" in out.getvalue()


def test_launch_needs_a_command():
    with pytest.raises(ValueError, match="no command"):
        launch(2, [])
