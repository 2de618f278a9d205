"""The data-parallel buckets of a model: flat buffers that *are* its gradients' storage (and with ``zero`` >= 1 its
parameters'), and the collectives over d that reduce and rebuild them.

The layout is :mod:`axgrid.spec.buckets`' (reverse ``model.parameters()`` order, ``RuntimeConfig.bucket_bytes``
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
(:mod:`axgrid.sharded_optimizer`).

The reductions over d (mean, through ``grid.comm``) run in ``RuntimeConfig.grad_reduce_dtype`` (fp32 by default:
a bucket of bf16 gradients goes through an fp32 copy, written back; ``zero=2``'s full buckets are kept in it):
``zero=0`` all-reduces each bucket, ``zero`` >= 1 reduce-scatters it (this rank's share of the bucket then holds the
mean; with ``zero=1`` the rest of the buffer holds this rank's own sums until the next
``zero_grad``). When: with ODP (``OverlapConfig.odp``) a bucket is posted as soon as every member's gradient is
final in the backward (autograd's post-accumulate hook, or the ORS pipeline's delivery), except under
``grid.no_sync()``; all complete at the end of the backward. Without ODP they run in :func:`axgrid.sync_gradients`.
``zero=2`` reduce-scatters in **every** micro-batch's backward (``no_sync`` does not apply: that is what lets it
keep only the share), overlapped with ODP, else each bucket at once. After the optimizer's step the parameters
are all-gathered over d in place (:meth:`GradBuckets.gather_params`); with ODP they stay in flight into the next
forward: a module's forward pre-hook waits for the buckets of its own parameters (a layer's z-prefetch for its
weight's), and ``state_dict``, :func:`axgrid.finish_gradients` and the next step wait for all.
"""
from __future__ import annotations

import functools
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator, Optional, Sequence

import torch

from .comm import Communicator, Pending, same_memory
from .spec import GRADIENT_WINDOW
from .spec.buckets import Bucket, pack_buckets

if TYPE_CHECKING:
    from .overlap import GradientSink


def in_backward() -> bool:
    """True while the autograd engine runs a backward pass on this thread."""
    return torch._C._current_graph_task_id() != -1


@dataclass
class Piece:
    """The elements ``[lo, hi)`` of ``param`` (flat) that this d-rank owns: ``data`` and ``grad`` are views of
    the bucket buffers (``zero`` >= 1; empty when the rank owns none of it)."""

    param: torch.nn.Parameter
    lo: int
    hi: int
    data: torch.Tensor
    grad: torch.Tensor


def _accumulated(layout: "weakref.ref[GradBuckets]", param: torch.nn.Parameter) -> None:
    """Autograd accumulated ``param``'s gradient (a parameter the ORS pipeline delivers comes later)."""
    lay = layout()
    if lay is not None and param.grad is not None and not lay.sink.delivers(param):
        lay.grad_ready(param)


class GradBuckets:
    """The data-parallel buckets of one list of parameters (a model's trainable parameters, in
    ``model.parameters()`` order); see the module docstring. Built by :class:`DataParallel`."""

    def __init__(self, params: Sequence[torch.nn.Parameter], comm: Communicator, zero: int, bucket_bytes: int,
                 odp: bool, sink: "GradientSink", dp: "DataParallel",
                 reduce_dtype: Optional[torch.dtype] = torch.float32) -> None:
        self.params = list(params)
        self.reduce_dtype = reduce_dtype                       # the collectives' dtype (None: the gradients')
        self.key = tuple(id(p) for p in self.params)
        self.comm, self.zero, self.odp, self.sink = comm, zero, odp, sink
        self._dp = weakref.ref(dp)
        self.gd, self.d = comm.size("d"), comm.indices["d"]
        self.order = self.params[::-1]                         # the layout order
        self.buckets: list[Bucket] = pack_buckets(
            [p.numel() for p in self.order], [p.element_size() for p in self.order],
            [(p.dtype, p.device) for p in self.order], bucket_bytes, self.gd if zero else 1)
        self.where: dict[int, tuple[int, int]] = {}            # id(param) -> (bucket, member position)
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
        self.module_hooks: list = []
        self.ready: list[set[int]] = []                        # per bucket: members whose gradient arrived
        self.posted: list[bool] = []                           # per bucket: its reduction posted this cycle
        self._reset_cycle()
        self.inflight: list[tuple[int, Pending]] = []
        self.gathers: dict[int, Pending] = {}                  # zero >= 1: parameter all-gathers in flight
        self.cycle_open = False                                # gradients arrived since the last reduction
        self.callback_queued = False
        self.reduced = False                                   # zero 0/1: the buffers hold this step's mean

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

    # -- gradients arrive --------------------------------------------------------------------------------
    def _reduce_in_backward(self) -> bool:
        dp = self._dp()
        return self.zero == 2 or (self.odp and dp is not None and dp.sync_enabled)

    def grad_ready(self, param: torch.nn.Parameter) -> None:
        """``param.grad`` holds its gradient of this backward: into the bucket; post the bucket once complete."""
        self._begin()
        bi, k = self.where[id(param)]
        b = self.buckets[bi]
        if self.zero == 2:
            if self.full[bi] is None:
                self.full[bi] = torch.zeros(b.padded, dtype=self._wire(param.dtype), device=param.device)
            self.full[bi][b.offsets[k]:b.offsets[k] + b.sizes[k]].add_(param.grad.detach().reshape(-1))
            param.grad = None
        else:
            self._attach(param)
        if self._reduce_in_backward() and not self.posted[bi]:
            self.ready[bi].add(k)
            if len(self.ready[bi]) == len(b.members):
                self._post(bi)

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

    def _begin(self) -> None:
        """The first gradient since the last reduction opens a cycle; in a backward, queue its end."""
        if not self.cycle_open:
            self.cycle_open = True
            self.reduced = False
        if not self.callback_queued and in_backward():
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        try:
            self.sink.finish()                 # ORS: the pipeline's last gradients arrive first
            if self._reduce_in_backward():
                self._finish_cycle()
            else:
                self.ready = [set() for _ in self.buckets]
        finally:
            self.callback_queued = False

    # -- the collectives over d --------------------------------------------------------------------------
    def _wire(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a bucket of ``dtype`` gradients is reduced in."""
        return self.reduce_dtype or dtype

    def _post(self, bi: int) -> None:
        self.posted[bi] = True
        g = self.grad_data[bi]
        src = g if self._wire(g.dtype) == g.dtype else g.to(self._wire(g.dtype))   # written back on completion
        if self.zero == 0:
            pend = self.comm.all_reduce(src, "d", average=True, async_op=True)
        elif self.zero == 1:
            pend = self.comm.reduce_scatter_(src, "d", average=True, async_op=True)
        else:
            if self.full[bi] is None:          # no member had a gradient: it still takes part (zeros)
                b = self.buckets[bi]
                self.full[bi] = torch.zeros(b.padded, dtype=self._wire(g.dtype), device=g.device)
            pend = self.comm.reduce_scatter_(self.full[bi], "d", average=True, async_op=True)
        self.inflight.append((bi, pend))
        if self.zero == 2:
            while len(self.inflight) > (GRADIENT_WINDOW if self.odp else 0):
                self._complete(*self.inflight.pop(0))

    def _complete(self, bi: int, pend: Pending) -> None:
        res = pend.wait()
        if self.zero == 2:
            self.grad_data[bi].add_(res)       # this micro-batch's mean over d, accumulated into the share
            self.full[bi] = None
        else:                                  # the buffer (zero 0) or its share (zero 1) holds the mean
            lo, hi = (0, self.buckets[bi].padded) if self.zero == 0 else self.buckets[bi].share(self.d)
            dst = self.grad_data[bi][lo:hi]
            if not same_memory(res, dst):
                dst.copy_(res)                 # reduced in another dtype (grad_reduce_dtype, reduce_in_fp32)

    def _finish_cycle(self) -> None:
        """Post every bucket not posted in this cycle (zero 0/1: members without a gradient contribute zeros),
        complete everything in flight; the buffers then hold the reduced gradients."""
        for bi in range(len(self.buckets)):
            if not self.posted[bi]:
                if self.zero < 2:
                    for m in self.buckets[bi].members:
                        self._attach(self.order[m], missing_is_zero=True)
                self._post(bi)
        self.complete_inflight()
        self._reset_cycle()
        self.cycle_open = False
        self.reduced = self.zero < 2

    def _reset_cycle(self) -> None:
        """No bucket has gradients or is posted: a new cycle of reductions starts."""
        self.ready = [set() for _ in self.buckets]
        self.posted = [False] * len(self.buckets)

    def complete_inflight(self) -> None:
        while self.inflight:
            self._complete(*self.inflight.pop(0))

    def reduce(self) -> None:
        """Make the buffers hold this step's reduced gradients (``sync_gradients``): a no-op when the backward
        did it already (ODP, ``zero=2``)."""
        if self.zero < 2 and not self.reduced:
            self._finish_cycle()
        elif self.zero == 2 and self.cycle_open:
            self._finish_cycle()               # gradients delivered outside a backward (e.g. ORS finishing here)

    def zero_grad(self) -> None:
        """All gradients to zero, in place in the buckets (zero 2: the shares; ``.grad`` None)."""
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

    # -- parameters (zero >= 1) --------------------------------------------------------------------------
    def gather_params(self, async_op: bool) -> None:
        """All-gather every bucket's parameters over d in place (this rank's share is what its optimizer
        updated), in the order the forward uses them (the last bucket holds the first parameters); with
        ``async_op`` left in flight for :meth:`wait_params` / :meth:`settle`."""
        self.settle()
        for bi in reversed(range(len(self.buckets))):
            self.gathers[bi] = self.comm.all_gather_(self.param_data[bi], "d", async_op=True)
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
        """Give the parameters back their own storage (another layout takes them over)."""
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


class DataParallel:
    """The runtime's data parallelism over d (``grid.runtime.dp``): the bucket layouts of the models it syncs
    (one :class:`GradBuckets` per list of parameters), ``no_sync``, and what is in flight."""

    def __init__(self, comm: Communicator, zero: int, bucket_bytes: int, odp: bool, sink: "GradientSink",
                 reduce_dtype: Optional[torch.dtype] = torch.float32) -> None:
        self.comm, self.zero, self.bucket_bytes, self.odp, self.sink = comm, zero, bucket_bytes, odp, sink
        self.reduce_dtype = reduce_dtype
        self.sync_enabled = True
        self.layouts: "weakref.WeakSet[GradBuckets]" = weakref.WeakSet()

    def layout_for(self, params: Sequence[torch.nn.Parameter]) -> Optional[GradBuckets]:
        """The buckets of ``params`` (trainable, in this order), built on first use; None when Gd = 1."""
        if self.comm.size("d") == 1 or not params:
            return None
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
        lay = GradBuckets(params, self.comm, self.zero, self.bucket_bytes, self.odp, self.sink, self,
                          self.reduce_dtype)
        self.layouts.add(lay)
        return lay

    def grad_ready(self, param: torch.nn.Parameter) -> None:
        """The ORS pipeline wrote ``param``'s final gradient of this backward."""
        lay = getattr(param, "axgrid_buckets", None)
        if lay is not None:
            lay.grad_ready(param)

    def before_use(self, param: torch.nn.Parameter) -> None:
        """``param`` is about to be read (e.g. a layer's weight prefetched): its all-gather over d completes."""
        lay = getattr(param, "axgrid_buckets", None)
        if lay is not None and lay.gathers:
            lay.wait_params([param])

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients without reducing them (except with ``zero=2``)."""
        old, self.sync_enabled = self.sync_enabled, False
        try:
            yield
        finally:
            self.sync_enabled = old

    def finish(self) -> None:
        """Complete every data-parallel collective in flight (gradient buckets, parameter all-gathers)."""
        for lay in list(self.layouts):
            lay.finish()

    def empty(self) -> bool:
        return all(lay.empty() for lay in list(self.layouts))


__all__ = ["GradBuckets", "DataParallel", "Piece"]
