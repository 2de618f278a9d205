"""The data-parallel buckets of a model: flat buffers that *are* its gradients' storage (and with ``zero`` >= 1 its
parameters'), and the collectives over d that reduce and rebuild them.

The packing is :mod:`axgrid.spec.buckets`' (reverse ``model.parameters()`` order, ``RuntimeConfig.bucket_bytes``
per bucket, with ``zero`` >= 1 each bucket padded to a multiple of Gd and cut into Gd equal shares). Per bucket
``b`` of ``padded_b`` elements (``s_b = padded_b / Gd``), the buffers each mode keeps -- the whole data-parallel
memory, which ``perfmodel.memory`` prices:

=====  ========================================  ===================================================================
zero   persistent                                 during a backward
=====  ========================================  ===================================================================
0      ``grad[b] [padded_b]``: every ``.grad`` a  --
       view of it (the parameters are their own
       tensors)
1      ``param[b] [padded_b]``: every parameter   --
       a view of it; ``grad[b] [padded_b]``:
       every ``.grad`` a view of it
2      ``param[b] [padded_b]``; ``grad[b] [s_b]``:  ``full[b] [padded_b]``: the bucket's gradients, from the first one
       this rank's share only (``.grad`` is None  to arrive to its reduce-scatter's completion (at most
       outside a backward)                         ``GRADIENT_WINDOW`` in flight with ODP, else one at a time)
=====  ========================================  ===================================================================

So every gradient has one copy in every mode (DDP's ``gradient_as_bucket_view``, Megatron's grad buffer): autograd
accumulates into the views in place, and the collectives run on the buckets in place. The optimizer state is
the optimizer's: whole per parameter with ``zero=0``, only this d-rank's pieces with ``zero`` >= 1
(:mod:`axgrid.data_parallel.sharded_optimizer`).

The reductions over d (mean, through ``grid.comm``) run in ``RuntimeConfig.grad_reduce_dtype`` (fp32 by default:
a bucket of bf16 gradients goes through an fp32 copy, written back; ``zero=2``'s full buckets are kept in it):
``zero=0`` all-reduces each bucket, ``zero`` >= 1 reduce-scatters it (this rank's share of the bucket then holds the
mean; with ``zero=1`` the rest of the buffer holds this rank's own sums until the next
``zero_grad``). When (the semantics of DDP, docs/training.md): the gradients are reduced by the end of every backward pass outside
``grid.no_sync()``. With ODP (``OverlapConfig.odp``) a bucket is posted during the backward as soon as every member's
gradient is final (autograd's post-accumulate hook, or the ORS pipeline's hand-over) *and* every bucket before it has
been posted -- so every rank posts the same buckets in the same order, whichever parameters its data used; without
ODP, or for buckets with a member that got no gradient here, at the end of the backward (:mod:`axgrid.core.backward`),
where members without a gradient contribute zeros. A second reduction in one step (several backwards without
``no_sync``) adds to the first, as DDP's does: with ``zero=1`` a buffer whose share holds a mean is first turned back
into this rank's contribution (the share times Gd, the rest zero) when the next backward begins. ``zero=2``
reduce-scatters in **every** micro-batch's backward (``no_sync`` does not apply: that is what lets it keep only the
share), overlapped with ODP, else each bucket at once; the optimizer's step consumes the shares (the next backward's
reduction overwrites them instead of adding, as DeepSpeed's ZeRO-2 does), so no ``zero_grad`` is needed between
steps and ``model.zero_grad()`` -- which cannot see them -- loses nothing. A parameter that no d-rank gave a
gradient since the gradients were last cleared (or, ``zero=2``, since the last step) is *unused*: with ``zero=0``
its ``.grad`` is None after the reduction, with ``zero`` >= 1 the sharded optimizer skips its pieces -- as torch's
optimizers skip a parameter without a gradient (one all-reduce over d of a flag per parameter tells the ranks,
:meth:`GradBuckets.used_params`). After the optimizer's step the parameters are all-gathered over d in place
(:meth:`GradBuckets.gather_params`); with ODP they stay in flight into the next forward: a module's forward pre-hook
waits for the buckets of its own parameters (a layer's z-prefetch for its weight's), and ``state_dict``,
:func:`axgrid.finish_gradients` and the next step wait for all.
"""
from __future__ import annotations

import functools
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterable, Iterator, Optional, Sequence

import torch

from ..core.comm import Communicator, Pending, same_memory
from ..device import host_read
from ..spec import GRADIENT_WINDOW
from ..spec.buckets import Bucket, pack_buckets


@dataclass
class Piece:
    """The elements ``[lo, hi)`` of ``param`` (flat) that this d-rank owns: ``data`` and ``grad`` are views of
    the bucket buffers (``zero`` >= 1; empty when the rank owns none of it)."""

    param: torch.nn.Parameter
    lo: int
    hi: int
    data: torch.Tensor
    grad: torch.Tensor


def _accumulated(buckets: "weakref.ref[GradBuckets]", param: torch.nn.Parameter) -> None:
    """Autograd accumulated ``param``'s gradient (a parameter the ORS pipeline delivers comes later)."""
    b = buckets()
    if b is not None and param.grad is not None and not b.delivered(param):
        b.grad_ready(param)


def _arriving(arm: Callable[[], None], grad: torch.Tensor) -> None:
    """A gradient is about to be accumulated into a bucket view (``zero=1``): the backward's begin steps first."""
    arm()


class GradBuckets:
    """The data-parallel buckets of one list of parameters (a model's trainable parameters, in
    ``model.parameters()`` order); see the module docstring. Built by
    :class:`axgrid.data_parallel.gradients.DataParallel`.

    ``delivered(param)``: whether a gradient sink writes ``param.grad`` and hands it on itself (ORS), rather than
    autograd; ``arm()``: the runtime's end of the backward (:class:`axgrid.core.backward.BackwardPass`), which calls
    :meth:`begin_backward` and :meth:`end_of_backward`; ``syncing()``: False under ``no_sync``."""

    def __init__(self, params: Sequence[torch.nn.Parameter], comm: Communicator, zero: int, bucket_bytes: int,
                 odp: bool, *, delivered: Callable[[torch.nn.Parameter], bool], arm: Callable[[], None],
                 syncing: Callable[[], bool], reduce_dtype: Optional[torch.dtype] = torch.float32,
                 dim: str = "d", mean_over: Optional[int] = None) -> None:
        self.params = list(params)
        self.dim = dim                                         # the group reduced over ("r": experts' replicas)
        # the mean is over mean_over ranks (the data-parallel ranks, Gd) though the group may be smaller: an
        # expert's gradient on its rank already sums the batches of the E_p ranks that sent it tokens
        self.mean_over = mean_over or comm.size(dim)
        self.scale = comm.size(dim) / self.mean_over
        self.reduce_dtype = reduce_dtype                       # the collectives' dtype (None: the gradients')
        self.key = tuple(id(p) for p in self.params)
        self.comm, self.zero, self.odp = comm, zero, odp
        self.delivered, self.arm, self.syncing = delivered, arm, syncing
        self.gd, self.d = comm.size(dim), comm.indices[dim]
        self.order = self.params[::-1]                         # the packing order
        self.buckets: list[Bucket] = pack_buckets(
            [p.numel() for p in self.order], [p.element_size() for p in self.order],
            [(p.dtype, p.device) for p in self.order], bucket_bytes, self.gd if zero else 1)
        self.where: dict[int, tuple[int, int]] = {}            # id(param) -> (bucket, member position)
        self.touched: set[int] = {id(p) for p in self.params if p.grad is not None}   # with a gradient here
        self.param_data: list[Optional[torch.Tensor]] = []     # zero >= 1: [padded_b]
        self.grad_data: list[torch.Tensor] = []                # zero 0/1: [padded_b]; zero 2: [s_b]
        self.full: list[Optional[torch.Tensor]] = []           # zero 2, during a backward: [padded_b]
        with torch.no_grad():
            for bi, b in enumerate(self.buckets):
                first = self.order[b.members[0]]
                kw = {"dtype": first.dtype, "device": first.device}
                pdata = torch.zeros(b.padded, **kw) if zero >= 1 else None
                gdata = torch.zeros(b.share_numel if zero == 2 else b.padded, **kw)
                for k, m in enumerate(b.members):
                    p = self.order[m]
                    self.where[id(p)] = (bi, k)
                    if getattr(p, "axgrid_buckets", None) is not None:
                        p.axgrid_buckets.release()
                    off, n = b.offsets[k], b.sizes[k]
                    if pdata is not None:
                        pdata[off:off + n].copy_(p.detach().reshape(-1))
                        p.data = pdata[off:off + n].view_as(p)
                    if zero < 2:
                        view = gdata[off:off + n].view_as(p)
                        if p.grad is not None:
                            view.copy_(p.grad)
                        p.grad = view
                    else:
                        p.grad = None          # only the share is kept: a gradient from before has no home
                    p.axgrid_buckets = self
                self.param_data.append(pdata)
                self.grad_data.append(gdata)
                self.full.append(None)
        # a weak reference: autograd holds the hook from C++, where a cycle back to the parameter is never freed
        me = weakref.ref(self)
        self.hooks = [p.register_post_accumulate_grad_hook(functools.partial(_accumulated, me)) for p in self.params]
        if zero == 1:      # a buffer holding a mean is turned back into a contribution before autograd adds to it
            self.hooks += [p.register_hook(functools.partial(_arriving, arm)) for p in self.params]
        self.module_hooks: list = []
        self.scope: Optional[Callable[[], ContextManager]] = None   # an observer (:meth:`observed`)
        # the reduction cycle: gradients arrive, buckets are posted in order, everything completes
        self.arrived: list[set[int]] = []                      # per bucket: members whose gradient arrived
        self.next_post = 0                                     # buckets [0, next_post) are posted this cycle
        self._reset_cycle()
        self.inflight: list[tuple[int, Pending]] = []
        self.gathers: dict[int, Pending] = {}                  # zero >= 1: parameter all-gathers in flight
        self.cycle_open = False                                # gradients arrived since the last reduction
        self.reduced = False                                   # zero 0/1: the buffers hold this step's mean
        self.mean_in_share = [False] * len(self.buckets)       # zero 1: the share holds a mean, the rest sums
        self.consumed = [False] * len(self.buckets)            # zero 2: the step used the share; overwrite it
        self.experts: Optional["GradBuckets"] = None            # the experts' own buckets, reduced over "r"

    # -- what exists (memory accounting) -----------------------------------------------------------------
    def buffers(self) -> dict[str, list[torch.Tensor]]:
        """The persistent buffers by kind: ``"params"`` (zero >= 1) and ``"grads"``; plus ``"full"``, the
        gradient buckets of a backward in progress (zero 2)."""
        return {"params": [t for t in self.param_data if t is not None], "grads": list(self.grad_data),
                "full": [t for t in self.full if t is not None]}

    def pieces(self) -> list[Piece]:
        """This d-rank's piece of every parameter, in ``model.parameters()`` order (zero >= 1)."""
        if self.zero == 0:
            raise RuntimeError("zero=0 keeps whole gradients: no pieces")
        out = []
        for p in self.params:
            bi, k = self.where[id(p)]
            b = self.buckets[bi]
            lo, hi = b.piece(k, self.d)
            a = b.offsets[k] + lo                                   # in the bucket
            g = a - (b.share(self.d)[0] if self.zero == 2 else 0) if hi > lo else 0   # in the gradient buffer
            out.append(Piece(p, lo, hi, self.param_data[bi][a:a + hi - lo], self.grad_data[bi][g:g + hi - lo]))
        return out

    @contextmanager
    def observed(self, scope: Callable[[], ContextManager]) -> Iterator[None]:
        """Inside: whatever the buckets do while gradients arrive and at the end of a backward runs inside
        ``scope()`` (e.g. :mod:`axgrid.metrics.memtrack` counting what they allocate)."""
        old, self.scope = self.scope, scope
        try:
            yield
        finally:
            self.scope = old

    def _observing(self) -> ContextManager:
        return self.scope() if self.scope is not None else nullcontext()

    # -- gradients arrive --------------------------------------------------------------------------------
    def _posting_in_backward(self) -> bool:
        return self.zero == 2 or (self.odp and self.syncing())

    def grad_ready(self, param: torch.nn.Parameter) -> None:
        """``param.grad`` holds its gradient of this backward: into the bucket; post the buckets now complete."""
        with self._observing():
            self.arm()
            self.cycle_open = True
            self.reduced = False
            self.touched.add(id(param))
            bi, k = self.where[id(param)]
            b = self.buckets[bi]
            if self.zero == 2:
                if self.full[bi] is None:
                    self.full[bi] = torch.zeros(b.padded, dtype=self._wire(param.dtype), device=param.device)
                self.full[bi][b.offsets[k]:b.offsets[k] + b.sizes[k]].add_(param.grad.detach().reshape(-1))
                param.grad = None
            else:
                self._attach(param)
            if self._posting_in_backward() and bi >= self.next_post:
                self.arrived[bi].add(k)
                while self.next_post < len(self.buckets) and \
                        len(self.arrived[self.next_post]) == len(self.buckets[self.next_post].members):
                    self._post(self.next_post)

    def _view(self, param: torch.nn.Parameter) -> torch.Tensor:
        bi, k = self.where[id(param)]
        b = self.buckets[bi]
        return self.grad_data[bi][b.offsets[k]:b.offsets[k] + b.sizes[k]].view_as(param)

    def _attach(self, param: torch.nn.Parameter, missing_is_zero: bool = False) -> None:
        """zero 0/1: make ``param.grad`` its bucket view again (after ``zero_grad(set_to_none=True)``, say);
        ``missing_is_zero``: a parameter without a gradient contributes zeros."""
        g = param.grad
        view = self._view(param)
        if g is not None and same_memory(g, view):
            return
        with torch.no_grad():
            if g is None:
                if not missing_is_zero:
                    return
                view.zero_()
            else:
                view.copy_(g)
        param.grad = view

    # -- the runtime's backward steps (axgrid.core.backward) ----------------------------------------------------
    def begin_backward(self) -> None:
        """A backward begins (before any gradient is written): ``zero=1`` buffers whose share holds a mean of an
        earlier reduction of this step become this rank's contribution again -- the share times Gd, the rest
        zero -- so that the next reduction adds this backward's gradients to that mean (as DDP does)."""
        if not any(self.mean_in_share):
            return
        with torch.no_grad():
            for bi, b in enumerate(self.buckets):
                if self.mean_in_share[bi]:
                    lo, hi = b.share(self.d)
                    g = self.grad_data[bi]
                    g[lo:hi].mul_(self.mean_over)
                    g[:lo].zero_()
                    g[hi:].zero_()
        self.mean_in_share = [False] * len(self.buckets)
        self.cycle_open = True
        self.reduced = False

    def end_of_backward(self) -> None:
        """A backward has ended (the ORS pipeline has handed on its gradients): outside ``no_sync`` (or with
        ``zero=2``) post what is left and complete the reductions."""
        if not self.cycle_open:
            return
        with self._observing():
            if self.zero == 2 or self.syncing():
                self._finish_cycle()
            else:
                self._reset_cycle()

    # -- the collectives over d --------------------------------------------------------------------------
    def _wire(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a bucket of ``dtype`` gradients is reduced in."""
        return self.reduce_dtype or dtype

    def _post(self, bi: int) -> None:
        """Post bucket ``bi``'s reduction, the next in order (every rank posts the buckets in the same order)."""
        assert bi == self.next_post, (bi, self.next_post)
        self.next_post += 1
        g = self.grad_data[bi]
        src = g if self._wire(g.dtype) == g.dtype else g.to(self._wire(g.dtype))   # written back on completion
        if self.zero == 0:
            pend = self.comm.all_reduce(src, self.dim, average=True, async_op=True)
        elif self.zero == 1:
            pend = self.comm.reduce_scatter_(src, self.dim, average=True, async_op=True)
        else:
            if self.full[bi] is None:          # no member had a gradient: it still takes part (zeros)
                b = self.buckets[bi]
                self.full[bi] = torch.zeros(b.padded, dtype=self._wire(g.dtype), device=g.device)
            pend = self.comm.reduce_scatter_(self.full[bi], self.dim, average=True, async_op=True)
        self.inflight.append((bi, pend))
        if self.zero == 2:
            while len(self.inflight) > (GRADIENT_WINDOW if self.odp else 0):
                self._complete(*self.inflight.pop(0))

    def _complete(self, bi: int, pend: Pending) -> None:
        res = pend.wait()
        if self.zero == 2:
            if self.scale != 1.0:
                res = res * self.scale
            if self.consumed[bi]:              # the first reduction since the optimizer's step
                self.grad_data[bi].copy_(res)
                self.consumed[bi] = False
            else:                              # this micro-batch's mean over d, accumulated into the share
                self.grad_data[bi].add_(res)
            self.full[bi] = None
        else:                                  # the buffer (zero 0) or its share (zero 1) holds the mean
            lo, hi = (0, self.buckets[bi].padded) if self.zero == 0 else self.buckets[bi].share(self.d)
            dst = self.grad_data[bi][lo:hi]
            if not same_memory(res, dst):
                dst.copy_(res)                 # reduced in another dtype (grad_reduce_dtype, reduce_in_fp32)
            if self.scale != 1.0:
                dst.mul_(self.scale)
            self.mean_in_share[bi] = self.zero == 1

    def _finish_cycle(self) -> None:
        """Post every bucket not posted in this cycle, in order (zero 0/1: members without a gradient contribute
        zeros), complete everything in flight; the buffers then hold the reduced gradients. With ``zero=0`` the
        parameters no d-rank has a gradient for get ``.grad`` None (one all-reduce over d)."""
        if self.zero < 2:                      # which parameters hold a gradient here, before zeros fill in
            self.touched = {id(p) for p in self.params if id(p) in self.touched and p.grad is not None}
        for bi in range(self.next_post, len(self.buckets)):
            if self.zero < 2:
                for m in self.buckets[bi].members:
                    self._attach(self.order[m], missing_is_zero=True)
            self._post(bi)
        # zero 0: the flags go out behind the last bucket, so their latency hides behind the buckets in flight
        flags = self._post_used_flags() if self.zero == 0 else None
        self.complete_inflight()
        self._reset_cycle()
        self.cycle_open = False
        self.reduced = self.zero < 2
        if flags is not None:
            used = self._used_from(flags)
            for p in self.params:
                if id(p) not in used:
                    p.grad = None              # as torch leaves it: the optimizer skips the parameter

    def _reset_cycle(self) -> None:
        """No bucket has gradients or is posted: a new cycle of reductions starts."""
        self.arrived = [set() for _ in self.buckets]
        self.next_post = 0

    def complete_inflight(self) -> None:
        while self.inflight:
            self._complete(*self.inflight.pop(0))

    def used_params(self) -> set[int]:
        """The ids of the parameters some d-rank holds a gradient for (collective over d: one all-reduce of an
        int32 flag per parameter). A rank that holds a gradient for every parameter knows the answer and does not
        wait for the reduction's value; the others read it (:func:`axgrid.device.host_read`: on a GPU the host waits
        for the reduction, as DDP's ``find_unused_parameters`` does)."""
        return self._used_from(self._post_used_flags())

    def _post_used_flags(self) -> tuple[bool, Pending]:
        """Post the flags' all-reduce over d (every rank, at the same place in its sequence of collectives):
        ``(whether this rank holds a gradient for every parameter, the reduction in flight)``."""
        local = [id(p) in self.touched for p in self.params]
        dev = self.grad_data[0].device
        mine = torch.ones(len(local), dtype=torch.int32, device=dev) if all(local) else \
            torch.tensor(local, dtype=torch.int32).to(dev)
        return all(local), self.comm.all_reduce(mine, self.dim, async_op=True)

    def _used_from(self, flags: tuple[bool, Pending]) -> set[int]:
        have_all, pend = flags
        counts = pend.wait()
        if have_all:
            return {id(p) for p in self.params}
        return {id(p) for p, c in zip(self.params, host_read(counts)) if c > 0}

    def reduce(self) -> None:
        """Make the buffers hold this step's reduced gradients (``sync_gradients``): a no-op when the backward
        did it already."""
        if (self.zero < 2 and not self.reduced) or (self.zero == 2 and self.cycle_open):
            self._finish_cycle()

    def stepped(self) -> None:
        """The optimizer has stepped on the shares (``zero=2``: the next reduction overwrites them, and a
        parameter is used again only once a gradient for it arrives)."""
        if self.zero == 2:
            self.consumed = [True] * len(self.buckets)
            self.touched = set()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """All gradients to zero, in place in the buckets (zero 2: the shares; ``.grad`` None). ``set_to_none``:
        the parameters count as having no gradient until one arrives (the optimizer skips the unused ones), as
        torch's ``zero_grad``; else as having a zero gradient."""
        self.complete_inflight()
        with torch.no_grad():
            for g in self.grad_data:
                g.zero_()
        for p in self.params:
            if self.zero < 2:
                p.grad = self._view(p)
            else:
                p.grad = None
        self.full = [None] * len(self.buckets)
        self._reset_cycle()
        self.cycle_open = self.reduced = False
        self.mean_in_share = [False] * len(self.buckets)
        self.consumed = [False] * len(self.buckets)
        self.touched = set() if set_to_none else {id(p) for p in self.params}

    # -- parameters (zero >= 1) --------------------------------------------------------------------------
    def gather_params(self, async_op: bool) -> None:
        """All-gather every bucket's parameters over d in place (this rank's share is what its optimizer
        updated), in the order the forward uses them (the last bucket holds the first parameters); with
        ``async_op`` left in flight for :meth:`wait_params` / :meth:`settle`."""
        self.settle()
        for bi in reversed(range(len(self.buckets))):
            self.gathers[bi] = self.comm.all_gather_(self.param_data[bi], self.dim, async_op=True)
        if not async_op:
            self.settle()

    def wait_params(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Complete the all-gathers of the buckets holding ``params`` (before a module uses them)."""
        for p in params:
            pend = self.gathers.pop(self.where[id(p)][0], None)
            if pend is not None:
                pend.wait()

    def settle(self) -> None:
        """Complete every parameter all-gather in flight."""
        for bi in sorted(self.gathers, reverse=True):
            self.gathers.pop(bi).wait()

    def hook_modules(self, model: torch.nn.Module) -> None:
        """Have each module of ``model`` that owns parameters here wait for their buckets' all-gathers before
        its forward and its ``state_dict`` (zero >= 1 with overlapped gathers)."""
        if self.module_hooks:
            return
        for mod in model.modules():
            own = [p for p in mod.parameters(recurse=False) if id(p) in self.where]
            if not own:
                continue

            def before(*_, own=own) -> None:
                if self.gathers:
                    self.wait_params(own)

            self.module_hooks.append(mod.register_forward_pre_hook(before))
            self.module_hooks.append(mod.register_state_dict_pre_hook(before))

    # -- teardown ----------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Complete what is in flight: gradient reductions and parameter all-gathers."""
        self.complete_inflight()
        self.settle()

    def release(self) -> None:
        """Give the parameters back their own storage (another set of buckets takes them over)."""
        self.finish()
        with torch.no_grad():
            for p in self.params:
                if getattr(p, "axgrid_buckets", None) is not self:
                    continue
                if self.zero >= 1:
                    p.data = p.detach().clone()
                if p.grad is not None:
                    p.grad = p.grad.clone()
                p.axgrid_buckets = None
        for h in self.hooks + self.module_hooks:
            h.remove()
        self.hooks, self.module_hooks = [], []

    def empty(self) -> bool:
        """Nothing in flight."""
        return not (self.inflight or self.gathers)


__all__ = ["GradBuckets", "Piece"]
