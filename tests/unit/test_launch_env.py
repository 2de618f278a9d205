"""Who a rank is under srun with an MPI plugin, and launches that cannot work refused in one line.

The environments are those the launchers set (checked on this machine's Slurm for ``--mpi=pmi2``: PMI_RANK,
PMI_SIZE, PMI_FD, PMI_JOBID beside SLURM_*; on HPE systems Cray PMI adds PMI_RANK, PMI_SIZE, PMI_LOCAL_RANK under the
cray_shasta plugin, which as Debian builds it sets only PALS_*). A real 4-task ``srun --mpi=pmi2`` job is in
tests/system/test_slurm.py; every launcher's row is in tests/unit/test_launch_table.py."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from helpers import ROOT

from axgrid.launch.env import LaunchError, detect_launch

SRUN = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "nid[0040-0041]", "SLURM_JOB_NODELIST": "nid[0040-0041]", "SLURM_JOB_ID": "4242",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}
CRAY_SHASTA = {**SRUN, "PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4"}
PMI2 = {**SRUN, "PMI_RANK": "5", "PMI_SIZE": "8", "PMI_FD": "11", "PMI_JOBID": "4242.0"}


@pytest.mark.parametrize("env", [CRAY_SHASTA, PMI2], ids=["cray_shasta", "pmi2"])
def test_srun_with_an_mpi_plugin_meets_on_the_first_node(env):
    """Before: PMI_RANK sent these into the MPI branch, which met at 127.0.0.1 (or, with mpi4py, at each rank's own
    host as a world of one): every task hung."""
    for use_mpi in (False, True):          # True: no MPI is started at all (this process stays MPI-free)
        e = detect_launch(env, use_mpi=use_mpi)
        assert (e.launcher, e.rank, e.world_size, e.local_rank, e.local_world_size, e.master_addr) == \
            ("slurm", 5, 8, 1, 4, "nid0040")
    assert "mpi4py.MPI" not in sys.modules


def test_mpiexec_inside_an_allocation_keeps_mpis_ranks():
    """Hydra's mpiexec in a batch script starts its proxies with srun (one task per node): the ranks' SLURM_PROCID
    is the node, PMI_RANK the rank."""
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "nid[0040-0041]", "PMI_RANK": "5",
           "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4", "MASTER_ADDR": "nid0040",
           "MASTER_PORT": "29500"}
    e = detect_launch(env, use_mpi=True)
    assert (e.launcher, e.rank, e.world_size, e.local_rank, e.master_addr, e.master_port) == \
        ("mpich", 5, 8, 1, "nid0040", 29500)


def test_launches_that_cannot_work_are_refused_in_one_line(monkeypatch):
    with pytest.raises(LaunchError, match=r"^srun's task says rank 5 of 8 but the MPI plugin's variables say rank 2 "
                                          r"of 8 \(.*PMI_RANK=2.*SLURM_PROCID=5.*\)"):
        detect_launch({**SRUN, "PMI_RANK": "2", "PMI_SIZE": "8"})
    with pytest.raises(LaunchError, match=r"8 ranks on several nodes \(4 on this one\) but no MASTER_ADDR "
                                          r"\(LOCAL_RANK=1 LOCAL_WORLD_SIZE=4 RANK=5 WORLD_SIZE=8\)"):
        detect_launch({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    assert detect_launch({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}).master_addr == "127.0.0.1"
    monkeypatch.setitem(sys.modules, "mpi4py", None)                # no mpi4py to agree on an address
    with pytest.raises(LaunchError, match=r"8 MPI ranks on several nodes \(4 on this one\), no mpi4py .*PMI_RANK=5"):
        detect_launch({"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"})
    with pytest.raises(LaunchError) as got:
        detect_launch({**SRUN, "PMI_RANK": "2", "PMI_SIZE": "8"})
    assert "\n" not in str(got.value)


def _rank(env: dict[str, str], pass_fds=(), timeout_s: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PYTHONPATH": str(ROOT), **env}
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-c", "from axgrid.launch.env import detect_launch; print(detect_launch())"],
                       env=env, pass_fds=pass_fds, capture_output=True, text=True, timeout=timeout_s)
    return p, time.monotonic() - t


def test_an_mpi_world_that_is_not_the_launchers_is_refused():
    """PMI variables from a launcher this MPI cannot reach (no PMI_FD: MPICH starts as a singleton, a world of 1,
    while PMI_SIZE says 4)."""
    p, _ = _rank({"PMI_RANK": "1", "PMI_SIZE": "4"})
    assert p.returncode != 0
    assert "LaunchError: mpi4py's MPI sees a world of 1 process(es) but the launcher started 4 (PMI_RANK=1 " \
           "PMI_SIZE=4)" in p.stderr


def test_an_mpi_that_never_starts_ends_the_rank_with_one_line():
    """MPI_Init waiting forever for a process manager that never answers (a PMI_FD nobody serves) used to hang
    silently: the rank now ends after AXGRID_MPI_START_S with one line naming what it saw."""
    ours, theirs = socket.socketpair()
    try:
        p, took = _rank({"PMI_RANK": "1", "PMI_SIZE": "2", "PMI_FD": str(theirs.fileno()), "AXGRID_MPI_START_S": "2"},
                        pass_fds=(theirs.fileno(),))
    finally:
        ours.close()
        theirs.close()
    assert p.returncode == -9 and took < 30
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("axgrid: MPI did not start within 2 s") and \
        "PMI_RANK=1 PMI_SIZE=2" in lines[0], p.stderr
