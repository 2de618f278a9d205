"""AxgridStrategy against the launch Fabric read (its cluster environment), from the variables each launch really
sets (printed by the private Slurm cluster of axgrid/testing/slurm.py: ``srun``, ``sbatch``, mpiexec inside it):
``Fabric(...)`` alone, in this process, no process group. Where Fabric's choice and axgrid's launch table
(axgrid.launch.env.read_placement) disagree, the job would hang or train worlds side by side; the strategy corrects
the one case it can (an srun task of an ``interactive``/``bash`` job) and refuses the others in one line. An
unsupported precision is refused the same way, naming the value and the supported ones. The jobs themselves:
tests/system/test_fabric_launch.py."""
from __future__ import annotations

import os

import pytest
import torch.distributed as dist

pytest.importorskip("lightning_fabric")

from lightning_fabric import Fabric  # noqa: E402
from lightning_fabric.plugins.environments import LightningEnvironment, SLURMEnvironment  # noqa: E402
from lightning_fabric.utilities.rank_zero import rank_zero_only  # noqa: E402

from axgrid.integrations.lightning import AxgridStrategy  # noqa: E402
from axgrid.launch.env import LaunchError  # noqa: E402

LAUNCH_PREFIXES = ("SLURM_", "PMI_", "PMIX_", "MPI_LOCAL", "OMPI_", "PALS_", "TORCHELASTIC_")
LAUNCH_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
                "MASTER_PORT")


def slurm_job(name: str = "train.sh", ntasks: int = 4, per_node: int = 4) -> dict[str, str]:
    """What every process of a Slurm job sees (``--ntasks-per-node=per_node`` on one node)."""
    return dict(SLURM_JOB_ID="123456", SLURM_JOB_NAME=name, SLURM_JOB_NODELIST="node7", SLURM_NODELIST="node7",
                SLURM_NNODES="1", SLURM_NODEID="0", SLURM_NTASKS=str(ntasks), SLURM_NTASKS_PER_NODE=str(per_node),
                SLURM_TASKS_PER_NODE=str(per_node))


def srun_task(rank: int, tasks: int = 4, **job: str) -> dict[str, str]:
    """Task ``rank`` of ``srun`` (a step of ``tasks`` on one node)."""
    return dict(slurm_job(**job), SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NTASKS=str(tasks),
                SLURM_STEP_NUM_TASKS=str(tasks), SLURM_STEP_TASKS_PER_NODE=str(tasks))


@pytest.fixture
def launch(monkeypatch):
    """``launch(env, devices=4, precision="32-true")``: ``Fabric(strategy=AxgridStrategy("2x1x1x2"), ...)`` built
    in a process whose launcher variables are ``env`` alone; returns the strategy."""
    for k in list(os.environ):
        if k.startswith(LAUNCH_PREFIXES) or k in LAUNCH_NAMES:
            monkeypatch.delenv(k)
    saved_rank = rank_zero_only.rank

    def build(env: dict[str, str], devices: int = 4, precision: str = "32-true") -> AxgridStrategy:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        strategy = AxgridStrategy("2x1x1x2")
        Fabric(accelerator="cpu", devices=devices, strategy=strategy, precision=precision)
        assert not dist.is_initialized()
        return strategy

    yield build
    rank_zero_only.rank = saved_rank


def test_srun_task_is_read_from_slurm_as_axgrids_table_reads_it(launch):
    s = launch(srun_task(2))
    assert type(s.cluster_environment) is SLURMEnvironment and s.launcher is None
    assert (s.global_rank, s.world_size, s.local_rank) == (2, 4, 2)


def test_srun_step_smaller_than_the_job_is_accepted(launch):
    """``sbatch --ntasks-per-node=4`` then ``srun -n 2``: SLURM_NTASKS_PER_NODE stays the job's 4 (Fabric's own
    validate_settings would ask for devices=4); the step has 2 tasks on the node, and devices=2 is right."""
    s = launch(dict(srun_task(1, tasks=2), SLURM_NTASKS_PER_NODE="4"), devices=2)
    assert (type(s.cluster_environment), s.global_rank, s.world_size) == (SLURMEnvironment, 1, 2)


@pytest.mark.parametrize("name", ["interactive", "bash"])
def test_srun_task_of_an_interactive_job_runs_as_the_srun_task_it_is(launch, name):
    """Fabric leaves a job named interactive/bash to its own launcher, which would start 4 processes in each of
    srun's 4 tasks (4 worlds training side by side): the strategy takes Fabric's SLURMEnvironment instead."""
    s = launch(srun_task(3, name=name))
    assert not SLURMEnvironment.detect()            # Fabric's own choice: not Slurm
    assert type(s.cluster_environment) is SLURMEnvironment and s.launcher is None
    assert (s.global_rank, s.world_size, s.local_rank) == (3, 4, 3)


def test_one_process_in_an_interactive_step_keeps_fabrics_launcher(launch):
    """``srun --pty bash`` (a step of one task), then ``python train.py``: Fabric's launcher starts the 4."""
    s = launch(srun_task(0, tasks=1, name="bash"))
    assert type(s.cluster_environment) is LightningEnvironment and s.launcher is not None


def test_batch_scripts_own_step_is_refused_instead_of_waiting_for_3_ranks(launch):
    """``python train.py`` in an sbatch script, no srun: Fabric takes it for task 0 of SLURM_NTASKS=4 and waits."""
    with pytest.raises(LaunchError, match=r"finds no launcher \(one process on its own\).*Fabric chose "
                                          r"SLURMEnvironment, which reads this process as rank 0 of 4: start it with "
                                          r"srun"):
        launch(dict(slurm_job(), SLURM_PROCID="0", SLURM_LOCALID="0"))


@pytest.mark.parametrize("rank", [0, 1])
def test_mpiexec_inside_sbatch_is_refused_on_every_rank(launch, rank):
    """Hydra's mpiexec -launcher fork in a batch script: every rank sees the batch step's SLURM_PROCID=0, so
    Fabric's SLURMEnvironment makes each of them rank 0; refused on rank 0 as on rank 1 (nobody waits)."""
    env = dict(slurm_job(ntasks=2, per_node=2), SLURM_PROCID="0", SLURM_LOCALID="0", PMI_RANK=str(rank),
               PMI_SIZE="2", MPI_LOCALRANKID=str(rank), MPI_LOCALNRANKS="2")
    with pytest.raises(LaunchError, match=rf"finds mpich's rank {rank} of 2.*Fabric chose SLURMEnvironment, which "
                                          rf"reads this process as rank 0 of 2"):
        launch(env, devices=2)


def test_devices_that_are_not_the_launchers_tasks_are_refused(launch):
    with pytest.raises(LaunchError, match=r"Fabric\(devices=2, num_nodes=1\) makes 2 ranks, but slurm started 4 "
                                          r"\(4 on this node\): set devices=4 and num_nodes=1"):
        launch(srun_task(0), devices=2)


def test_torchrun_is_read_as_axgrids_table_reads_it(launch):
    env = dict(RANK="1", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29500", TORCHELASTIC_RUN_ID="none", GROUP_RANK="0")
    s = launch(env)
    assert type(s.cluster_environment).__name__ == "TorchElasticEnvironment" and s.global_rank == 1


@pytest.mark.parametrize("precision", ["16-true", "64-true"])
def test_unsupported_precision_is_refused_in_one_line_naming_the_supported(launch, precision):
    with pytest.raises(ValueError) as e:
        launch({}, precision=precision)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"AxgridStrategy: precision={precision!r} is not supported")
    assert message.endswith("use one of '32-true', 'bf16-mixed', 'bf16-true'")
