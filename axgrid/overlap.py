"""Where parallel layers get their weights and send their gradients: plain, or overlapped with compute.

A :class:`~axgrid.runtime.Runtime` always holds one weight source and one gradient sink, so layers call them
unconditionally; ``OverlapConfig`` only chooses which class is built.

- :class:`WeightGather` (OAG off): a layer all-gathers its weight block over z when it runs.
  :class:`WeightPrefetcher` (OAG): records the order in which parallel layers run forward -- once for the
  forward pass and once for the recompute forwards inside backward -- and from then on, when a layer starts,
  posts the all-gather of the layer that ran after it last time. A prefetch that does not match the layer that
  actually runs is waited for and dropped (all ranks run the same sequence, so collectives stay in step).
- :class:`GradientSink` (ORS off): gradient collectives run at once and their results go back to autograd.
  :class:`GradientPipeline` (ORS): weight-gradient reduce-scatters over z (and the bias all-reduces over z) are
  posted asynchronously and completed one layer later, under the backward of earlier layers, and each finished
  gradient is handed on (``on_ready``: the data-parallel buckets, :mod:`axgrid.grad_buckets`, which with ODP
  reduce over d during the backward). A parameter two layers read (``axgrid_shared``: tied embeddings) is reduced
  at once and handed back to autograd, which must add its uses. Everything still in flight is completed by a
  callback at the end of the backward pass, so ``.grad`` is complete whenever ``loss.backward()`` returns:
  nothing to forget before the optimizer step.
- Both sinks post the input-gradient all-reduce: with OAR it stays in flight under the weight-gradient GEMM.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from .comm import Communicator, Pending, ready
from .grad_buckets import in_backward
from .spec import GRADIENT_WINDOW

if TYPE_CHECKING:
    from .nn.linear import Linear


class WeightGather:
    """OAG off: each layer all-gathers its weight block over z when it runs. With ``keep`` (the config's
    ``keep_gathered_weights``) the forward's block is saved for backward instead of the shard (one all-gather
    fewer, more memory)."""

    pending: Optional[tuple[int, int, Pending]] = None   # never a prefetch in flight
    hits = misses = 0

    def __init__(self, keep: bool) -> None:
        self.keep = keep

    def forward(self, layer: "Linear", shard: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer``'s block ``[n_blk, k_blk]`` for its forward, and what the forward saves for backward: the
        block (``keep``) or the shard."""
        block = layer.gather_weight(shard)
        return block, (block if self.keep else shard)

    def backward(self, layer: "Linear", saved: torch.Tensor, need_block: bool) -> Optional[torch.Tensor]:
        """Called once per layer backward: the block for the input gradient (None unless ``need_block``), from
        what :meth:`forward` saved."""
        if not need_block:
            return None
        return saved if self.keep else layer.gather_weight(saved)

    def drop(self) -> None:
        """Complete and forget an outstanding prefetch (none here)."""


class WeightPrefetcher(WeightGather):
    """OAG: prefetch the next layer's weight all-gather over z in execution order."""

    def __init__(self, keep: bool) -> None:
        super().__init__(keep)
        # layer id -> the layer that ran after it (weak: a deleted model is not kept alive)
        self.next_of: dict[str, dict[int, weakref.ref]] = {"fwd": {}, "bwd": {}}
        self.seen: dict[str, set[int]] = {"fwd": set(), "bwd": set()}
        self.recording = {"fwd": True, "bwd": True}
        self.last: dict[str, Optional[int]] = {"fwd": None, "bwd": None}
        self.pending = None   # (layer id, weight version, gather)
        self.hits = self.misses = 0
        self.callback_queued = False

    def _mode(self) -> str:
        return "bwd" if in_backward() else "fwd"

    def forward(self, layer: "Linear", shard: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        block = self._block(layer, shard)
        return block, (block if self.keep else shard)

    def backward(self, layer: "Linear", saved: torch.Tensor, need_block: bool) -> Optional[torch.Tensor]:
        self.note_backward()
        return super().backward(layer, saved, need_block)

    def _block(self, layer: "Linear", shard: torch.Tensor) -> torch.Tensor:
        """The gathered block for ``layer`` (prefetched when it was), and the next layer's gather posted."""
        mode = self._mode()
        if mode == "bwd":
            self.note_backward()
        key = id(layer)
        if not self.recording[mode] and key not in self.seen[mode]:
            self.recording[mode] = True          # a layer never seen (e.g. another model): record again
            self.next_of[mode].clear()
            self.seen[mode].clear()
        self.seen[mode].add(key)
        if self.recording[mode] and self.last[mode] is not None and self.last[mode] != key:
            prev = self.next_of[mode]
            known = prev.get(self.last[mode])
            if known is not None and known() is not layer:
                self.recording[mode] = False     # a second pass began: the order is complete
            else:
                prev[self.last[mode]] = weakref.ref(layer)
        self.last[mode] = key
        block = None
        if self.pending is not None:
            pkey, version, pend = self.pending
            self.pending = None
            got = pend.wait()
            if pkey == key and version == layer.weight._version:   # same layer, weights not changed since
                block = got
                self.hits += 1
            else:
                self.misses += 1
        if block is None:
            block = layer.gather_weight(shard)
        ref = None if self.recording[mode] else self.next_of[mode].get(key)
        nxt = ref() if ref is not None else None
        if nxt is not None and nxt.grid.size("z") > 1:
            self.pending = (id(nxt), nxt.weight._version, nxt.gather_weight_async())
        return block

    def note_backward(self) -> None:
        """Called from inside a backward pass: the forward order is complete; reset at the pass's end."""
        self.recording["fwd"] = False
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.end_of_backward)

    def end_of_backward(self) -> None:
        self.callback_queued = False
        self.recording["bwd"] = False
        self.recording["fwd"] = False
        self.last = {"fwd": None, "bwd": None}
        self.drop()

    def drop(self) -> None:
        """Complete and forget an outstanding prefetch (e.g. before weights change)."""
        if self.pending is not None:
            self.pending[2].wait()
            self.pending = None
            self.misses += 1


class GradientSink:
    """ORS off: every gradient collective runs at once and its result goes back to autograd.

    The interface every sink has: layers call :meth:`reduce_input_grad`, :meth:`reduce_scatter` and
    :meth:`all_reduce` from their backward; :meth:`delivers` and :meth:`finish` serve the data-parallel buckets
    and :func:`axgrid.sync_gradients`.
    """

    def __init__(self, comm: Communicator, oar: bool) -> None:
        self.comm, self.oar = comm, oar

    def reduce_input_grad(self, dx: torch.Tensor, dim: str) -> Pending:
        """``AR_dim(dx)``: with OAR left in flight (``.wait()`` it after the weight-gradient GEMM), else done."""
        if self.oar:
            return self.comm.all_reduce(dx, dim, async_op=True)
        return ready(self.comm.all_reduce(dx, dim))

    def reduce_scatter(self, param: torch.nn.Parameter, flat: torch.Tensor) -> Optional[torch.Tensor]:
        """``RS_z(flat)``, ``param``'s padded flat gradient block: the shard's gradient, for autograd."""
        return self.comm.reduce_scatter(flat, "z")

    def all_reduce(self, params: Sequence[torch.nn.Parameter], grads: Sequence[torch.Tensor],
                   dim: str) -> list[Optional[torch.Tensor]]:
        """Sum ``grads`` (partial gradients of ``params``) over ``dim`` in ONE all-reduce, for autograd."""
        if len(grads) == 1:
            return [self.comm.all_reduce(grads[0], dim)]
        flat = self.comm.all_reduce(torch.cat([g.reshape(-1) for g in grads]), dim)
        out, off = [], 0
        for g in grads:
            out.append(flat[off: off + g.numel()].view_as(g))
            off += g.numel()
        return out

    def delivers(self, param: torch.nn.Parameter) -> bool:
        """Whether this sink writes ``param.grad`` itself (then autograd's accumulation is not its final
        gradient: the sink hands it on when its collective completes)."""
        return False

    def finish(self) -> None:
        """Complete every collective in flight (none here)."""

    def empty(self) -> bool:
        return True


class GradientPipeline(GradientSink):
    """ORS: weight-gradient reduce-scatters and bias all-reduces over z in flight during the backward, completed
    :data:`~axgrid.spec.GRADIENT_WINDOW` posts later or at the end of the backward; each completed gradient is
    written to ``.grad`` and handed to ``on_ready(param)`` (the data-parallel buckets)."""

    def __init__(self, comm: Communicator, oar: bool,
                 on_ready: Callable[[torch.nn.Parameter], None] = lambda p: None) -> None:
        super().__init__(comm, oar)
        self.on_ready = on_ready
        self.inflight: list[tuple[list[torch.nn.Parameter], Pending]] = []
        self.callback_queued = False
        self.delivered: set[int] = set()  # ids of parameters whose gradients this pipeline writes

    def _queue_callback(self) -> None:
        if not self.callback_queued and in_backward():   # the first gradient event of a new backward pass
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.finish)

    def delivers(self, param: torch.nn.Parameter) -> bool:
        return id(param) in self.delivered

    def reduce_scatter(self, param: torch.nn.Parameter, flat: torch.Tensor) -> Optional[torch.Tensor]:
        """Post ``RS_z(flat)`` for ``param``'s gradient and complete the one before last (it ran under our
        GEMMs); None for autograd: the pipeline writes ``param.grad`` itself. A parameter read by several layers
        (``axgrid_shared``: tied embeddings) is reduced at once and handed back to autograd, which sums its uses
        before ``.grad`` (and before the data-parallel buckets see it)."""
        if getattr(param, "axgrid_shared", False):
            return super().reduce_scatter(param, flat)
        self._queue_callback()
        self.delivered.add(id(param))
        self._post([param], self.comm.reduce_scatter(flat, "z", async_op=True))
        return None

    def all_reduce(self, params: Sequence[torch.nn.Parameter], grads: Sequence[torch.Tensor],
                   dim: str) -> list[Optional[torch.Tensor]]:
        """Post one ``AR_dim`` of the concatenated ``grads`` (partial gradients of ``params``); Nones."""
        self._queue_callback()
        self.delivered.update(id(p) for p in params)
        flat = grads[0].reshape(-1) if len(grads) == 1 else torch.cat([g.reshape(-1) for g in grads])
        self._post(list(params), self.comm.all_reduce(flat, dim, async_op=True))
        return [None] * len(grads)

    def _post(self, params: list[torch.nn.Parameter], pending: Pending) -> None:
        self.inflight.append((params, pending))
        while len(self.inflight) > GRADIENT_WINDOW:   # a window of gradient collectives in flight
            self._complete(*self.inflight.pop(0))

    def _complete(self, params: list[torch.nn.Parameter], pending: Pending) -> None:
        flat = pending.wait().reshape(-1)
        off = 0
        for param in params:
            g = flat[off: off + param.numel()].view_as(param).to(param.dtype)
            off += param.numel()
            if param.grad is None:
                param.grad = g      # a slice of the collective's own fresh result: no copy needed
            else:
                param.grad.add_(g)
            self.on_ready(param)

    def finish(self) -> None:
        """Complete every collective in flight and write the results to ``.grad``. Idempotent."""
        while self.inflight:
            self._complete(*self.inflight.pop(0))
        self.callback_queued = False

    def empty(self) -> bool:
        return not self.inflight
