"""The grid: this rank's place in the Gx x Gy x Gz x Gd layout, its process groups along x, y, z, d (and the
tensor-parallel block), and the communicator over them. Nothing else: what layers run with (config, GEMM,
weight gathering, gradient sink, seeds) is the grid's :class:`~axgrid.core.runtime.Runtime`, built next to it by
:func:`axgrid.init`; the grid keeps a reference, ``grid.runtime``, so that one handle reaches both.
"""
from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, ContextManager, Optional, Sequence

import torch
import torch.distributed as dist

from .comm import Communicator, Ledger
from .config import RuntimeConfig
from ..device import Device
from ..device.clocks import clock_for
from ..launch.flight import FlightRecorder
from ..launch.report import cause_elsewhere
from ..launch.env import LaunchEnv
from ..spec.layout import Coord, GridError, RankLayout
from ..metrics.trace import Tracer

if TYPE_CHECKING:
    from .runtime import Runtime

#: The groups every grid creates, in this order on every rank.
GROUP_DIMS = ("x", "y", "z", "d", "xy", "xyz")
#: The context-parallel group's name (``RankLayout.cp`` ranks splitting the tokens of z and d; made after the others,
#: only when ``cp`` > 1; :mod:`axgrid.spec.layout`).
CP_DIM = "c"
#: The expert-parallel group's name (``RankLayout.ep`` ranks of one x·y·z position inside d, holding different
#: experts) and the expert-replica group's (the ranks holding the same experts); made after the others, only when
#: ``ep`` > 1 (:mod:`axgrid.spec.layout`, :mod:`axgrid.expert_parallel`).
EP_DIM, REPLICA_DIM = "e", "r"


class Grid:
    """This rank's view of the Gx x Gy x Gz x Gd grid. Made by :func:`axgrid.init`.

    With ``layout.cp`` > 1 it also has the context-parallel group ``"c"`` (``grid.size("c")``, ``grid.index("c")``,
    ``grid.comm.all_gather(t, "c")``): :mod:`axgrid.context_parallel`.

    ``config`` sets the groups' timeout and the communicator's options (``reduce_in_fp32``, ``record_timing``,
    ``trace``, the flight recorder); it is not kept. ``runtime`` is attached by :func:`axgrid.init`.
    ``device``: the :class:`axgrid.device.Device` this rank computes on (``grid.accelerator``; ``grid.device`` is
    its ``torch.device``). ``job``: the job's name, the same on every rank (the flight recorder's folder,
    :mod:`axgrid.launch.flight`; None: one chosen by this rank).
    """

    runtime: "Runtime"

    def __init__(self, layout: RankLayout, launch: LaunchEnv, backend: str, config: RuntimeConfig,
                 owns_world: bool, hosts: Sequence[str], device: Device, job: Optional[str] = None) -> None:
        self.layout, self.shape, self.order = layout, layout.shape, layout.order
        self.launch, self.backend = launch, backend
        self.rank, self.world_size = launch.rank, launch.world_size
        self.local_rank = launch.local_rank
        self.coord: Coord = layout.coord(self.rank)
        self.hosts = list(hosts)
        self._owns_world = owns_world
        self.accelerator = device
        self.device: torch.device = device.torch
        timeout = datetime.timedelta(seconds=config.timeout_s)
        self._groups: dict[str, Optional[dist.ProcessGroup]] = {}
        self._all_groups: list[dist.ProcessGroup] = []
        for dims in GROUP_DIMS:
            if self.shape.extent(dims) == 1:
                self._groups[dims] = None
                continue
            if backend == "fake":       # a dry run: this rank's groups only (a world of 32,768 has ~100,000)
                mine = dist.new_group(sorted(layout.group_of(self.rank, dims)), timeout=timeout,
                                      use_local_synchronization=True)
                every = [mine]
            else:
                mine, every = dist.new_subgroups_by_enumeration(layout.groups(dims), timeout=timeout)
            self._groups[dims] = mine
            self._all_groups.extend(every)
        self._groups[CP_DIM] = None
        if layout.cp > 1:
            if backend == "fake":
                mine = dist.new_group(layout.cp_group_of(self.rank), timeout=timeout, use_local_synchronization=True)
                every = [mine]
            else:
                mine, every = dist.new_subgroups_by_enumeration(layout.cp_groups(), timeout=timeout)
            self._groups[CP_DIM] = mine
            self._all_groups.extend(every)
        for dim, of, every_group in ((EP_DIM, layout.ep_group_of, layout.ep_groups),
                                     (REPLICA_DIM, layout.replica_group_of, layout.replica_groups)):
            self._groups[dim] = self._groups["d"] if dim == REPLICA_DIM and layout.ep == 1 else None
            if layout.ep > 1 and len(of(self.rank)) > 1:
                if backend == "fake":
                    mine = dist.new_group(of(self.rank), timeout=timeout, use_local_synchronization=True)
                    every = [mine]
                else:
                    mine, every = dist.new_subgroups_by_enumeration(every_group(), timeout=timeout)
                self._groups[dim] = mine
                self._all_groups.extend(every)
        sizes = {d: self.shape.extent(d) for d in GROUP_DIMS} | {CP_DIM: layout.cp} \
            | {EP_DIM: layout.ep, REPLICA_DIM: self.shape.gd // layout.ep}
        indices = {d: sorted(layout.group_of(self.rank, d)).index(self.rank) for d in GROUP_DIMS} \
            | {CP_DIM: layout.cp_index(self.rank), EP_DIM: self.coord.d % layout.ep,
               REPLICA_DIM: self.coord.d // layout.ep}
        clock = clock_for(backend, device) if (config.record_timing or config.trace) else None
        run_dir = config.run_dir or launch.run_dir
        recorder = FlightRecorder(self.rank, config.flight_records, run_dir, config.hang_seconds(),
                                  world_size=self.world_size, job=job,
                                  cause_elsewhere=cause_elsewhere) if config.flight_records > 0 else None
        self.comm = Communicator(self._groups, sizes, indices, backend,
                                 reduce_in_fp32=config.reduce_in_fp32, record_timing=config.record_timing,
                                 tracer=Tracer(self.rank, clock) if config.trace else None, clock=clock,
                                 recorder=recorder)

    def no_sync(self) -> ContextManager[None]:
        """Context manager for all but the last micro-batch of a step, as DDP's: backward passes inside do not
        reduce over d, gradients just accumulate; the next backward outside reduces them all. A no-op with
        ``zero=2`` (which reduces every micro-batch's gradients to keep only its share)."""
        return self.runtime.dp.no_sync()

    def watch(self, model: "torch.nn.Module") -> None:
        """Build ``model``'s data-parallel buckets now (:mod:`axgrid.data_parallel.buckets`; otherwise the first
        :func:`axgrid.sync_gradients` does), so that the first step's backward reduces over d too. The
        parameters must hold their data (not on meta): they become views of the buckets with ``zero`` >= 1."""
        params = [p for p in model.parameters() if p.requires_grad]
        if any(p.device.type == "meta" for p in params):
            raise ValueError("grid.watch(model): some parameters are on the meta device; load them first")
        self.runtime.dp.buckets_for(params)

    # -- queries --------------------------------------------------------------------------------------
    @property
    def ledger(self) -> Ledger:
        return self.comm.ledger

    def size(self, dims: str) -> int:
        """Number of ranks along ``dims`` (e.g. ``"x"`` or ``"xyz"``; ``"c"``: the context-parallel group; ``"e"``,
        ``"r"``: the expert-parallel and expert-replica groups)."""
        if dims in (CP_DIM, EP_DIM, REPLICA_DIM):
            return self.comm.sizes[dims]
        return self.shape.extent(dims)

    def index(self, dims: str) -> int:
        """This rank's position along ``dims`` (first letter fastest; ``"c"``: which chunks of a sequence it holds;
        ``"e"``: which experts it holds)."""
        if dims in (CP_DIM, EP_DIM, REPLICA_DIM):
            return self.comm.indices[dims]
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

    def describe(self) -> str:
        """Which ranks form each group, and which groups stay inside a node."""
        lines = [f"grid {self.shape} (Gx x Gy x Gz x Gdata), order {self.order!r} (first letter fastest), "
                 f"{self.world_size} ranks on {len(set(self.hosts))} node(s), backend {self.backend}"]
        lines += self.layout.describe([self.node_of(r) for r in range(self.world_size)], GROUP_DIMS)
        if self.layout.cp > 1:
            lines.append(f"  c    size {self.layout.cp} (context parallel, inside z·d): "
                         + " ".join("[" + ",".join(map(str, g)) + "]" for g in self.layout.cp_groups()[:16]))
        if self.layout.ep > 1:
            lines.append(f"  e    size {self.layout.ep} (expert parallel, inside d): "
                         + " ".join("[" + ",".join(map(str, g)) + "]" for g in self.layout.ep_groups()[:16]))
        lines.append(f"  this rank {self.rank}: {self.coord}, node {self.node_of(self.rank)} "
                     f"({self.hosts[self.rank]}), local rank {self.local_rank}")
        return "\n".join(lines)

    # -- teardown -------------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Complete what is in flight, then release this grid's groups (and the default group when
        :func:`init` created it). No reference to a group is kept, so gloo joins its threads here, not
        during interpreter shutdown (see :mod:`axgrid.launch.teardown`). The grid cannot be used afterwards."""
        _ACTIVE.discard(id(self))
        if _CURRENT and _CURRENT[0] is self:
            _CURRENT.clear()
        try:
            self.runtime.close()
        except Exception:
            pass   # a broken group (e.g. after a timeout) must not stop the release below
        self.comm.close()
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


def refuse_if_active() -> None:
    """Refuse a second grid in this process (before any collective is posted)."""
    if _ACTIVE:
        raise GridError("axgrid.init was called twice in this process: a grid is already active; call "
                        "grid.destroy() first to build another")


def make_current(grid: Grid) -> None:
    """Register ``grid`` as alive and as the one layers default to."""
    _ACTIVE.add(id(grid))
    _CURRENT[:] = [grid]


def release_at_exit() -> None:
    """atexit: destroy a grid the program left alive, while the interpreter is still whole."""
    if _CURRENT and id(_CURRENT[0]) in _ACTIVE:
        _CURRENT[0].destroy()


def current_grid() -> Grid:
    """The grid made by the last :func:`init` in this process (layers default to it)."""
    if not _CURRENT or id(_CURRENT[0]) not in _ACTIVE:
        raise GridError("no axgrid grid is active: call axgrid.init(...) first (or pass grid=...)")
    return _CURRENT[0]
