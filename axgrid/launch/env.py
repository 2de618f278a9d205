"""Who am I, how many are we, and where do we meet: read from mpirun/mpiexec, srun or torchrun.

``detect_launch()`` is the only place that reads launcher variables. ``init_distributed()`` turns its answer
into a torch.distributed default process group with a timeout on every collective. torch is imported only by
``init_distributed``, so the launcher and the scripts' argument checks read this module without loading it.
"""
from __future__ import annotations

import datetime
import math
import os
import re
import shlex
import socket
import sys
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

from ..spec.layout import GridError, GridShape


#: Set by ``axgrid launch`` in every process of a job (see axgrid.launch.proctree).
LAUNCH_JOB_VAR = "AXGRID_LAUNCH_JOB"
#: Set by ``axgrid launch``: the job's folder, where a rank records its one-line error (axgrid.launch.errors).
LAUNCH_DIR_VAR = "AXGRID_LAUNCH_DIR"


class LaunchError(RuntimeError):
    """The environment does not describe a usable launch."""


@dataclass(frozen=True)
class LaunchEnv:
    """One process's place in the job, and the rendezvous address the job agrees on."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun" | "openmpi" | "mpich" | "slurm" | "single"


def expand_hostlist(nodelist: str) -> list[str]:
    """Expand a Slurm node list: ``"nid[001-003,007],login1"`` -> ``["nid001", "nid002", "nid003", "nid007", "login1"]``."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(\[([^\]]*)\])?([^,]*)", nodelist):
        prefix, ranges, suffix = m.group(1), m.group(3), m.group(4)
        if not prefix and not ranges:
            continue
        if ranges is None:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            if "-" in part:
                lo, hi = part.split("-")
                width = len(lo)
                hosts.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
            else:
                hosts.append(prefix + part + suffix)
    return hosts


def launch_dir(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The job folder of ``axgrid launch`` when this process is one of its ranks (None otherwise)."""
    folder = (os.environ if env is None else env).get(LAUNCH_DIR_VAR)
    return folder if folder and os.path.isdir(folder) else None


def _int(env: Mapping[str, str], *names: str, default: Optional[int] = None) -> Optional[int]:
    for n in names:
        if n in env and env[n] != "":
            try:
                return int(env[n])
            except ValueError:
                raise LaunchError(f"environment variable {n}={env[n]!r} is not an integer") from None
    return default


def free_port() -> int:
    """A TCP port that is free on this host right now."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _port_from_job(env: Mapping[str, str]) -> int:
    """A port all ranks derive alike, without talking: MASTER_PORT, else one from the job id."""
    if "MASTER_PORT" in env:
        return _int(env, "MASTER_PORT")  # type: ignore[return-value]
    job = env.get("SLURM_JOB_ID") or env.get("PMI_ID") or env.get("OMPI_MCA_ess_base_jobid") or "0"
    digits = int(re.sub(r"\D", "", job) or 0)
    return 20000 + digits % 20000


def _mpi_rendezvous(env: Mapping[str, str]) -> Optional[tuple[str, int]]:
    """Use mpi4py (when installed) so rank 0 chooses the address and a free port and tells the others.

    Under ``axgrid launch`` (which ends the ranks itself when one fails) MPI is finalised right here, unless the
    program had started it: a failing rank then exits with its own code instead of waiting in MPI_Finalize for
    the others. Under a bare mpiexec MPI stays up, so a rank leaving without MPI_Finalize makes Hydra end the job.
    """
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return env["MASTER_ADDR"], int(env["MASTER_PORT"])
    started_before = "mpi4py.MPI" in sys.modules
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    if MPI.Is_finalized():      # a second init under axgrid launch: fall back to MASTER_PORT or the job id
        return None
    comm = MPI.COMM_WORLD
    answer = None
    if comm.Get_rank() == 0:
        answer = (env.get("MASTER_ADDR") or socket.gethostname(), free_port())
    answer = comm.bcast(answer, root=0)
    if LAUNCH_JOB_VAR in env and not started_before:
        MPI.Finalize()
    return answer


def detect_launch(env: Optional[Mapping[str, str]] = None, use_mpi: bool = True) -> LaunchEnv:
    """Read rank, world size, local rank and the rendezvous address from the launcher's variables.

    Checked in this order: torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``), Open MPI
    (``OMPI_COMM_WORLD_*``), MPICH/Hydra (``PMI_RANK``/``PMI_SIZE``/``MPI_LOCALRANKID``), Slurm
    (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``, master = first host of ``SLURM_JOB_NODELIST``);
    with none of them, a single process. Under MPI, mpi4py (when present) agrees on address and port.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "torchrun"
        rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK", default=0)
        local_size = _int(env, "LOCAL_WORLD_SIZE", default=size)
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), _port_from_job(env)
    elif "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        launcher = "openmpi" if "OMPI_COMM_WORLD_RANK" in env else "mpich"
        rank = _int(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK")
        size = _int(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
        # (srun --mpi=pmi2/pmix also sets PMI_*: then the local rank comes from Slurm's variables)
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID",
                     default=0)
        local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE",
                          "SLURM_NTASKS_PER_NODE", default=size)
        met = _mpi_rendezvous(env) if use_mpi else None
        addr, port = met if met else (env.get("MASTER_ADDR", "127.0.0.1"), _port_from_job(env))
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        launcher = "slurm"
        rank, size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local = _int(env, "SLURM_LOCALID", default=0)
        local_size = _int(env, "SLURM_NTASKS_PER_NODE", default=None)
        if local_size is None:
            per_node = env.get("SLURM_TASKS_PER_NODE", "")
            local_size = int(re.match(r"\d+", per_node).group()) if re.match(r"\d+", per_node) else size
        nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "")))
        addr = env.get("MASTER_ADDR") or (nodes[0] if nodes else "127.0.0.1")
        port = _port_from_job(env)
    else:
        launcher = "single"
        rank, size, local, local_size = 0, 1, 0, 1
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", 0)) or free_port()
    assert rank is not None and size is not None and local is not None and local_size is not None
    if size < 1 or not 0 <= rank < size:
        raise LaunchError(f"launcher {launcher} gave rank {rank} of world size {size}; expected 0 <= rank < size")
    return LaunchEnv(rank, size, local, local_size, addr, port, launcher)


def default_backend() -> str:
    """NCCL on NVIDIA (RCCL answers to the same name on ROCm builds), gloo on CPU."""
    import torch
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(launch: LaunchEnv, backend: Optional[str] = None, timeout_s: float = 120.0) -> str:
    """Create the default process group for ``launch``; set this rank's GPU from its local rank.

    Returns the backend used. Every collective on the group (and on groups made later with the same
    timeout) fails after ``timeout_s`` instead of hanging.
    """
    import torch
    import torch.distributed as dist
    backend = backend or default_backend()
    if backend == "nccl":
        n = torch.cuda.device_count()
        if n == 0:
            raise LaunchError("backend 'nccl' needs a GPU, but torch sees none; use backend='gloo' on CPU")
        torch.cuda.set_device(launch.local_rank % n)
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{launch.master_addr}:{launch.master_port}",
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return backend


def how_to_launch(ranks: int) -> str:
    """The command that starts this program on ``ranks`` local ranks: ``axgrid launch -n N -- python ARGS``."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    if os.path.basename(argv[0]).startswith("python"):
        argv[0] = "python"
    return f"axgrid launch -n {ranks} -- {shlex.join(argv)}"


def grid_shape_for(spec: Union[str, Sequence[int], GridShape], launch: LaunchEnv) -> GridShape:
    """``GridShape.parse(spec, launch.world_size)``; when this process runs alone (no launcher) and the grid needs
    more ranks, the GridError says how to launch it (:func:`how_to_launch`)."""
    try:
        return GridShape.parse(spec, launch.world_size)
    except GridError:
        needed = _ranks_named(spec)
        if launch.launcher != "single" or needed <= 1:
            raise
        name = spec if isinstance(spec, (str, GridShape)) else "x".join(map(str, spec))
        raise GridError(f"grid {name} needs {needed} ranks, "
                        f"but this process runs alone (no launcher, world size 1): start it with "
                        f"`{how_to_launch(needed)}` (or mpirun/srun/torchrun -n {needed})") from None


def _ranks_named(spec: Union[str, Sequence[int], GridShape]) -> int:
    """The ranks a grid spec names at least (Gx*Gy*Gz when Gdata is left out); 1 when it does not parse."""
    if isinstance(spec, GridShape):
        return spec.size
    parts = spec.lower().replace("×", "x").split("x") if isinstance(spec, str) else list(spec)
    try:
        return math.prod(int(p) for p in parts) if len(parts) in (3, 4) else 1
    except (TypeError, ValueError):
        return 1
