"""The launchers of tests/unit/test_launch_table.py's rows that run here, for real, on the private Slurm cluster:
``srun --mpi=pmix``, torchrun inside it, ``srun --mpi=cray_shasta``, and the mpich wheel's Hydra ``mpiexec`` inside an ``sbatch`` script (with
``-launcher fork``, whose ranks see the batch step's ``SLURM_PROCID=0`` and ``SLURM_NTASKS=2`` as Open MPI's mpirun
ranks on one node do, and with Hydra's default, which starts its proxy with srun). Each job runs the demo on 2 ranks
(it all-reduces on the grid and compares with a serial run: MATCH) after printing who each rank found it is.

MPI plugins of Debian's slurm-wlm (22.05.8, slurm-wlm-basic-plugins): none, pmi2, pmix (pmix_v4), cray_shasta
(``srun --mpi=list`` here). The pmix plugin loads ``/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so``, which only
libpmix-dev ships (slurm-wlm does not depend on it): without it ``srun --mpi=pmix`` cannot start a task, and these
tests fail under CI (``CI`` set; .ci/run installs it) and are skipped elsewhere, naming the package."""
from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import pytest

from axgrid.testing.slurm import ROOT

pytestmark = pytest.mark.slurm

RUN_LIMIT_S = 300.0
PMIX_HINT = ("srun --mpi=pmix needs libpmix-dev (Debian's Slurm pmix plugin loads pmix2/lib/libpmix.so from it): "
             "sudo apt-get install libpmix-dev")
#: Each rank: who it is (launcher, rank, world size, local rank), then the demo on grid 2x1x1x1.
RANK_JOB = """import os, runpy, sys
from axgrid.launch.env import detect_launch
e = detect_launch(use_mpi=False)
line = f"PLACED {e.launcher} {e.rank} {e.world_size} {e.local_rank} SLURM_PROCID={os.environ.get('SLURM_PROCID', '-')}"
os.write(1, (line + chr(10)).encode())      # one write: whole, when ranks share a pipe (torchrun's workers)
sys.argv = ["axgrid.demo", "--grid", "2x1x1x1", "--steps", "2"]
runpy.run_module("axgrid.demo", run_name="__main__")
"""


def _placed(out: str) -> list[tuple[str, int, int, int, str]]:
    """The PLACED lines of a job's output: (launcher, rank, world size, local rank, SLURM_PROCID), sorted by rank."""
    found = re.findall(r"PLACED (\w+) (\d+) (\d+) (\d+) SLURM_PROCID=(\S+)", out)
    return sorted(((lau, int(r), int(w), int(lr), p) for lau, r, w, lr, p in found), key=lambda t: t[1])


def _assert_trained(out: str, placed: list[tuple[str, int, int, int, str]]) -> None:
    """An srun job's output: it exited 0, its ranks were placed as ``placed`` (:func:`_placed`), and it MATCHed."""
    assert out.startswith("exit 0"), out
    assert _placed(out) == placed, out
    assert ": MATCH" in out, out


@pytest.fixture(scope="module")
def pmix_missing(slurm) -> Optional[str]:
    """Why ``srun --mpi=pmix`` cannot start a task on this cluster (None: it can)."""
    listed = slurm.command(["srun", "--mpi=list"], check=False)
    if "pmix" not in listed.stdout + listed.stderr:
        return f"this Slurm has no pmix MPI plugin (srun --mpi=list: {listed.stdout.split()})"
    trial = subprocess.run(["srun", "--mpi=pmix", "-n", "1", "true"], env=slurm.env, capture_output=True, text=True,
                           timeout=60)
    if trial.returncode != 0:
        said = " ".join(trial.stderr.split())[-200:]
        return f"{PMIX_HINT} (srun --mpi=pmix -n 1 true: exit {trial.returncode}, {said})"
    return None


def need_pmix(missing: Optional[str]) -> None:
    """Fail (CI: ``CI`` set, as .ci/run does) or skip when srun --mpi=pmix cannot start; a Slurm built without the
    plugin is skipped everywhere (nothing to install)."""
    if missing is None:
        return
    if os.environ.get("CI") and missing.startswith(PMIX_HINT):
        pytest.fail(missing)
    pytest.skip(missing)


@pytest.fixture(scope="module")
def jobs(slurm, pmix_missing, tmp_path_factory):
    """The four launches, side by side (the srun --mpi=pmix ones where it can start): their output (for sbatch,
    Slurm's record and the job's .out file)."""
    tmp = tmp_path_factory.mktemp("launchers")
    script = tmp / "rank_job.py"
    script.write_text(RANK_JOB)
    batch = tmp / "mpiexec.sbatch"
    batch.write_text("#!/bin/bash\n#SBATCH -n 2\n#SBATCH -t 5\n"
                     f"#SBATCH -o {tmp}/mpiexec-%j.out\n"
                     f"echo '== fork'; mpiexec -launcher fork -n 2 python {script}\n"
                     f"echo '== slurm'; mpiexec -n 2 python {script}\n")
    env = dict(slurm.env, AXGRID_MPI_START_S="60")   # (the old code's mixed ranks waited here: bounded)

    def srun(*args: str) -> str:
        res = subprocess.run(["srun", "--kill-on-bad-exit=1", *args], env=env, cwd=ROOT, capture_output=True,
                             text=True, timeout=RUN_LIMIT_S)
        return f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"

    def sbatch() -> str:
        job = slurm.sbatch(str(batch), env=env, cwd=tmp)
        rec = slurm.wait_done(job, timeout_s=RUN_LIMIT_S)
        return f"{rec.state} {rec.exit_code}\n{(tmp / f'mpiexec-{job}.out').read_text()}"

    with ThreadPoolExecutor(4) as ex:
        futures = {"sbatch": ex.submit(sbatch),
                   "cray_shasta": ex.submit(srun, "--mpi=cray_shasta", "-n", "2", "-J", "shasta", "python", str(script))}
        if pmix_missing is None:
            futures["pmix"] = ex.submit(srun, "--mpi=pmix", "-n", "2", "-J", "pmix", "python", str(script))
            futures["torchrun"] = ex.submit(srun, "--mpi=pmix", "-n", "1", "-J", "torchrun-pmix", "torchrun",
                                            "--nproc-per-node=2", "--no-python", "python", str(script))
        return {k: f.result() for k, f in futures.items()}


def test_srun_mpi_pmix_runs_an_axgrid_job(jobs, pmix_missing):
    """PMIx sets PMIX_RANK and no size; before, every rank stopped on "an MPI rank variable is set but no world
    size". Now the srun task's SLURM_* decide, and the ranks meet on the step's first node."""
    need_pmix(pmix_missing)
    out = jobs["pmix"]
    _assert_trained(out, [("slurm", 0, 2, 0, "0"), ("slurm", 1, 2, 1, "1")])


def test_srun_mpi_cray_shasta_runs_an_axgrid_job(jobs):
    """HPE's plugin, as Debian builds it, adds PALS_RANKID, PALS_NODEID and PALS_APID (no size) beside SLURM_*."""
    out = jobs["cray_shasta"]
    _assert_trained(out, [("slurm", 0, 2, 0, "0"), ("slurm", 1, 2, 1, "1")])


def test_torchrun_inside_srun_mpi_pmix(jobs, pmix_missing):
    """torchrun's variables are the innermost: its 2 workers (both in srun's task 0, beside PMIX_RANK=0)."""
    need_pmix(pmix_missing)
    out = jobs["torchrun"]
    _assert_trained(out, [("torchrun", 0, 2, 0, "0"), ("torchrun", 1, 2, 1, "0")])


def test_mpiexec_inside_sbatch_takes_mpis_ranks_on_every_rank(jobs):
    """``-launcher fork``: both ranks see the batch step's SLURM_PROCID=0 and SLURM_NTASKS=2; before, rank 0 (whose
    PMI_RANK=0, PMI_SIZE=2 coincide with them) took the Slurm row and rank 1 the MPI row, and the job hung.
    Hydra's default starts its proxy with srun (a step of one task); both ways every rank reads Hydra's variables."""
    out = jobs["sbatch"]
    assert out.startswith("COMPLETED 0:0"), out
    fork, default = out.split("== fork", 1)[1].split("== slurm", 1)
    for part in (fork, default):
        assert _placed(part) == [("mpich", 0, 2, 0, "0"), ("mpich", 1, 2, 1, "0")], out
        assert ": MATCH" in part, out
