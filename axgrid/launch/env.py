"""Who am I, how many are we, and where do we meet: read from mpirun/mpiexec, srun or torchrun.

``detect_launch()`` is the only place that reads launcher variables. ``init_distributed()`` turns its answer
into a torch.distributed default process group with a timeout on every collective. torch is imported only by
``init_distributed``, so the launcher and the scripts' argument checks read this module without loading it.

Under ``srun`` the Slurm variables describe the task, whatever MPI plugin also ran: ``--mpi=pmi2``, ``pmix`` or
Cray's ``cray_shasta`` add ``PMI_*`` (or ``PMIX_*``) variables that agree with them, and the ranks meet on the first
node of the step without MPI (the pip ``mpich`` wheel cannot talk to Cray's PMI, and an MPI that cannot reach its
launcher makes every rank a world of its own, or waits forever). ``PMI_*`` that disagree with ``SLURM_PROCID`` come
from an MPI launcher running inside a Slurm job (Hydra's ``mpiexec`` in an allocation), and win.

A launch that cannot work is refused in one line naming the variables seen (:class:`LaunchError`): ranks on
several nodes with no rendezvous address, an MPI whose world is not the launcher's, an MPI that does not start.
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

from ..spec.layout import GridError, GridShape, grid_sizes


#: Set by ``axgrid launch`` in every process of a job (see axgrid.launch.proctree).
LAUNCH_JOB_VAR = "AXGRID_LAUNCH_JOB"
#: Set by ``axgrid launch``: the job's folder, where a rank records its one-line error (axgrid.launch.errors).
LAUNCH_DIR_VAR = "AXGRID_LAUNCH_DIR"
#: The run's directory (``axgrid launch`` sets it; a batch script may): the flight recorder writes there.
RUN_DIR_VAR = "AXGRID_RUN_DIR"
#: Seconds MPI may take to start (mpi4py's MPI_Init) before the rank gives up with a one-line error
#: (``AXGRID_MPI_START_S`` overrides it).
MPI_START_LIMIT_S = 120.0


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
    launcher: str  # "torchrun" | "openmpi" | "mpich" | "slurm" | "single" (| "existing": a group made by the program)
    run_dir: Optional[str] = None   # $AXGRID_RUN_DIR


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


#: The variables an error about the launch names (prefixes).
_LAUNCH_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "PMI_", "PMIX_RANK",
                "OMPI_COMM_WORLD_", "MPI_LOCAL", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT")


def _seen(env: Mapping[str, str], prefixes: tuple[str, ...] = _LAUNCH_VARS) -> str:
    """The launcher variables of ``env``, for an error message (``NAME=value`` ...)."""
    names = sorted(k for k in env if k.startswith(prefixes) and not k.endswith(("_FD", "_PORT_FD")))
    return " ".join(f"{k}={env[k]}" for k in names) or "no launcher variables"


#: The watchdog process of :class:`_StartWatch`: waits for the pipe to close, else prints and ends the rank.
_WATCHDOG = ("import os, select, signal, sys\n"
             "fd, pid, limit = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])\n"
             "if not select.select([fd], [], [], limit)[0]:\n"
             "    sys.stderr.write(sys.argv[4] + '\\n'); sys.stderr.flush(); os.kill(pid, signal.SIGKILL)\n")


class _StartWatch:
    """Ends this process with a one-line error when MPI has not started within ``limit_s``. MPI_Init blocks in C
    holding the GIL, so no Python thread or signal handler of this process can act: a small watchdog process
    (started before, fork+exec) waits on a pipe that :meth:`done` closes, and otherwise prints the line and
    SIGKILLs this rank (exit 137, which ends the job under any launcher)."""

    def __init__(self, env: Mapping[str, str], limit_s: float) -> None:
        import subprocess
        msg = (f"axgrid: MPI did not start within {limit_s:g} s (mpi4py's MPI_Init is waiting for a process manager "
               f"it cannot reach); this rank sees {_seen(env)}: launch with srun, mpiexec or axgrid launch, or set "
               f"MASTER_ADDR and MASTER_PORT")
        rfd, self._wfd = os.pipe()
        self._proc = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(rfd), str(os.getpid()), str(limit_s), msg],
                                      pass_fds=(rfd,), stdin=subprocess.DEVNULL, close_fds=True)
        os.close(rfd)

    def done(self) -> None:
        os.close(self._wfd)
        try:
            self._proc.wait(timeout=10)
        except Exception:
            self._proc.kill()


def _mpi_rendezvous(env: Mapping[str, str], size: int) -> Optional[tuple[str, int]]:
    """Use mpi4py (when installed) so rank 0 chooses the address and a free port and tells the others.

    Refused (:class:`LaunchError`) when MPI's world is not the launcher's ``size`` (an MPI that cannot talk to the
    launcher starts every rank as a world of one), and ends the rank when MPI does not start within
    ``MPI_START_LIMIT_S`` (:class:`_StartWatch`). Under ``axgrid launch`` (which ends the ranks itself when one fails)
    MPI is finalised right here, unless the program had started it: a failing rank then exits with its own code
    instead of waiting in MPI_Finalize for the others. Under a bare mpiexec MPI stays up, so a rank leaving without
    MPI_Finalize makes Hydra end the job.
    """
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return env["MASTER_ADDR"], int(env["MASTER_PORT"])
    started_before = "mpi4py.MPI" in sys.modules
    try:
        import mpi4py  # noqa: F401  (cheap: MPI itself starts on importing mpi4py.MPI)
    except ImportError:
        return None
    watch = _StartWatch(env, float(env.get("AXGRID_MPI_START_S") or MPI_START_LIMIT_S))
    try:
        from mpi4py import MPI
    finally:
        watch.done()
    if MPI.Is_finalized():      # a second init under axgrid launch: fall back to MASTER_PORT or the job id
        return None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != size:
        raise LaunchError(f"mpi4py's MPI sees a world of {comm.Get_size()} process(es) but the launcher started "
                          f"{size} ({_seen(env)}): this MPI cannot talk to the launcher's process manager; set "
                          f"MASTER_ADDR and MASTER_PORT (or launch with srun / axgrid launch)")
    answer = None
    if comm.Get_rank() == 0:
        answer = (env.get("MASTER_ADDR") or socket.gethostname(), free_port())
    answer = comm.bcast(answer, root=0)
    if LAUNCH_JOB_VAR in env and not started_before:
        MPI.Finalize()
    return answer


def _slurm_task(env: Mapping[str, str]) -> Optional[tuple[int, int]]:
    """(rank, size) of an srun task, or None outside one. ``SLURM_STEP_NUM_TASKS`` (srun's step) wins over
    ``SLURM_NTASKS`` (also set in a batch script, where mpirun's ranks inherit it)."""
    if "SLURM_PROCID" not in env or not ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env):
        return None
    return _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")  # type: ignore[return-value]


def _mpi_task(env: Mapping[str, str]) -> Optional[tuple[int, int]]:
    """(rank, size) an MPI process manager set (Open MPI, Hydra/PMI-1/PMI-2, PMIx), or None."""
    rank = _int(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
    size = _int(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    if rank is None:
        return None
    if size is None:
        raise LaunchError(f"an MPI rank variable is set but no world size ({_seen(env)}): launch with a complete "
                          f"launcher (srun, mpiexec, torchrun)")
    return rank, size


def detect_launch(env: Optional[Mapping[str, str]] = None, use_mpi: bool = True) -> LaunchEnv:
    """Read rank, world size, local rank and the rendezvous address from the launcher's variables.

    Checked in this order: torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``); an srun task (``SLURM_PROCID``,
    ``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS``, ``SLURM_LOCALID``; master = first host of the step's node list),
    also when an MPI plugin set ``PMI_*``/``PMIX_RANK`` that agree with it; Open MPI (``OMPI_COMM_WORLD_*``),
    MPICH/Hydra (``PMI_RANK``/``PMI_SIZE``/``MPI_LOCALRANKID``); with none of them, a single process. Under MPI,
    mpi4py (when present) agrees on address and port; without it, ranks on several nodes need ``MASTER_ADDR``.
    ``MASTER_ADDR``/``MASTER_PORT`` always win. ``AXGRID_RUN_DIR`` becomes ``run_dir``.
    """
    env = os.environ if env is None else env
    slurm, mpi = _slurm_task(env), _mpi_task(env)
    if slurm is not None and mpi is not None and mpi != slurm and not ("OMPI_COMM_WORLD_RANK" in env
                                                                     or "MPI_LOCALRANKID" in env):
        raise LaunchError(f"srun's task says rank {slurm[0]} of {slurm[1]} but the MPI plugin's variables say rank "
                          f"{mpi[0]} of {mpi[1]} ({_seen(env)}): start the ranks with one launcher")
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "torchrun"
        rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK", default=0)
        local_size = _int(env, "LOCAL_WORLD_SIZE", default=size)
        addr, port = env.get("MASTER_ADDR"), _port_from_job(env)
        if addr is None:
            if size > local_size:
                raise LaunchError(f"{size} ranks on several nodes ({local_size} on this one) but no MASTER_ADDR "
                                  f"({_seen(env)}): set MASTER_ADDR to the first node's address")
            addr = "127.0.0.1"
    elif slurm is not None and (mpi is None or mpi == slurm):
        launcher = "slurm"
        rank, size = slurm
        local = _int(env, "SLURM_LOCALID", "PMI_LOCAL_RANK", default=0)
        local_size = _int(env, "SLURM_NTASKS_PER_NODE", "PMI_LOCAL_SIZE", default=None)
        if local_size is None:
            per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
            local_size = int(re.match(r"\d+", per_node).group()) if re.match(r"\d+", per_node) else size
        nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
                                or env.get("SLURM_NODELIST", ""))
        addr = env.get("MASTER_ADDR") or (nodes[0] if nodes else None)
        if addr is None:
            if size > local_size:
                raise LaunchError(f"srun task {rank} of {size}: no node list and no MASTER_ADDR ({_seen(env)}): "
                                  f"set MASTER_ADDR to the first node's address")
            addr = "127.0.0.1"
        port = _port_from_job(env)
    elif mpi is not None:
        launcher = "openmpi" if "OMPI_COMM_WORLD_RANK" in env else "mpich"
        rank, size = mpi
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", default=0)
        local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", default=None)
        met = _mpi_rendezvous(env, size) if use_mpi and size > 1 else None
        if met is not None:
            addr, port = met
        elif "MASTER_ADDR" in env or local_size is None or local_size >= size or not use_mpi:
            addr, port = env.get("MASTER_ADDR", "127.0.0.1"), _port_from_job(env)
        else:
            raise LaunchError(f"{size} MPI ranks on several nodes ({local_size} on this one), no mpi4py to agree on "
                              f"a rendezvous and no MASTER_ADDR ({_seen(env)}): pip install 'axgrid[mpi]' or set "
                              f"MASTER_ADDR and MASTER_PORT")
        if local_size is None:
            local_size = size
    else:
        launcher = "single"
        rank, size, local, local_size = 0, 1, 0, 1
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", 0)) or free_port()
    assert rank is not None and size is not None and local is not None and local_size is not None
    if size < 1 or not 0 <= rank < size:
        raise LaunchError(f"launcher {launcher} gave rank {rank} of world size {size}; expected 0 <= rank < size")
    return LaunchEnv(rank, size, local, local_size, addr, port, launcher, env.get(RUN_DIR_VAR) or None)


def default_backend() -> str:
    """NCCL where this process sees a GPU (RCCL answers to the same name on ROCm builds), gloo otherwise."""
    from ..device import default_backend as device_default
    return device_default()


def init_distributed(launch: LaunchEnv, backend: Optional[str] = None, timeout_s: float = 600.0,
                     device=None) -> str:
    """Create the default process group for ``launch``; returns the backend used.

    ``device``: the rank's GPU (a ``torch.device``, made current by :func:`axgrid.device.choose_device`) for a GPU
    backend: the group is bound to it (``device_id``), so NCCL starts at once and splits its communicator for the
    grid's subgroups instead of building each from scratch. Every collective on the group (and on groups made
    later with the same timeout) fails after ``timeout_s`` instead of hanging.
    """
    import torch.distributed as dist
    backend = backend or default_backend()
    bind = {"device_id": device} if device is not None and getattr(device, "type", "cpu") == "cuda" else {}
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{launch.master_addr}:{launch.master_port}",
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        **bind,
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
    try:
        return math.prod(grid_sizes(spec))
    except GridError:
        return 1
