"""Data parallelism over d: :class:`DataParallel`, the runtime's part that owns the models' data-parallel buckets
(:mod:`axgrid.data_parallel.buckets`: the buckets and their collectives), the user's functions around them, and a global
gradient norm that counts every parameter element once.

Each parameter may carry ``axgrid_replicated``: the grid letters it is replicated over (``"d"`` for a
weight shard, ``"xzd"`` for a normal layer's bias). Parameters without it (dense modules left in a
parallelized model) are replicated over the whole grid: ``"xyzd"``.
"""
from __future__ import annotations

import math
import weakref
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, Sequence

import torch

from ..core.comm import Communicator
from .buckets import GradBuckets

if TYPE_CHECKING:
    from ..core.grid import Grid


class DataParallel:
    """The runtime's data parallelism over d (``grid.runtime.dp``): the buckets of the models it syncs (one
    :class:`~axgrid.data_parallel.buckets.GradBuckets` per list of trainable parameters, built on first use),
    ``no_sync``, and the steps it takes at the beginning and end of every backward pass (:mod:`axgrid.core.backward`).

    ``delivered(param)``: whether the gradient sink writes ``param.grad`` itself (ORS); ``arm()``: the runtime's
    end of the backward."""

    def __init__(self, comm: Communicator, zero: int, bucket_bytes: int, odp: bool, *,
                 delivered: Callable[[torch.nn.Parameter], bool], arm: Callable[[], None],
                 reduce_dtype: Optional[torch.dtype] = torch.float32) -> None:
        self.comm, self.zero, self.bucket_bytes, self.odp = comm, zero, bucket_bytes, odp
        self.delivered, self.arm, self.reduce_dtype = delivered, arm, reduce_dtype
        self.sync_enabled = True
        self.all: list[weakref.ref[GradBuckets]] = []   # in the order built: every rank walks them alike

    def buckets_for(self, params: Sequence[torch.nn.Parameter]) -> Optional[GradBuckets]:
        """The buckets of ``params`` (trainable, in this order), built on first use; None when Gd = 1.

        Experts' parameters (``axgrid_expert``: distinct over the expert-parallel group, :mod:`axgrid.expert_parallel`)
        go to buckets of their own, reduced over the expert-replica group ``"r"`` only, to the mean over all Gd
        data-parallel batches (``.experts`` of the buckets returned; reduced with them)."""
        if self.comm.size("d") == 1 or not params:
            return None
        experts = [p for p in params if getattr(p, "axgrid_expert", False)]
        if experts:
            dense = [p for p in params if not getattr(p, "axgrid_expert", False)]
            b = self._buckets(dense, "d", None) if dense else None
            eb = self._buckets(experts, "r", self.comm.size("d"))
            if b is None:
                return eb
            b.experts = eb
            return b
        return self._buckets(params, "d", None)

    def _buckets(self, params: Sequence[torch.nn.Parameter], dim: str, mean_over: Optional[int]) -> GradBuckets:
        key = tuple(id(p) for p in params)
        have = getattr(params[0], "axgrid_buckets", None)
        if have is not None and have.key == key:
            return have
        for p in params:
            old = getattr(p, "axgrid_buckets", None)
            if old is not None and old.zero >= 1:
                raise ValueError(f"these {len(params)} parameters overlap the {len(old.params)} whose optimizer "
                                 f"state is sharded over d (zero={old.zero}): synchronise the same parameters "
                                 f"the sharded optimizer holds (the whole model)")
        b = GradBuckets(params, self.comm, self.zero, self.bucket_bytes, self.odp, delivered=self.delivered,
                        arm=self.arm, syncing=lambda: self.sync_enabled, reduce_dtype=self.reduce_dtype, dim=dim,
                        mean_over=mean_over)
        self.all = [r for r in self.all if r() is not None] + [weakref.ref(b)]
        return b

    def _live(self) -> list[GradBuckets]:
        return [b for b in (r() for r in self.all) if b is not None]

    def grad_ready(self, param: torch.nn.Parameter) -> None:
        """The gradient sink handed on ``param``'s final gradient of this backward (ORS)."""
        b = getattr(param, "axgrid_buckets", None)
        if b is not None:
            b.grad_ready(param)

    def before_use(self, param: torch.nn.Parameter) -> None:
        """``param`` is about to be read (e.g. a layer's weight prefetched): its all-gather over d completes."""
        b = getattr(param, "axgrid_buckets", None)
        if b is not None and b.gathers:
            b.wait_params([param])

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients without reducing them (except with ``zero=2``)."""
        old, self.sync_enabled = self.sync_enabled, False
        try:
            yield
        finally:
            self.sync_enabled = old

    def begin_backward(self) -> None:
        """The runtime's beginning of a backward pass (see :meth:`GradBuckets.begin_backward`)."""
        for b in self._live():
            b.begin_backward()

    def end_of_backward(self) -> None:
        """The runtime's end of a backward pass: every set of buckets completes its reductions."""
        for b in self._live():
            b.end_of_backward()

    def finish(self) -> None:
        """Complete every data-parallel collective in flight (gradient buckets, parameter all-gathers)."""
        for b in self._live():
            b.finish()

    def empty(self) -> bool:
        return all(b.empty() for b in self._live())


def local_batch(batch: torch.Tensor, grid: Grid, dim: int = 0) -> torch.Tensor:
    """This rank's share of a global batch: the rows of its data-parallel index d.

    ``batch [B, ...]`` (the same global batch on every rank) -> ``[B/Gd, ...]``, rows ``d·B/Gd`` to
    ``(d+1)·B/Gd - 1`` along ``dim`` (a view). Every rank of one x·y·z block gets the same rows; the model splits
    them further over z inside: axgrid's GPT and the Hugging Face plans by whole sequences (``B/Gd`` must then be a
    multiple of Gz), a drop-in ``axgrid.nn.Linear`` by tokens. ``sync_gradients`` then averages over d, so the
    mean loss of each share gives the gradient of the mean over the whole batch.

        ids = axgrid.local_batch(batch, grid)          # batch [B, S] -> ids [B/Gd, S]
    """
    if batch.dim() == 0:
        raise ValueError("local_batch got a 0-d tensor; pass the global batch [B, ...]")
    b, gd = batch.shape[dim], grid.size("d")
    if b % gd:
        raise ValueError(f"a global batch of {b} rows (dim {dim}) does not split over Gd={gd} data-parallel ranks of "
                         f"grid {grid.shape}; use a batch that is a multiple of {gd}")
    per = b // gd
    return batch.narrow(dim, grid.coord.d * per, per)


def replicated_over(p: torch.Tensor) -> str:
    return getattr(p, "axgrid_replicated", "xyzd")


def trainable_params(params: Iterable[torch.Tensor] | torch.nn.Module) -> list[torch.Tensor]:
    """The trainable parameters, each once, in order: the list the data-parallel buckets are packed for (every
    caller of ``grid.runtime.dp.buckets_for`` passes this, so they find the same buckets)."""
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    return list({id(p): p for p in params if p.requires_grad}.values())


def finish_gradients(grid: Grid) -> None:
    """Complete every collective still in flight that gradients or parameters wait for: the ORS pipeline's (written
    to ``.grad``), the data-parallel buckets', and with ``zero`` >= 1 and ODP the parameter all-gathers of the last
    optimizer step (before reading parameters outside a forward, e.g. to compare them)."""
    grid.runtime.grads.finish()
    grid.runtime.dp.finish()


def sync_gradients(params: Iterable[torch.Tensor] | torch.nn.Module, grid: Grid) -> None:
    """Reduce the gradients over the data-parallel dimension d (the mean), bucket by bucket.

    Call once per optimizer step, after the last micro-batch's backward. Completes pending overlapped gradient
    collectives first; what the backward reduced already (ODP, ``zero=2``) is not reduced again. The buckets
    (:mod:`axgrid.data_parallel.buckets`, built on first use for this list of trainable parameters) are the gradients'
    storage: ``.grad`` are views of them. ``zero=0``: each bucket is all-reduced, so every ``.grad`` holds the
    mean. ``zero`` >= 1: each bucket is reduce-scattered, so only this d-rank's share holds the mean -- what its
    :func:`axgrid.shard_optimizer` steps (with ``zero=2`` ``.grad`` is None: only the share exists). Every
    trainable parameter takes part; one without a gradient on this rank contributes zeros.
    """
    rt = grid.runtime
    rt.grads.finish()
    buckets = rt.dp.buckets_for(trainable_params(params))
    if buckets is not None:
        buckets.reduce()
        if buckets.experts is not None:
            buckets.experts.reduce()


def zero_gradients(params: Iterable[torch.Tensor] | torch.nn.Module, grid: Grid) -> bool:
    """Zero the gradients of ``params`` in place in their data-parallel buckets (building them on first use), as
    a step begins; False when there are none (Gd = 1: zero them as you like, e.g. ``optimizer.zero_grad()``)."""
    buckets = grid.runtime.dp.buckets_for(trainable_params(params))
    if buckets is None:
        return False
    buckets.zero_grad()
    if buckets.experts is not None:
        buckets.experts.zero_grad()
    return True


def _sharded(ps: list[torch.Tensor], grid: Grid) -> Optional[GradBuckets]:
    """The buckets of ``ps`` when their optimizer state is sharded over d (``zero`` >= 1, Gd > 1), else None."""
    if grid.runtime.config.zero == 0 or grid.size("d") == 1:
        return None
    return grid.runtime.dp.buckets_for(ps)


def grad_norm(params: Iterable[torch.Tensor] | torch.nn.Module, grid: Grid, norm_type: float = 2.0) -> torch.Tensor:
    """Global norm of all gradients, each element counted once however it is sharded or replicated.

    A rank contributes a parameter only if its coordinate is 0 along every grid letter other than d the parameter
    is replicated over (so replicas are skipped), then the tensor-parallel block sums. Gradients are assumed
    reduced over d (call :func:`sync_gradients` first): with ``zero=0`` every d-rank holds them all and computes
    the same norm; with ``zero`` >= 1 each d-rank counts its own pieces and the d-ranks sum too.
    """
    pairs, sharded = _gradients(trainable_params(params), grid)
    return _norm(pairs, sharded, grid, norm_type)


def _gradients(ps: list[torch.Tensor], grid: Grid) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], bool]:
    """``(param, gradient)`` of every gradient this rank holds (``zero`` >= 1: its pieces), and whether they are
    sharded over d."""
    buckets = _sharded(ps, grid)
    if buckets is not None:
        sets = [buckets] + ([buckets.experts] if buckets.experts is not None else [])
        return [(pc.param, pc.grad) for b in sets for pc in b.pieces()], True
    return [(p, p.grad) for p in ps if p.grad is not None], False


def _norm(pairs: list[tuple[torch.Tensor, torch.Tensor]], sharded: bool, grid: Grid, norm_type: float) -> torch.Tensor:
    """The global norm of :func:`_gradients`' ``pairs`` (see :func:`grad_norm`)."""
    device = pairs[0][1].device if pairs else grid.device
    total = torch.zeros((), dtype=torch.float64, device=device)
    experts = torch.zeros((), dtype=torch.float64, device=device)    # distinct over "e" (expert parallelism)
    for p, g in pairs:
        if g.numel() == 0 or any(grid.coord[c] != 0 for c in replicated_over(p) if c != "d"):
            continue
        # each tensor's norm in its own dtype (a reduction: no temporary the size of the gradient; an fp64 copy of
        # a 2.1e9-element table gradient would hold 17 GB, seen by the dry run), combined in fp64
        n = torch.linalg.vector_norm(g.detach(), norm_type).double()
        if getattr(p, "axgrid_expert", False) and not sharded and grid.size("e") > 1:
            experts = torch.maximum(experts, n) if math.isinf(norm_type) else experts + n ** norm_type
        else:
            total = torch.maximum(total, n) if math.isinf(norm_type) else total + n ** norm_type
    if grid.size("e") > 1 and not sharded:      # each expert's gradient once: the other experts are on "e"
        if math.isinf(norm_type):
            total = torch.maximum(total, grid.comm.all_gather(experts.reshape(1), "e").max())
        else:
            total = total + grid.comm.all_reduce(experts.reshape(1), "e")[0]
    for dims in ("xyz", "d") if sharded else ("xyz",):
        if grid.size(dims) == 1:
            continue
        if math.isinf(norm_type):
            total = grid.comm.all_gather(total.reshape(1), dims).max()
        else:
            total = grid.comm.all_reduce(total.reshape(1), dims)[0]
    return total if math.isinf(norm_type) else total ** (1.0 / norm_type)


def clip_grad_norm_(params: Iterable[torch.Tensor] | torch.nn.Module, max_norm: float, grid: Grid,
                    norm_type: float = 2.0) -> torch.Tensor:
    """Scale all gradients so their global norm is at most ``max_norm``; returns the norm before clipping (a 0-d
    fp32 tensor on the device; ``zero`` >= 1: of the gradients the sharded optimizer steps, this rank's pieces).
    The scale is computed on the device, ``min(1, max_norm / (norm + 1e-6))``, and every gradient is multiplied
    by it: the host never waits for the norm (as ``torch.nn.utils.clip_grad_norm_``)."""
    pairs, sharded = _gradients(trainable_params(params), grid)
    norm = _norm(pairs, sharded, grid, norm_type)
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for _, g in pairs:
        g.detach().mul_(coef.to(g.dtype))
    return norm.to(torch.float32)
