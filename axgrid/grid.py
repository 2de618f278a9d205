"""The runtime grid: process groups along x, y, z, d (and the tensor-parallel block), its communicator,
its configuration, and a readable description of the layout.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import socket
from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist

from . import teardown
from .comm import Communicator, Ledger
from .config import RuntimeConfig
from .launch import LaunchEnv, detect_launch, init_distributed
from .layout import DIMS, Coord, GridError, GridShape, Layout, check_order

#: The groups every grid creates, in this order on every rank.
GROUP_DIMS = ("x", "y", "z", "d", "xy", "xyz")


class Grid:
    """This rank's view of the Gx x Gy x Gz x Gd grid. Made by :func:`axgrid.init`."""

    def __init__(self, layout: Layout, launch: LaunchEnv, backend: str, config: RuntimeConfig,
                 owns_world: bool, hosts: Sequence[str], seed: int) -> None:
        self.layout, self.shape, self.order = layout, layout.shape, layout.order
        self.launch, self.backend, self.config = launch, backend, config
        self.rank, self.world_size = launch.rank, launch.world_size
        self.local_rank = launch.local_rank
        self.coord: Coord = layout.coord(self.rank)
        self.hosts = list(hosts)
        self.seed = seed
        self._owns_world = owns_world
        self._layer_counter = 0
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        timeout = datetime.timedelta(seconds=config.timeout_s)
        self._groups: dict[str, Optional[dist.ProcessGroup]] = {}
        self._all_groups: list[dist.ProcessGroup] = []
        for dims in GROUP_DIMS:
            if self.shape.extent(dims) == 1:
                self._groups[dims] = None
                continue
            mine, every = dist.new_subgroups_by_enumeration(layout.groups(dims), timeout=timeout)
            self._groups[dims] = mine
            self._all_groups.extend(every)
        from .trace import Tracer  # local import: the tracer is optional machinery
        self.tracer = Tracer(self.rank) if config.trace else None
        self.comm = Communicator(self._groups, {d: self.shape.extent(d) for d in GROUP_DIMS},
                                 {d: sorted(layout.group_of(self.rank, d)).index(self.rank) for d in GROUP_DIMS},
                                 backend,
                                 reduce_in_fp32=config.reduce_in_fp32, record_timing=config.record_timing,
                                 tracer=self.tracer)
        self.gemm = config.gemm or (self._gemm_tuner() if config.gemm_tuning != "off" else None)
        from .overlap import GradientPipeline, WeightPrefetcher
        ov = config.overlap
        self.prefetcher = WeightPrefetcher(self) if ov.oag and self.shape.gz > 1 else None
        self.pending_grads = GradientPipeline(self, ov.ors, ov.odp) if (ov.ors or ov.odp) else None
        from .data_parallel import BucketBuffers
        self.grad_buffers = BucketBuffers()   # sync_gradients' flat buckets, kept across steps

    def _gemm_tuner(self):
        """A kernels.GemmTuner whose decisions rank 0 of each x-y group makes for the whole group."""
        from . import kernels
        agreement = kernels.Agreement(self.index("xy"), lambda obj, src: self.comm.broadcast_object(obj, "xy", src))
        return kernels.GemmTuner(self.config.gemm_tuning, cache_path=self.config.gemm_cache, group=agreement)

    def no_sync(self):
        """Context manager for all but the last micro-batch of a step: the overlapped data-parallel
        reduction (ODP) is skipped, gradients just accumulate. A no-op without ODP."""
        from contextlib import nullcontext
        return self.pending_grads.no_sync() if self.pending_grads is not None else nullcontext()

    def watch(self, model: "torch.nn.Module") -> None:
        """ODP: reduce every parameter of ``model`` over d as soon as its gradient is final during backward
        (parallel layers register themselves; this adds the rest, e.g. LayerNorm and embeddings)."""
        if self.pending_grads is not None:
            self.pending_grads.watch(model.parameters())

    # -- queries --------------------------------------------------------------------------------------
    @property
    def ledger(self) -> Ledger:
        return self.comm.ledger

    def size(self, dims: str) -> int:
        """Number of ranks along ``dims`` (e.g. ``"x"`` or ``"xyz"``)."""
        return self.shape.extent(dims)

    def index(self, dims: str) -> int:
        """This rank's position along ``dims`` (first letter fastest)."""
        return self.layout.index_in(self.rank, dims)

    def group(self, dims: str) -> Optional[dist.ProcessGroup]:
        """Process group along ``dims`` (None when it has one rank)."""
        if not self._groups:
            raise GridError(f"grid {self.shape} was destroyed: build a new one with axgrid.init(...)")
        return self._groups[dims]

    def node_of(self, rank: int) -> int:
        """Index of the node (distinct host, in order of first appearance) that ``rank`` runs on."""
        order = list(dict.fromkeys(self.hosts))
        return order.index(self.hosts[rank])

    def next_layer_seed(self) -> int:
        """A seed for the next layer built on this grid: the same on every rank (SPMD construction order)."""
        self._layer_counter += 1
        h = hashlib.sha256(f"{self.seed}:{self._layer_counter}".encode()).digest()
        return int.from_bytes(h[:4], "little") & 0x7FFFFFFF

    def describe(self) -> str:
        """Which ranks form each group, and which groups stay inside a node."""
        lines = [f"grid {self.shape} (Gx x Gy x Gz x Gdata), order {self.order!r} (first letter fastest), "
                 f"{self.world_size} ranks on {len(set(self.hosts))} node(s), backend {self.backend}"]
        lines += self.layout.describe([self.node_of(r) for r in range(self.world_size)], GROUP_DIMS)
        lines.append(f"  this rank {self.rank}: {self.coord}, node {self.node_of(self.rank)} "
                     f"({self.hosts[self.rank]}), local rank {self.local_rank}")
        return "\n".join(lines)

    # -- teardown -------------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Complete what is in flight, then release this grid's groups (and the default group when
        :func:`init` created it). No reference to a group is kept, so gloo joins its threads here, not
        during interpreter shutdown (see :mod:`axgrid.teardown`). The grid cannot be used afterwards."""
        _ACTIVE.discard(id(self))
        if _CURRENT and _CURRENT[0] is self:
            _CURRENT.clear()
        try:
            if self.prefetcher is not None:
                self.prefetcher.drop()
            if self.pending_grads is not None:
                self.pending_grads.finish()
        except Exception:
            pass   # a broken group (e.g. after a timeout) must not stop the release below
        for g in self._all_groups:
            try:
                dist.destroy_process_group(g)
            except Exception:
                pass
        self._all_groups.clear()
        self._groups.clear()           # the communicator shares this dict
        if self._owns_world and dist.is_initialized():
            dist.destroy_process_group()

    def __deepcopy__(self, memo: dict) -> "Grid":
        """A grid is this process's place in the job (process groups, communicator): copies of a model share it."""
        return self

    def __repr__(self) -> str:
        return f"Grid({self.shape}, order={self.order!r}, rank={self.rank}, coord={self.coord})"


# Ids of grids alive in this process: a registry so that init() twice is refused, not a behaviour switch.
_ACTIVE: set[int] = set()
_CURRENT: list[Grid] = []


def init(gx: Union[int, str, Sequence[int], GridShape], gy: Optional[int] = None, gz: Optional[int] = None,
         gdata: Optional[int] = None, order: str = "xyzd", *, config: Optional[RuntimeConfig] = None,
         backend: Optional[str] = None, timeout_s: Optional[float] = None) -> Grid:
    """Build the grid on all ranks of the job. Every rank must call it with the same arguments.

    ``gx`` may be a whole grid as a string ``"2x2x2x1"`` (or ``"2x2x2"``: Gdata inferred). With integers,
    missing ``gy``/``gz`` are 1 and ``gdata`` is inferred from the world size. Errors about the grid are
    raised on every rank, identically, before any collective is posted.
    """
    config = config or RuntimeConfig()
    if timeout_s is not None:
        from dataclasses import replace
        config = replace(config, timeout_s=timeout_s)
    check_order(order)
    if _ACTIVE:
        raise GridError("axgrid.init was called twice in this process: a grid is already active; call "
                        "grid.destroy() first to build another")
    owns_world = not dist.is_initialized()
    if owns_world:
        launch = detect_launch(use_mpi=False)   # no MPI rendezvous (a collective) before the checks below
    else:
        launch = _launch_from_world()
    teardown.install(_release_at_exit, launch.world_size)   # a rank failing from here on ends at once
    if isinstance(gx, (str, GridShape)) or not isinstance(gx, int):
        if gy is not None or gz is not None or gdata is not None:
            raise GridError("give the grid either as one spec (e.g. '2x2x2x1') or as gx, gy, gz, gdata, not both")
        shape = GridShape.parse(gx, launch.world_size)
    else:
        sizes = [gx, 1 if gy is None else gy, 1 if gz is None else gz]
        shape = GridShape.parse(sizes if gdata is None else sizes + [gdata], launch.world_size)
    layout = Layout(shape, order)
    if owns_world:
        if launch.launcher in ("mpich", "openmpi"):
            launch = detect_launch()            # now agree on the rendezvous address through mpi4py
        used = init_distributed(launch, backend, config.timeout_s)
        teardown.install(_release_at_exit, launch.world_size)   # again: run before mpi4py's MPI_Finalize
    else:
        used = dist.get_backend()
    hosts: list[Optional[str]] = [None] * launch.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    # rank 0's choice wins; drawn from the OS so the user's torch RNG stream is left untouched
    seeds = [config.seed if config.seed is not None else int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF]
    dist.broadcast_object_list(seeds, src=0)
    grid = Grid(layout, launch, used, config, owns_world, [h or "?" for h in hosts], seeds[0])
    _ACTIVE.add(id(grid))
    _CURRENT[:] = [grid]
    return grid


def _release_at_exit() -> None:
    """atexit: destroy a grid the program left alive, while the interpreter is still whole."""
    if _CURRENT and id(_CURRENT[0]) in _ACTIVE:
        _CURRENT[0].destroy()


def _launch_from_world() -> LaunchEnv:
    """The launch description of an already-initialised default group (its rank and size win)."""
    from dataclasses import replace
    seen = detect_launch(use_mpi=False)
    return replace(seen, rank=dist.get_rank(), world_size=dist.get_world_size(), launcher="existing")


def current_grid() -> Grid:
    """The grid made by the last :func:`init` in this process (layers default to it)."""
    if not _CURRENT or id(_CURRENT[0]) not in _ACTIVE:
        raise GridError("no axgrid grid is active: call axgrid.init(...) first (or pass grid=...)")
    return _CURRENT[0]
