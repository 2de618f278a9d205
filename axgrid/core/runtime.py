"""What parallel layers run with on a grid, and :func:`init`, which builds a grid and its runtime.

A :class:`Runtime` is the one visible object holding the runtime machinery: the configuration, the GEMM, the tracer, the
weight source (:class:`~axgrid.tensor_parallel.overlap.WeightGather` or, with OAG, the prefetcher), the gradient sink
(:class:`~axgrid.tensor_parallel.overlap.GradientSink` or, with ORS, the pipeline), the data parallelism over d
(:class:`~axgrid.data_parallel.gradients.DataParallel`: the buckets of :mod:`axgrid.data_parallel.buckets`), the one end
of every backward pass that runs their steps in order (:class:`~axgrid.core.backward.BackwardPass`) and the stream of
per-layer seeds. Every piece is always present, so layers call them without asking which overlap switches are on. Layers
take it from their grid (``layer.runtime = grid.runtime``).
"""
from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import replace
from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist

from ..launch import flight, teardown
from .config import GemmFn, RuntimeConfig
from ..device import Device, choose_device, default_backend, of
from .backward import BackwardPass
from ..data_parallel.gradients import DataParallel
from .grid import Grid, make_current, refuse_if_active, release_at_exit
from ..launch.env import MPI_LAUNCHERS, LaunchEnv, detect_launch, grid_shape_for, init_distributed, launch_dir
from ..spec.layout import GridError, GridShape, RankLayout, check_order
from ..tensor_parallel.overlap import GradientPipeline, GradientSink, WeightGather, WeightPrefetcher
from ..metrics.trace import Tracer


def matmul(a: torch.Tensor, b: torch.Tensor, role: str) -> torch.Tensor:
    """The default GEMM: ``a @ b`` (``role`` is "forward", "input_grad" or "weight_grad")."""
    return a @ b


def _autocast_gemm(fn: GemmFn) -> GemmFn:
    """``fn`` with its inputs cast to the autocast dtype when autocast is on (what ``a @ b`` would compute in)."""
    def gemm(a: torch.Tensor, b: torch.Tensor, role: str) -> torch.Tensor:
        if torch.is_autocast_enabled(a.device.type):
            dt = torch.get_autocast_dtype(a.device.type)
            a, b = a.to(dt), b.to(dt)
        return fn(a, b, role)
    return gemm


def _traced_gemm(fn: GemmFn, tracer: Tracer) -> GemmFn:
    """``fn`` with every call recorded as a compute span."""
    def gemm(a: torch.Tensor, b: torch.Tensor, role: str) -> torch.Tensor:
        with tracer.compute(f"gemm {role} {tuple(a.shape)}x{tuple(b.shape)}"):
            return fn(a, b, role)
    return gemm


class LayerSeeds:
    """Seeds for layers built without one: hashed from the grid's seed and the construction order, so every rank
    draws the same sequence (SPMD construction order)."""

    def __init__(self, seed: int) -> None:
        self.seed, self.count = seed, 0

    def next(self) -> int:
        self.count += 1
        h = hashlib.sha256(f"{self.seed}:{self.count}".encode()).digest()
        return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


class Runtime:
    """The machinery parallel layers run with on ``grid`` (see the module docstring).

    ``gemm``: the GEMM layers call, ``(a, b, role) -> a @ b`` (:func:`matmul` unless configured or traced).
    ``gemm_fn``: ``config.gemm`` or the ``kernels.GemmTuner`` built for ``config.gemm_tuning`` (None: matmul).
    ``weights``: how a layer gets its weight block. ``grads``: where its gradient collectives go. ``dp``: the
    data-parallel buckets and their collectives over d (``zero`` and ODP as configured). ``backward``: the steps
    at the beginning and end of every backward pass.
    """

    def __init__(self, grid: Grid, config: RuntimeConfig, seed: int) -> None:
        self.config = config
        self.tracer: Optional[Tracer] = grid.comm.tracer
        self.gemm_fn: Optional[GemmFn] = config.gemm or (
            _gemm_tuner(grid, config) if config.gemm_tuning != "off" else None)
        gemm = _autocast_gemm(self.gemm_fn) if self.gemm_fn is not None else matmul
        self.gemm: GemmFn = _traced_gemm(gemm, self.tracer) if self.tracer is not None else gemm
        self.gemm_is_matmul = self.gemm is matmul    # then a bias can ride in the GEMM (torch.addmm)
        ov = config.overlap
        keep = ov.keep_gathered_weights
        # one end of the backward: the prefetcher forgets the pass, the ORS pipeline hands its last gradients on,
        # then the data-parallel buckets post what is left and complete (the order matters: each feeds the next)
        self.backward = BackwardPass()
        arm = self.backward.arm
        self.grads = GradientPipeline(grid.comm, ov.oar, lambda p: self.dp.grad_ready(p), arm) \
            if ov.ors else GradientSink(grid.comm, ov.oar)
        self.dp = DataParallel(grid.comm, config.zero, config.bucket_bytes, ov.odp, delivered=self.grads.delivers,
                               arm=arm, reduce_dtype=config.grad_reduce_dtype)
        self.weights = WeightPrefetcher(grid.comm, keep, self.dp.before_use, arm) if ov.oag and grid.size("z") > 1 \
            else WeightGather(grid.comm, keep, self.dp.before_use)
        self.backward.begin = [self.dp.begin_backward]
        self.backward.end = [self.weights.end_of_backward, self.grads.finish, self.dp.end_of_backward]
        self.seeds = LayerSeeds(seed)

    def grad_dtype(self, param: torch.Tensor) -> torch.dtype:
        """The dtype ``param``'s gradient is reduced in (``RuntimeConfig.grad_reduce_dtype``)."""
        return self.config.grad_reduce_dtype or param.dtype

    def close(self) -> None:
        """Complete what is in flight (a prefetch, gradient collectives, parameter all-gathers)."""
        self.weights.drop()
        self.grads.finish()
        self.dp.finish()

    def __deepcopy__(self, memo: dict) -> "Runtime":
        """Shared, like the grid: copies of a model run with the same machinery."""
        return self


def _gemm_tuner(grid: Grid, config: RuntimeConfig) -> GemmFn:
    """A kernels.GemmTuner whose decisions rank 0 of each x-y group makes for the whole group."""
    from .. import kernels   # optional: only with gemm_tuning on
    agreement = kernels.Agreement(grid.index("xy"), lambda obj, src: grid.comm.broadcast_object(obj, "xy", src))
    return kernels.GemmTuner(config.gemm_tuning, cache_path=config.gemm_cache, group=agreement)


def build_grid(layout: RankLayout, launch: LaunchEnv, backend: str, config: RuntimeConfig, owns_world: bool,
               hosts: Sequence[str], seed: int, device: Device, job: Optional[str] = None) -> Grid:
    """A grid over an initialised default group, with its runtime attached (collective over the world).
    ``job``: the job's name, agreed by every rank (:func:`axgrid.launch.flight.job_name`; None: this rank's own)."""
    grid = Grid(layout, launch, backend, config, owns_world, hosts, device, job)
    grid.runtime = Runtime(grid, config, seed)
    return grid


def init(gx: Union[int, str, Sequence[int], GridShape], gy: Optional[int] = None, gz: Optional[int] = None,
         gdata: Optional[int] = None, order: str = "xyzd", *, config: Optional[RuntimeConfig] = None,
         backend: Optional[str] = None, timeout_s: Optional[float] = None,
         device: Union[None, str, torch.device, Device] = None, cp: int = 1, ep: int = 1) -> Grid:
    """Build the grid and its runtime on all ranks of the job. Every rank must call it with the same arguments.

    ``gx`` may be a whole grid as a string ``"2x2x2x1"`` (or ``"2x2x2"``: Gdata inferred). With integers,
    missing ``gy``/``gz`` are 1 and ``gdata`` is inferred from the world size. Errors about the grid (and ``zero`` > 0
    with Gd = 1) are raised on every rank, identically, before any collective is posted.

    ``device``: where this rank computes. None: under NCCL/RCCL the GPU of its local rank (more ranks on a node
    than GPUs is refused), bound to the process group; in a process group the program created, the group's bound
    device or the GPU the program made current; the CPU under gloo. A :class:`axgrid.device.Device` is used as
    given (a dry run's fake GPU, :mod:`axgrid.dryrun.harness`).

    ``cp``: the context-parallel size: each sequence split over ``cp`` ranks of the z·d token plane (group ``"c"``,
    :mod:`axgrid.context_parallel`); a size the grid does not take is refused here, in one line naming those it does.

    ``ep``: the expert-parallel size: a mixture-of-experts model's experts spread over ``ep`` ranks of d (group
    ``"e"``; the ranks holding the same experts form group ``"r"``; :mod:`axgrid.expert_parallel`); it must divide Gd.
    """
    config = config or RuntimeConfig()
    if timeout_s is not None:
        config = replace(config, timeout_s=timeout_s)
    check_order(order)
    refuse_if_active()
    owns_world = not dist.is_initialized()
    if owns_world:
        launch = detect_launch(use_mpi=False)   # no MPI rendezvous (a collective) before the checks below
    else:
        launch = _launch_from_world()
    teardown.install(release_at_exit, launch.world_size)   # a rank failing from here on ends at once
    if isinstance(gx, (str, GridShape)) or not isinstance(gx, int):
        if gy is not None or gz is not None or gdata is not None:
            raise GridError("give the grid either as one spec (e.g. '2x2x2x1') or as gx, gy, gz, gdata, not both")
        shape = grid_shape_for(gx, launch)
    else:
        sizes = [gx, 1 if gy is None else gy, 1 if gz is None else gz]
        shape = grid_shape_for(sizes if gdata is None else sizes + [gdata], launch)
    layout = RankLayout(shape, order, cp, ep)
    if config.zero and shape.gd == 1:
        raise GridError(f"RuntimeConfig(zero={config.zero}) on grid {shape}: Gd = 1, so there is nothing to shard "
                        f"over d; use zero=0, or a grid with Gd > 1")
    if owns_world:
        if launch.launcher in MPI_LAUNCHERS:
            launch = detect_launch()            # now agree on the rendezvous address through mpi4py
        used = backend or default_backend()
        dev = device if isinstance(device, Device) else of(choose_device(launch, used, device))
        used = init_distributed(launch, used, config.timeout_s, dev.torch if dev.is_gpu else None)
        teardown.install(release_at_exit, launch.world_size)   # again: run before mpi4py's MPI_Finalize
    else:
        used = dist.get_backend()
        dev = device if isinstance(device, Device) else of(choose_device(launch, used, device, joining=True))
    seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    folder = launch_dir()   # under axgrid launch its name tags the job's flight records, for the launcher to find
    job = flight.job_name(os.path.basename(folder) if folder else None)
    if used == "fake":      # a dry run (torch's fake process group): collectives move no data, nothing to agree
        hosts: list[Optional[str]] = [socket.gethostname()] * launch.world_size
        seed = config.seed if config.seed is not None else 0
    else:
        hosts = [None] * launch.world_size
        dist.all_gather_object(hosts, socket.gethostname())
        # rank 0's choices win: the seed, drawn from the OS so the user's torch RNG stream is left untouched, and
        # the job's name (a reused run folder holds one folder of flight records per job)
        agreed = [seed, job]
        dist.broadcast_object_list(agreed, src=0)
        seed, job = agreed
    grid = build_grid(layout, launch, used, config, owns_world, [h or "?" for h in hosts], seed, dev, job)
    make_current(grid)
    return grid


def _launch_from_world() -> LaunchEnv:
    """The launch description of an already-initialised default group (its rank and size win)."""
    seen = detect_launch(use_mpi=False)
    return replace(seen, rank=dist.get_rank(), world_size=dist.get_world_size(), launcher="existing")
