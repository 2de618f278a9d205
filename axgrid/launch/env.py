"""Who am I, how many are we, and where do we meet: read from torchrun, mpirun/mpiexec, srun, or nothing.

:func:`read_placement` is the only place that reads launcher variables: a table, :data:`LAUNCHERS`, innermost
launcher first (torchrun; Open MPI, Hydra, Cray PALS; an srun task; another PMI process manager), where the first
row whose variables are all set decides. A launcher started inside another sets its own variables beside the outer
one's, so it comes first: torchrun inside ``srun --mpi=pmix``, mpiexec inside a batch script (whose own step's
``SLURM_PROCID=0`` and ``SLURM_NTASKS`` reach every rank). Each row is chosen by which variable *names* are set,
never by their values, so every rank of a job takes the same row.

Under ``srun`` the Slurm variables describe the task, whatever MPI plugin also ran: ``--mpi=pmi2``, ``pmix`` and
``cray_shasta`` add ``PMI_*``, ``PMIX_*`` or ``PALS_*`` variables that agree with them, and the ranks meet on the first
node of the step without MPI (the pip ``mpich`` wheel cannot talk to Cray's PMI, and an MPI that cannot reach its
launcher makes every rank a world of its own, or waits forever). :func:`detect_launch` adds the rendezvous address;
``init_distributed()`` turns its answer into a torch.distributed default process group with a timeout on every
collective. torch is imported only by ``init_distributed``, so the launcher and the scripts' argument checks read
this module without loading it.

A launch that cannot work is refused in one line naming the variables seen and the fix (:class:`LaunchError`): a
rank with no world size, ranks on several nodes with no rendezvous address, an MPI whose world is not the
launcher's, an MPI that does not start.
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
    """The environment does not describe a usable launch. ``rank``: this process's rank where the launcher's
    variables gave one (so that only rank 0 prints the error: :mod:`axgrid.launch.errors`)."""

    def __init__(self, message: str, rank: Optional[int] = None) -> None:
        super().__init__(message)
        self.rank = rank


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
                "PALS_RANKID", "PALS_LOCAL_RANKID", "ALPS_APP_PE", "OMPI_COMM_WORLD_", "MPI_LOCAL", "RANK", "WORLD_SIZE",
                "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


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


def _mpi_rendezvous(env: Mapping[str, str], size: int, rank: int) -> Optional[tuple[str, int]]:
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
                          f"MASTER_ADDR and MASTER_PORT (or launch with srun / axgrid launch)", rank=rank)
    answer = None
    if comm.Get_rank() == 0:
        answer = (env.get("MASTER_ADDR") or socket.gethostname(), free_port())
    answer = comm.bcast(answer, root=0)
    if LAUNCH_JOB_VAR in env and not started_before:
        MPI.Finalize()
    return answer


@dataclass(frozen=True)
class Launcher:
    """One row of :data:`LAUNCHERS`: a launcher, the variables it sets in every process it starts (``sign``: all of
    them present, on every rank alike, means this launcher started this process), and the variables its rank, world
    size, local rank and local size are read from (the first one set wins)."""

    name: str
    sign: tuple[str, ...]
    rank: tuple[str, ...]
    size: tuple[str, ...]
    local_rank: tuple[str, ...]
    local_size: tuple[str, ...]
    meet: str   # how the ranks find rank 0: "MASTER_ADDR" (torchrun), "nodelist" (srun), "mpi4py" (an MPI launcher)


#: Who started this process, innermost launcher first: the first row whose ``sign`` is all present decides. A launcher
#: started inside another (torchrun under srun, mpiexec inside a batch script or inside srun's one task per node)
#: sets its own variables beside the outer one's, so the inner one is tried first. Every sign is a set of variable
#: *names* a launcher gives every process it starts, so every rank of a job takes the same row.
LAUNCHERS = (
    # torchrun, and `axgrid launch` without mpiexec (axgrid.launch.local sets the same variables)
    Launcher("torchrun", ("RANK", "WORLD_SIZE"), ("RANK",), ("WORLD_SIZE",), ("LOCAL_RANK",), ("LOCAL_WORLD_SIZE",),
             "MASTER_ADDR"),
    # Open MPI's mpirun/mpiexec/prterun (also sets PMIX_RANK); srun never sets OMPI_COMM_WORLD_* before MPI_Init
    Launcher("openmpi", ("OMPI_COMM_WORLD_SIZE",), ("OMPI_COMM_WORLD_RANK",), ("OMPI_COMM_WORLD_SIZE",),
             ("OMPI_COMM_WORLD_LOCAL_RANK",), ("OMPI_COMM_WORLD_LOCAL_SIZE",), "mpi4py"),
    # Hydra: MPICH's and Intel MPI's mpiexec, and `axgrid launch` with mpiexec; MPI_LOCAL* are Hydra's own
    Launcher("mpich", ("MPI_LOCALNRANKS",), ("PMI_RANK",), ("PMI_SIZE",), ("MPI_LOCALRANKID",), ("MPI_LOCALNRANKS",),
             "mpi4py"),
    # HPE Cray PALS's mpiexec (PBS systems); srun's cray_shasta plugin sets PALS_RANKID but no PALS_LOCAL_RANKID
    Launcher("pals", ("PALS_LOCAL_RANKID",), ("PALS_RANKID", "PMI_RANK"), ("PMI_SIZE",),
             ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"), ("PMI_LOCAL_SIZE",), "mpi4py"),
    # an srun task, whatever --mpi plugin also ran (pmi2, pmix, cray_shasta add PMI_*, PMIX_*, PALS_* that agree);
    # a batch script's own step has SLURM_PROCID=0 and SLURM_NTASKS but no SLURM_STEP_NUM_TASKS: it is no launch
    Launcher("slurm", ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"), ("SLURM_PROCID",), ("SLURM_STEP_NUM_TASKS",),
             ("SLURM_LOCALID",), (), "nodelist"),
    # another PMI-1/PMI-2 process manager (MPICH's gforker, MVAPICH's mpirun_rsh), outside an srun task
    Launcher("mpich", ("PMI_RANK", "PMI_SIZE"), ("PMI_RANK",), ("PMI_SIZE",), ("PMI_LOCAL_RANK",), ("PMI_LOCAL_SIZE",),
             "mpi4py"),
)
#: Launchers whose ranks agree on the rendezvous through mpi4py (when ``MASTER_ADDR``/``MASTER_PORT`` are not set).
MPI_LAUNCHERS = tuple(sorted({row.name for row in LAUNCHERS if row.meet == "mpi4py"}))
#: Rank variables a launcher sets without a world size; seen with no row above, the launch cannot be read.
RANK_ONLY = ("PMIX_RANK", "PALS_RANKID", "ALPS_APP_PE", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
#: Rank and size variables an srun MPI plugin adds beside SLURM_*: they must agree with the task.
SRUN_PLUGIN_RANK, SRUN_PLUGIN_SIZE = ("PMI_RANK", "PMIX_RANK", "PALS_RANKID"), ("PMI_SIZE",)
#: The fix a launch that cannot be read is told.
HOW_TO_LAUNCH = ("start the ranks with srun, mpiexec, torchrun or axgrid launch, or set RANK, WORLD_SIZE, LOCAL_RANK, "
                 "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every rank")


@dataclass(frozen=True)
class Placement:
    """Where this process is in the job, as its launcher's variables say: :func:`read_placement`'s answer."""

    launcher: str          # a name in LAUNCHERS, or "single"
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    meet_at: str           # "MASTER_ADDR" | "SLURM_STEP_NODELIST" (its first node) | "mpi4py" | "127.0.0.1"


def _tasks_on_node(per_node: str, node: int) -> Optional[int]:
    """Tasks on node ``node`` of a Slurm ``2(x3),1`` list (None when it does not parse)."""
    counts: list[int] = []
    for part in per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node] if 0 <= node < len(counts) else None


def _claimed_by(row: Launcher, env: Mapping[str, str]) -> bool:
    """Whether ``row``'s launcher started this process: its sign is set, and (srun) no MPI launcher's world of
    another size runs inside the task (PMI_SIZE differing from the step's size, alike on every rank)."""
    if not all(env.get(v, "") != "" for v in row.sign):
        return False
    if row.name == "slurm":
        plugin_size = _int(env, *SRUN_PLUGIN_SIZE)
        return plugin_size is None or plugin_size == _int(env, "SLURM_STEP_NUM_TASKS")
    return True


def read_placement(env: Mapping[str, str]) -> Placement:
    """Who this process is, from the launcher's variables in ``env`` alone: the first row of :data:`LAUNCHERS` that
    claims it (innermost launcher first), else one process on its own. Reads nothing else and starts nothing (no MPI),
    so every rank decides the same way from the same variable names.

    Refused in one line naming the variables seen and the fix (:class:`LaunchError`): a rank variable with no world
    size (``PMIX_RANK``, ``ALPS_APP_PE`` ... outside an srun task), a launcher's rank outside its world, an srun MPI
    plugin's rank that is not the task's, and (torchrun) ranks on several nodes without ``MASTER_ADDR``.
    """
    row = next((r for r in LAUNCHERS if _claimed_by(r, env)), None)
    if row is None:
        partial = [v for v in RANK_ONLY if env.get(v, "") != ""]
        if partial:
            rank = _int(env, partial[0])
            raise LaunchError(f"this process has a rank from a launcher ({partial[0]}={env[partial[0]]}) but no world "
                              f"size ({_seen(env)}): {HOW_TO_LAUNCH}", rank=rank)
        return Placement("single", 0, 1, 0, 1, "MASTER_ADDR" if "MASTER_ADDR" in env else "127.0.0.1")
    rank, size = _int(env, *row.rank), _int(env, *row.size)
    if rank is None or size is None:
        raise LaunchError(f"{row.name} started this process but set no {'rank' if rank is None else 'world size'} "
                          f"({_seen(env)}): {HOW_TO_LAUNCH}", rank=rank)
    if size < 1 or not 0 <= rank < size:
        raise LaunchError(f"launcher {row.name} gave rank {rank} of world size {size}; expected 0 <= rank < size "
                          f"({_seen(env)})", rank=rank)
    local = _int(env, *row.local_rank, default=0)
    local_size = _int(env, *row.local_size, default=None)
    if row.name == "slurm":
        plugin_rank = _int(env, *SRUN_PLUGIN_RANK)
        if plugin_rank is not None and plugin_rank != rank:
            raise LaunchError(f"srun's task says rank {rank} of {size} but the MPI plugin's variables say rank "
                              f"{plugin_rank} of {_int(env, *SRUN_PLUGIN_SIZE) or size} ({_seen(env)}): start the "
                              f"ranks with one launcher", rank=rank)
        local_size = _tasks_on_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""), _int(env, "SLURM_NODEID", default=0))
    local_size = size if local_size is None else local_size
    assert local is not None
    if "MASTER_ADDR" in env and (row.meet != "mpi4py" or "MASTER_PORT" in env):
        meet = "MASTER_ADDR"
    elif row.meet == "nodelist" and (env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")):
        meet = "SLURM_STEP_NODELIST"
    elif row.meet == "mpi4py":
        meet = "mpi4py"
    elif size > local_size:
        raise LaunchError(f"{size} ranks on several nodes ({local_size} on this one) but no MASTER_ADDR "
                          f"({_seen(env)}): set MASTER_ADDR to the first node's address", rank=rank)
    else:
        meet = "127.0.0.1"
    return Placement(row.name, rank, size, local, local_size, meet)


def detect_launch(env: Optional[Mapping[str, str]] = None, use_mpi: bool = True) -> LaunchEnv:
    """This process's :class:`LaunchEnv`: :func:`read_placement`, then the rendezvous address and port.

    ``MASTER_ADDR``/``MASTER_PORT`` always win. Under srun the ranks meet on the first node of the step, on a port
    derived from the job id. Under an MPI launcher (``use_mpi``), mpi4py (when present) lets rank 0 choose the
    address and a free port; without it, ranks on several nodes need ``MASTER_ADDR``. ``AXGRID_RUN_DIR`` becomes
    ``run_dir``.
    """
    env = os.environ if env is None else env
    p = read_placement(env)
    if p.launcher == "single":
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", 0)) or free_port()
    elif p.meet_at == "mpi4py":
        met = _mpi_rendezvous(env, p.world_size, p.rank) if use_mpi and p.world_size > 1 else None
        if met is not None:
            addr, port = met
        elif p.local_world_size >= p.world_size or not use_mpi:
            addr, port = env.get("MASTER_ADDR", "127.0.0.1"), _port_from_job(env)
        else:
            raise LaunchError(f"{p.world_size} MPI ranks on several nodes ({p.local_world_size} on this one), no "
                              f"mpi4py to agree on a rendezvous and no MASTER_ADDR ({_seen(env)}): pip install "
                              f"'axgrid[mpi]' or set MASTER_ADDR and MASTER_PORT", rank=p.rank)
    else:
        nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
        addr = {"MASTER_ADDR": env.get("MASTER_ADDR"), "127.0.0.1": "127.0.0.1"}.get(p.meet_at) or nodes[0]
        port = _port_from_job(env)
    return LaunchEnv(p.rank, p.world_size, p.local_rank, p.local_world_size, addr, port, p.launcher,
                     env.get(RUN_DIR_VAR) or None)


def init_distributed(launch: LaunchEnv, backend: str, timeout_s: float = 600.0, device=None) -> str:
    """Create the default process group for ``launch`` with ``backend`` (the caller's choice: ``axgrid.init`` takes
    :func:`axgrid.device.default_backend` when none is given); returns it.

    ``device``: the rank's GPU (a ``torch.device``, made current by :func:`axgrid.device.choose_device`) for a GPU
    backend: the group is bound to it (``device_id``), so NCCL starts at once and splits its communicator for the
    grid's subgroups instead of building each from scratch. Every collective on the group (and on groups made
    later with the same timeout) fails after ``timeout_s`` instead of hanging.
    """
    import torch.distributed as dist
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
