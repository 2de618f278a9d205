"""Where parallel layers get their weights and send their gradients: plain, or overlapped with compute.

A :class:`~axgrid.core.runtime.Runtime` always holds one weight source and one gradient sink, so layers call them
unconditionally; ``OverlapConfig`` only chooses which class is built.

- :class:`WeightGather` (OAG off): a layer all-gathers its weight block over z when it runs (the layer is a
  :class:`ShardedWeight`: its 1-D shard and its sharding, nothing else is asked of it).
  :class:`WeightPrefetcher` (OAG): records the order in which parallel layers run forward -- once for the
  forward pass and once for the recompute forwards inside backward -- and from then on, when a layer starts,
  posts the all-gather of the layer that ran after it last time. A prefetch that does not match the layer that
  actually runs is waited for and dropped (all ranks run the same sequence, so collectives stay in step).
- :class:`GradientSink` (ORS off): gradient collectives run at once and their results go back to autograd.
  :class:`GradientPipeline` (ORS): weight-gradient reduce-scatters over z (and the bias all-reduces over z) are
  posted asynchronously and completed one layer later, under the backward of earlier layers; the results are
  added into ``.grad``. A parameter's gradient is handed on (``on_ready``: the data-parallel buckets, which with
  ODP reduce over d during the backward) once it is final: its collectives completed *and* autograd has run the
  backward of every use of the layer in this pass -- a layer called twice posts two reduce-scatters, and the
  layer's *uses token* (a 0-d leaf each use's backward returns a zero gradient for) tells when the last one ran,
  because autograd sums a leaf's gradients from all uses before accumulating it once. A parameter two layers read
  (``axgrid_shared``: tied embeddings) is reduced at once and handed back to autograd, which adds its uses. What is
  still in flight is completed by the runtime's end of the backward (:mod:`axgrid.core.backward`), so ``.grad`` is
  complete whenever ``loss.backward()`` returns.
- Both sinks post the input-gradient all-reduce: with OAR it stays in flight under the weight-gradient GEMM.
"""
from __future__ import annotations

import weakref
from typing import Callable, Optional, Protocol, Sequence

import torch

from ..core.backward import in_backward
from ..core.comm import Communicator, Pending, ready
from ..spec import GRADIENT_WINDOW, LinearSharding


class ShardedWeight(Protocol):
    """What the weight source needs of a layer (``axgrid.nn.Linear`` is one): its weight shard
    ``[ceil(n·k/(Gx·Gy·Gz))]`` (1-D, a block ``[n_blk, k_blk]`` flattened, padded and split over z) and its
    sharding."""

    weight: torch.nn.Parameter
    sharding: LinearSharding


class WeightGather:
    """OAG off: each layer all-gathers its weight block over z when it runs. With ``keep`` (the config's
    ``keep_gathered_weights``) the forward's block is saved for backward instead of the shard (one all-gather
    fewer, more memory). ``before_use(param)``: called before a shard is read outside the layer's forward (a
    prefetch: with ``zero`` >= 1 and ODP the shard's own all-gather over d completes first)."""

    pending: Optional[tuple[int, int, Pending]] = None   # never a prefetch in flight
    hits = misses = 0

    def __init__(self, comm: Communicator, keep: bool,
                 before_use: Callable[[torch.nn.Parameter], None] = lambda p: None) -> None:
        self.comm, self.keep, self.before_use = comm, keep, before_use

    # -- the all-gather over z --------------------------------------------------------------------------
    @staticmethod
    def compute_dtype(shard: torch.Tensor) -> Optional[torch.dtype]:
        """The dtype the GEMMs compute in when it is not the shard's: under autocast, its dtype. The weights are
        then gathered over z in it (bf16: half the bytes of the fp32 parameters) and the GEMMs cast nothing;
        casting before the gather equals casting after it, element for element."""
        dev = shard.device.type
        if torch.is_autocast_enabled(dev) and shard.is_floating_point():
            dt = torch.get_autocast_dtype(dev)
            return dt if dt != shard.dtype else None
        return None

    @staticmethod
    def _as_block(layer: ShardedWeight, gathered: torch.Tensor) -> torch.Tensor:
        """The block ``[n_blk, k_blk]`` from the all-gathered shards ``[Gz, shard]`` (padding dropped)."""
        sh = layer.sharding
        return gathered.reshape(-1)[: sh.block_numel].view(sh.n_blk, sh.k_blk)

    def gather(self, layer: ShardedWeight, shard: torch.Tensor) -> torch.Tensor:
        """``AG_z(shard)`` -> ``layer``'s block ``[n_blk, k_blk]``, in the compute dtype (:meth:`compute_dtype`)."""
        return self._as_block(layer, self.comm.all_gather(shard, "z", dtype=self.compute_dtype(shard)))

    def gather_async(self, layer: ShardedWeight) -> Pending:
        """``AG_z`` of ``layer``'s current weight shard, in flight; ``.wait()`` gives the block in the compute dtype."""
        self.before_use(layer.weight)
        shard = layer.weight.detach()
        pending = self.comm.all_gather(shard, "z", async_op=True, dtype=self.compute_dtype(shard))
        return Pending(None, lambda: self._as_block(layer, pending.wait()))

    # -- what a layer calls ---------------------------------------------------------------------------
    def forward(self, layer: ShardedWeight, shard: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer``'s block ``[n_blk, k_blk]`` for its forward, and what the forward saves for backward: the
        block (``keep``) or the shard."""
        block = self.gather(layer, shard)
        return block, (block if self.keep else shard)

    def backward(self, layer: ShardedWeight, saved: torch.Tensor, need_block: bool) -> Optional[torch.Tensor]:
        """Called once per layer backward: the block for the input gradient (None unless ``need_block``), from
        what :meth:`forward` saved."""
        if not need_block:
            return None
        return saved if self.keep else self.gather(layer, saved)

    def end_of_backward(self) -> None:
        """The runtime's end of a backward pass (nothing to do here)."""

    def drop(self) -> None:
        """Complete and forget an outstanding prefetch (none here)."""


class WeightPrefetcher(WeightGather):
    """OAG: prefetch the next layer's weight all-gather over z in execution order."""

    def __init__(self, comm: Communicator, keep: bool,
                 before_use: Callable[[torch.nn.Parameter], None] = lambda p: None,
                 arm: Callable[[], None] = lambda: None) -> None:
        super().__init__(comm, keep, before_use)
        self.arm = arm                            # the runtime's end of the backward (axgrid.core.backward)
        # layer id -> the layer that ran after it (weak: a deleted model is not kept alive)
        self.next_of: dict[str, dict[int, weakref.ref]] = {"fwd": {}, "bwd": {}}
        self.seen: dict[str, set[int]] = {"fwd": set(), "bwd": set()}
        self.recording = {"fwd": True, "bwd": True}
        self.last: dict[str, Optional[int]] = {"fwd": None, "bwd": None}
        self.pending = None   # (layer id, weight version, gather)
        self.hits = self.misses = 0

    def _mode(self) -> str:
        return "bwd" if in_backward() else "fwd"

    def forward(self, layer: ShardedWeight, shard: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        block = self._block(layer, shard)
        return block, (block if self.keep else shard)

    def backward(self, layer: ShardedWeight, saved: torch.Tensor, need_block: bool) -> Optional[torch.Tensor]:
        self.note_backward()
        return super().backward(layer, saved, need_block)

    def _block(self, layer: ShardedWeight, shard: torch.Tensor) -> torch.Tensor:
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
            block = self.gather(layer, shard)
        ref = None if self.recording[mode] else self.next_of[mode].get(key)
        nxt = ref() if ref is not None else None
        if nxt is not None and self.comm.size("z") > 1:
            self.pending = (id(nxt), nxt.weight._version, self.gather_async(nxt))
        return block

    def note_backward(self) -> None:
        """Called from inside a backward pass: the forward order is complete; reset at the pass's end."""
        self.recording["fwd"] = False
        self.arm()

    def end_of_backward(self) -> None:
        """The runtime's end of a backward pass: both orders are recorded; an unused prefetch is dropped."""
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
    :meth:`all_reduce` from their backward, and pass :meth:`uses_token` to their autograd function; the buckets ask
    :meth:`delivers`; the runtime's end of the backward calls :meth:`finish`.
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

    def uses_token(self, params: Sequence[torch.nn.Parameter]) -> Optional[torch.Tensor]:
        """A 0-d leaf that a layer owning ``params`` passes to its autograd function, which returns a zero
        gradient for it from each use's backward (None: no token needed -- autograd sums the uses itself)."""
        return None

    def delivers(self, param: torch.nn.Parameter) -> bool:
        """Whether this sink writes ``param.grad`` itself (then autograd's accumulation is not its final
        gradient: the sink hands it on when it is final)."""
        return False

    def finish(self) -> None:
        """Complete every collective in flight (none here)."""

    def empty(self) -> bool:
        return True


class GradientPipeline(GradientSink):
    """ORS: weight-gradient reduce-scatters and bias all-reduces over z in flight during the backward, completed
    :data:`~axgrid.spec.GRADIENT_WINDOW` posts later or at the end of the backward; each result is added into
    ``.grad``, and a parameter is handed to ``on_ready(param)`` (the data-parallel buckets) once its collectives
    have completed and its layer's uses token has fired (see the module docstring). ``arm``: the runtime's end of
    the backward (:class:`axgrid.core.backward.BackwardPass`), which calls :meth:`finish`."""

    def __init__(self, comm: Communicator, oar: bool,
                 on_ready: Callable[[torch.nn.Parameter], None] = lambda p: None,
                 arm: Callable[[], None] = lambda: None) -> None:
        super().__init__(comm, oar)
        self.on_ready, self.arm = on_ready, arm
        self.inflight: list[tuple[list[torch.nn.Parameter], Pending]] = []
        self.delivered: set[int] = set()              # ids of parameters whose gradients this pipeline writes
        self.outstanding: dict[int, int] = {}         # id(param) -> its collectives not yet completed
        self.written: dict[int, torch.nn.Parameter] = {}   # written this pass, not yet handed on
        self.uses_done: set[int] = set()              # ids whose layer ran the backward of its last use
        self.tokened: set[int] = set()                # ids whose layer passes a uses token (else: one use)
        self.tokens: dict[int, tuple[weakref.ref, torch.Tensor]] = {}   # id(first param) -> (it, its token)

    def uses_token(self, params: Sequence[torch.nn.Parameter]) -> Optional[torch.Tensor]:
        first = params[0]
        ref, token = self.tokens.get(id(first), (None, None))
        if ref is None or ref() is not first:
            token = torch.zeros((), device=first.device, requires_grad=True)
            refs = [weakref.ref(p) for p in params]
            me = weakref.ref(self)

            def last_use_ran(t: torch.Tensor) -> None:
                t.grad = None
                pipe = me()
                if pipe is not None:
                    pipe._uses_ran([p for p in (r() for r in refs) if p is not None])

            token.register_post_accumulate_grad_hook(last_use_ran)
            self.tokened.update(id(p) for p in params)
            self.tokens = {k: v for k, v in self.tokens.items() if v[0]() is not None}
            self.tokens[id(first)] = (weakref.ref(first), token)
        return token

    def _uses_ran(self, params: list[torch.nn.Parameter]) -> None:
        for p in params:
            self.uses_done.add(id(p))
            self._hand_on(p)

    def _hand_on(self, param: torch.nn.Parameter) -> None:
        """Hand ``param`` on when its gradient of this pass is final."""
        k = id(param)
        if (k in self.uses_done or k not in self.tokened) and not self.outstanding.get(k) and k in self.written:
            del self.written[k]
            self.on_ready(param)

    def delivers(self, param: torch.nn.Parameter) -> bool:
        return id(param) in self.delivered

    def reduce_scatter(self, param: torch.nn.Parameter, flat: torch.Tensor) -> Optional[torch.Tensor]:
        """Post ``RS_z(flat)`` for ``param``'s gradient and complete the one before last (it ran under our
        GEMMs); None for autograd: the pipeline writes ``param.grad`` itself. A parameter read by several layers
        (``axgrid_shared``: tied embeddings) is reduced at once and handed back to autograd, which sums its uses
        before ``.grad`` (and before the data-parallel buckets see it)."""
        if getattr(param, "axgrid_shared", False):
            return super().reduce_scatter(param, flat)
        self.arm()
        self._post([param], self.comm.reduce_scatter(flat, "z", async_op=True))
        return None

    def all_reduce(self, params: Sequence[torch.nn.Parameter], grads: Sequence[torch.Tensor],
                   dim: str) -> list[Optional[torch.Tensor]]:
        """Post one ``AR_dim`` of the concatenated ``grads`` (partial gradients of ``params``); Nones."""
        self.arm()
        flat = grads[0].reshape(-1) if len(grads) == 1 else torch.cat([g.reshape(-1) for g in grads])
        self._post(list(params), self.comm.all_reduce(flat, dim, async_op=True))
        return [None] * len(grads)

    def _post(self, params: list[torch.nn.Parameter], pending: Pending) -> None:
        for p in params:
            self.delivered.add(id(p))
            self.outstanding[id(p)] = self.outstanding.get(id(p), 0) + 1
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
            self.outstanding[id(param)] -= 1
            self.written[id(param)] = param
            self._hand_on(param)

    def finish(self) -> None:
        """Complete every collective in flight, write the results to ``.grad`` and hand every gradient of the
        pass on (every use has run by now). Idempotent."""
        while self.inflight:
            self._complete(*self.inflight.pop(0))
        for k, p in list(self.written.items()):
            self.uses_done.add(k)
            self._hand_on(p)
        self.uses_done.clear()

    def empty(self) -> bool:
        return not self.inflight
