"""Who a rank is under every launcher a cluster has: a table of the environments the launchers set, each row read
by the one rule (axgrid.launch.env.read_placement, a pure function of the mapping given).

Each row says where its variables come from:

- "observed here": dumped from a rank started by that launcher on this machine (the tests' private Slurm 22.05.8
  cluster of Debian's slurm-wlm, the mpich wheel's Hydra mpiexec, torch's torchrun); the names are as observed, the
  values those of a larger job (8 ranks, 4 per node, nodes nid0040-nid0041) where the row says so;
- "documentation": the launcher's manual (Open MPI's mpirun(1) "Exported Environment Variables", HPE's PALS and
  ALCF's Polaris/Aurora guides, Cray's aprun(1));
- "axgrid/launch/local.py": what ``axgrid launch`` sets.

The same rows ran under the real launchers, where there is one here: tests/system/test_slurm.py (srun with each MPI
plugin Debian ships, mpiexec inside sbatch) and tests/system/test_launcher.py (axgrid launch)."""
from __future__ import annotations

import os
import re

import pytest
from hypothesis import given, settings, strategies as st

from axgrid.launch import errors
from axgrid.launch.env import LaunchError, Placement, read_placement

NODES = "nid[0040-0041]"


def slurm_job(ntasks: int = 8, per_node: int = 4, nodes: str = NODES, job: int = 4242) -> dict[str, str]:
    """What every process of a Slurm job sees, a batch script's own step included (observed here)."""
    n_nodes = ntasks // per_node
    return {"SLURM_JOB_ID": str(job), "SLURM_JOBID": str(job), "SLURM_JOB_NAME": "train", "SLURM_JOB_NODELIST": nodes,
            "SLURM_NODELIST": nodes, "SLURM_JOB_NUM_NODES": str(n_nodes), "SLURM_NNODES": str(n_nodes),
            "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks),
            "SLURM_TASKS_PER_NODE": f"{per_node}(x{n_nodes})" if n_nodes > 1 else str(per_node)}


def batch_step(ntasks: int = 8, per_node: int = 4) -> dict[str, str]:
    """A batch script's own step (``sbatch -n 8``; observed here): task 0 of the job, no SLURM_STEP_*."""
    return {**slurm_job(ntasks, per_node), "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}


def srun_task(rank: int, ntasks: int = 8, per_node: int = 4, step: int = 0) -> dict[str, str]:
    """Task ``rank`` of an ``srun -n NTASKS`` step (observed here, srun --mpi=none)."""
    n_nodes = ntasks // per_node
    per = f"{per_node}(x{n_nodes})" if n_nodes > 1 else str(per_node)
    return {**slurm_job(ntasks, per_node), "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % per_node),
            "SLURM_NODEID": str(rank // per_node), "SLURM_STEP_ID": str(step), "SLURM_STEPID": str(step),
            "SLURM_STEP_NODELIST": NODES, "SLURM_STEP_NUM_NODES": str(n_nodes), "SLURM_STEP_NUM_TASKS": str(ntasks),
            "SLURM_STEP_TASKS_PER_NODE": per, "SLURM_STEP_LAUNCHER_PORT": "43188"}


def pmi2(rank: int, size: int = 8) -> dict[str, str]:     # srun --mpi=pmi2 (observed here)
    return {"SLURM_MPI_TYPE": "pmi2", "PMI_FD": "11", "PMI_JOBID": "4242.0", "PMI_RANK": str(rank),
            "PMI_SIZE": str(size)}


def pmix(rank: int) -> dict[str, str]:                     # srun --mpi=pmix (observed here; no size variable)
    return {"SLURM_MPI_TYPE": "pmix", "PMIX_RANK": str(rank), "PMIX_NAMESPACE": "slurm.pmix.4242.0",
            "PMIX_HOSTNAME": "nid0040", "PMIX_VERSION": "4.2.2rc2", "PMIX_SECURITY_MODE": "native",
            "PMIX_SERVER_URI41": "pmix-server.21331;tcp4://127.0.0.1:33403", "PMIX_SYSTEM_TMPDIR": "/tmp",
            "SLURM_PMIX_MAPPING_SERV": "(vector,(0,2,4))"}


def cray_shasta(rank: int, node: int) -> dict[str, str]:   # srun --mpi=cray_shasta (observed here)
    return {"SLURM_MPI_TYPE": "cray_shasta", "PALS_APID": "4242.0", "PALS_RANKID": str(rank),
            "PALS_NODEID": str(node), "PALS_SPOOL_DIR": "/var/spool/slurmd/mpi_cray_shasta/4242.0",
            "PALS_APINFO": "/var/spool/slurmd/mpi_cray_shasta/4242.0/apinfo"}


def hydra(rank: int, size: int = 8, local_size: int = 4) -> dict[str, str]:   # MPICH's mpiexec (observed here)
    return {"PMI_RANK": str(rank), "PMI_SIZE": str(size), "PMI_FD": "9", "PMI_HOSTNAME": "nid0040",
            "MPI_LOCALRANKID": str(rank % local_size), "MPI_LOCALNRANKS": str(local_size), "HYDI_CONTROL_FD": "7"}


def openmpi(rank: int, size: int = 8, local_size: int = 4) -> dict[str, str]:   # mpirun(1) (documentation)
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size), "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
            "OMPI_COMM_WORLD_NODE_RANK": str(rank % local_size), "OMPI_UNIVERSE_SIZE": str(size),
            "PMIX_RANK": str(rank), "PMIX_NAMESPACE": "prterun-nid0040-12345@1"}


def torchrun(rank: int, size: int = 8, local_size: int = 4, master: str = "nid0040") -> dict[str, str]:
    """torchrun's worker environment (observed here: --nproc-per-node=2; values of --nnodes=2 --nproc-per-node=4)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank % local_size),
            "LOCAL_WORLD_SIZE": str(local_size), "GROUP_RANK": str(rank // local_size),
            "GROUP_WORLD_SIZE": str(size // local_size), "ROLE_RANK": str(rank), "ROLE_NAME": "default",
            "ROLE_WORLD_SIZE": str(size), "MASTER_ADDR": master, "MASTER_PORT": "29500",
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"}


def axgrid_launch(rank: int, size: int = 4, mpi: bool = False) -> dict[str, str]:   # axgrid/launch/local.py
    job = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "41234", "AXGRID_LAUNCH_JOB": "axgrid-launch-x1",
           "AXGRID_LAUNCH_DIR": "/tmp/axgrid-launch-x1", "AXGRID_RUN_DIR": "/tmp/axgrid-launch-x1/run"}
    if mpi:
        return {**job, **hydra(rank, size, size)}
    return {**job, "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(size)}


# (row, source, environment, expected Placement or the LaunchError's pattern)
ROWS = [
    ("srun --mpi=none", "observed here", srun_task(5),
     Placement("slurm", 5, 8, 1, 4, "SLURM_STEP_NODELIST")),
    ("srun --mpi=pmi2", "observed here", {**srun_task(5), **pmi2(5)},
     Placement("slurm", 5, 8, 1, 4, "SLURM_STEP_NODELIST")),
    ("srun --mpi=pmix", "observed here", {**srun_task(5), **pmix(5)},
     Placement("slurm", 5, 8, 1, 4, "SLURM_STEP_NODELIST")),
    ("srun --mpi=cray_shasta", "observed here", {**srun_task(5), **cray_shasta(5, 1)},
     Placement("slurm", 5, 8, 1, 4, "SLURM_STEP_NODELIST")),
    ("srun --mpi=cray_shasta, HPE's Cray PMI", "documentation (PMI_* beside PALS_*)",
     {**srun_task(5), **cray_shasta(5, 1), "PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1",
      "PMI_LOCAL_SIZE": "4"},
     Placement("slurm", 5, 8, 1, 4, "SLURM_STEP_NODELIST")),
    ("srun, MASTER_ADDR exported", "observed here + the sbatch templates' export",
     {**srun_task(5), "MASTER_ADDR": "nid0041"}, Placement("slurm", 5, 8, 1, 4, "MASTER_ADDR")),
    ("Open MPI mpirun", "documentation", openmpi(5), Placement("openmpi", 5, 8, 1, 4, "mpi4py")),
    ("Open MPI mpirun in sbatch, rank 0", "documentation + batch step observed here",
     {**batch_step(), **openmpi(0)}, Placement("openmpi", 0, 8, 0, 4, "mpi4py")),
    ("Open MPI mpirun in sbatch, rank 5", "documentation + batch step observed here",
     {**batch_step(), **openmpi(5)}, Placement("openmpi", 5, 8, 1, 4, "mpi4py")),
    ("Open MPI mpirun in sbatch, daemons by srun", "documentation + srun step observed here",
     {**srun_task(1, ntasks=2, per_node=1), **openmpi(5)}, Placement("openmpi", 5, 8, 1, 4, "mpi4py")),
    ("MPICH Hydra mpiexec", "observed here", hydra(5), Placement("mpich", 5, 8, 1, 4, "mpi4py")),
    ("Hydra mpiexec -launcher fork in sbatch, rank 0", "observed here", {**batch_step(), **hydra(0)},
     Placement("mpich", 0, 8, 0, 4, "mpi4py")),
    ("Hydra mpiexec -launcher fork in sbatch, rank 5", "observed here", {**batch_step(), **hydra(5)},
     Placement("mpich", 5, 8, 1, 4, "mpi4py")),
    ("Hydra mpiexec in sbatch, proxies by srun", "observed here (SLURM_EXTERNAL_LAUNCHER too)",
     {**srun_task(1, ntasks=2, per_node=1), "SLURM_EXTERNAL_LAUNCHER": "1", **hydra(5)},
     Placement("mpich", 5, 8, 1, 4, "mpi4py")),
    ("Cray PALS mpiexec", "documentation",
     {"PALS_RANKID": "5", "PALS_LOCAL_RANKID": "1", "PALS_NODEID": "1", "PALS_APID": "a1b2", "PALS_DEPTH": "1",
      "PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4"},
     Placement("pals", 5, 8, 1, 4, "mpi4py")),
    ("Cray aprun (ALPS)", "documentation (no world size is exported)",
     {"ALPS_APP_PE": "5", "ALPS_APP_ID": "123456", "ALPS_APP_DEPTH": "1"},
     r"rank from a launcher \(ALPS_APP_PE=5\) but no world size \(ALPS_APP_PE=5\): start the ranks with srun"),
    ("PMIx rank, no srun task", "constructed (a PMIx server's client outside any srun step)",
     {**batch_step(), "PMIX_RANK": "5", "PMIX_NAMESPACE": "prterun-x@1"},
     r"rank from a launcher \(PMIX_RANK=5\) but no world size \(PMIX_RANK=5 SLURM_LOCALID=0 SLURM_NTASKS=8 SLURM_PROCID=0\)"),
    ("torchrun", "observed here", torchrun(5), Placement("torchrun", 5, 8, 1, 4, "MASTER_ADDR")),
    ("torchrun inside srun --mpi=pmix", "observed here (srun -N 2 --ntasks-per-node=1 torchrun ...)",
     {**srun_task(1, ntasks=2, per_node=1), **pmix(1), **torchrun(5)},
     Placement("torchrun", 5, 8, 1, 4, "MASTER_ADDR")),
    ("torchrun inside srun --mpi=pmi2", "observed here (the variables of both)",
     {**srun_task(1, ntasks=2, per_node=1), **pmi2(1, 2), **torchrun(5)},
     Placement("torchrun", 5, 8, 1, 4, "MASTER_ADDR")),
    ("axgrid launch --no-mpi", "axgrid/launch/local.py", axgrid_launch(3),
     Placement("torchrun", 3, 4, 3, 4, "MASTER_ADDR")),
    ("axgrid launch (mpiexec)", "axgrid/launch/local.py + Hydra observed here", axgrid_launch(3, mpi=True),
     Placement("mpich", 3, 4, 3, 4, "MASTER_ADDR")),
    ("python", "observed here", {}, Placement("single", 0, 1, 0, 1, "127.0.0.1")),
    ("python in a batch script", "observed here", batch_step(), Placement("single", 0, 1, 0, 1, "127.0.0.1")),
]


@pytest.mark.parametrize("name,source,env,expected", ROWS, ids=[r[0] for r in ROWS])
def test_launch_table(name, source, env, expected):
    """Before, on 0c7c76d: srun --mpi=pmix and torchrun inside it raised "an MPI rank variable is set but no world
    size"; mpirun/mpiexec inside sbatch took the Slurm path on rank 0 only; python in a batch script waited for 7
    ranks that never come; aprun started 8 worlds of one."""
    if isinstance(expected, Placement):
        assert read_placement(env) == expected, source
    else:
        with pytest.raises(LaunchError, match=expected) as got:
            read_placement(env)
        assert "\n" not in str(got.value)
        assert got.value.rank == 5          # known: only rank 0 says it (test_a_launch_error_is_said_by_rank_0_once)


#: (outer environment of a job, its name): what every rank inherits from around the inner launcher
OUTER = {"nothing": lambda n: {}, "a batch step": lambda n: batch_step(n, n),
         "srun's one task per node": lambda n: srun_task(0, ntasks=1, per_node=1)}
INNER = {"mpich": hydra, "openmpi": openmpi, "torchrun": torchrun}


@settings(max_examples=60, deadline=None)
@given(outer=st.sampled_from(sorted(OUTER)), inner=st.sampled_from(sorted(INNER)),
       size=st.integers(1, 16), local=st.integers(1, 8))
def test_every_rank_of_a_nested_launch_takes_the_same_row(outer, inner, size, local):
    """Whatever launcher runs around it, every rank of an inner launcher's job reads the inner launcher, and the
    ranks are 0..size-1 once each (before: with the batch step's SLURM_NTASKS equal to the MPI world, rank 0 alone
    took the Slurm row)."""
    local = min(local, size)
    placed = [read_placement({**OUTER[outer](size), **INNER[inner](r, size, local)}) for r in range(size)]
    assert {p.launcher for p in placed} == {inner}
    assert [p.rank for p in placed] == list(range(size))
    assert {p.world_size for p in placed} == {size}


def test_a_launch_error_is_said_by_rank_0_once(monkeypatch, capsys):
    """A launch that cannot be read is refused on every rank alike, in one line naming the variables and the fix;
    rank 0 prints it, the others stay quiet (before: the position was unknown, so every rank printed it)."""
    monkeypatch.setattr(errors, "QUIET_RANK_DELAY_S", 0.0)
    for k in [k for k in os.environ if k.startswith(("SLURM_", "PMI", "OMPI_", "MPI_", "RANK", "WORLD_", "AXGRID_"))]:
        monkeypatch.delenv(k)          # errors.say reads this process's environment: a rank's, one after another
    said = []
    for rank in range(4):
        monkeypatch.setenv("ALPS_APP_PE", str(rank))
        with pytest.raises(LaunchError) as got:
            read_placement({"ALPS_APP_PE": str(rank)})
        assert re.fullmatch(rf"this process has a rank from a launcher \(ALPS_APP_PE={rank}\) but no world size "
                            rf"\(ALPS_APP_PE={rank}\): start the ranks with srun, mpiexec, torchrun or axgrid launch, "
                            rf"or set RANK, .* MASTER_PORT for every rank", str(got.value))
        errors.say(got.value, "demo")
        said.append(capsys.readouterr().err)
    assert said[0].startswith("demo: this process has a rank from a launcher (ALPS_APP_PE=0)") and \
        said[0].count("\n") == 1
    assert said[1:] == ["", "", ""]
