"""The one communication entry point: every collective of the runtime goes through a ``Communicator``.

It knows the process group of each grid dimension, records every call in a ``Ledger`` (calls, bytes, ring
wire bytes and optionally time, per dimension and operation), and handles the backend traps once:

- gloo silently corrupts ``all_reduce``/``broadcast`` on non-contiguous views -> we reduce a contiguous copy;
- gloo's ``all_gather_into_tensor`` wants a flat output -> we gather flat and reshape;
- uneven ``all_gather`` raises -> ``all_gather_uneven`` pads to the largest part and trims;
- uneven all-to-all (expert parallelism's dispatch and combine) -> ``all_to_all_uneven``, rows of a contiguous
  buffer with per-member split sizes (``all_to_all_single``), a part of no rows included;
- gloo sums bf16 in bf16 -> low-precision reductions are summed in fp32 (``RuntimeConfig.reduce_in_fp32``);
- a backend without ``reduce_scatter_tensor`` gets it from an all-reduce, still asynchronous, and the ledger
  counts the all-reduce's bytes (what really moved).

A collective over a group of one rank is not posted and not recorded.
``Ledger`` bytes are the size of the collective's full buffer (the all-reduced tensor, the all-gather's output,
the reduce-scatter's input); ``wire_bytes`` are what each rank sends in a ring algorithm.
"""
from __future__ import annotations

import datetime
import itertools
import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from ..device.base import Event
from ..device.clocks import HostClock
from ..device.select import backend_device_type
from ..launch.report import mark_in_collective

LOW_PRECISION = (torch.bfloat16, torch.float16)

# Newer torch renamed the single-tensor collectives; use whichever this torch has.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` are the same elements of the same storage (views alike). Compares storages, not
    ``data_ptr()``, which fake tensors (the dry run) do not have."""
    return (a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
            and torch._C._is_alias_of(a, b))


@dataclass
class LedgerEntry:
    calls: int = 0
    bytes: int = 0
    wire_bytes: float = 0.0
    seconds: float = 0.0       # post -> completion (timed runs only)
    wait_seconds: float = 0.0  # time spent blocked waiting (the part not hidden under compute)


class Ledger:
    """Per (grid dimension, operation): how many collectives, how many bytes, how long (``entries``).

    Times measured with device events (a GPU backend, :mod:`axgrid.device.clocks`) are added when the ledger is
    read (``entries``, ``snapshot``, ``table`` settle them first): reading them waits for the device, which is why
    nothing reads them in the timed path."""

    #: Unsettled timings kept before those whose events the device has reached are settled without waiting.
    SETTLE_AFTER = 4096

    def __init__(self, entries: Optional[dict[tuple[str, str], LedgerEntry]] = None) -> None:
        self._entries: dict[tuple[str, str], LedgerEntry] = dict(entries or {})
        self.unsettled: list[tuple[LedgerEntry, Event, Event, Event]] = []

    @property
    def entries(self) -> dict[tuple[str, str], LedgerEntry]:
        """(dim, op) -> its entry, every timing settled."""
        self.settle()
        return self._entries

    def record(self, dim: str, op: str, nbytes: int, group_size: int) -> LedgerEntry:
        e = self._entries.setdefault((dim, op), LedgerEntry())
        e.calls += 1
        e.bytes += nbytes
        p = group_size
        e.wire_bytes += {"all_reduce": 2 * (p - 1) / p, "send": 1.0, "recv": 0.0}.get(op, (p - 1) / p) * nbytes
        return e

    def add_time(self, entry: LedgerEntry, posted: Event, waiting: Event, done: Event) -> None:
        """Charge ``entry`` with post -> done and waiting -> done, once the events are read (:meth:`settle`)."""
        self.unsettled.append((entry, posted, waiting, done))
        if len(self.unsettled) > self.SETTLE_AFTER:       # a long timed run nobody reads: keep the list short
            self.settle(wait=False)

    def settle(self, wait: bool = True) -> None:
        """Add the times of the event-timed collectives (waits for the device to reach their last events; with
        ``wait=False`` only those it has reached, in order)."""
        n = len(self.unsettled)
        if not wait:
            n = next((i for i, (_, _, _, done) in enumerate(self.unsettled) if not done.done()), n)
        pending, self.unsettled = self.unsettled[:n], self.unsettled[n:]
        for entry, posted, waiting, done in pending:
            entry.seconds += posted.seconds_to(done)
            entry.wait_seconds += waiting.seconds_to(done)

    def reset(self) -> None:
        self._entries.clear()
        self.unsettled.clear()

    def snapshot(self) -> dict[tuple[str, str], LedgerEntry]:
        return {k: LedgerEntry(**vars(v)) for k, v in self.entries.items()}

    def bytes_by_dim(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (dim, _), e in self._entries.items():
            out[dim] = out.get(dim, 0) + e.bytes
        return out

    def table(self) -> str:
        """A readable table, one row per (dimension, operation); times only when they were recorded."""
        entries = self.entries
        timed = any(e.seconds for e in entries.values())
        rows = [f"{'dim':<4} {'operation':<16} {'calls':>7} {'bytes':>14} {'wire bytes/rank':>16}"
                + (f" {'time s':>9} {'blocked s':>9}" if timed else "")]
        for (dim, op) in sorted(entries):
            e = entries[(dim, op)]
            rows.append(f"{dim:<4} {op:<16} {e.calls:>7} {e.bytes:>14,} {int(e.wire_bytes):>16,}"
                        + (f" {e.seconds:>9.4f} {e.wait_seconds:>9.4f}" if timed else ""))
        return "\n".join(rows)


class Pending:
    """A collective in flight. ``wait()`` blocks until it is done and returns its result tensor.

    Timed (``clock`` given): marks at the post, when the caller begins to wait and when the wait returns, on the
    clock of the backend (:mod:`axgrid.device.clocks`): host times on gloo, events on the compute stream on a GPU,
    settled later by the ledger. ``record``: the flight recorder's entry for it (:mod:`axgrid.launch.flight`)."""

    def __init__(self, work: Optional[dist.Work], finish: Callable[[], torch.Tensor],
                 entry: Optional[LedgerEntry] = None, clock=None, tracer=None, label: str = "",
                 comm: Optional["Communicator"] = None, record=None) -> None:
        self._work, self._finish, self._entry = work, finish, entry
        self._clock, self._tracer, self._label = clock, tracer, label
        self._comm, self._record = comm, record
        self._posted = None
        self._result: Optional[torch.Tensor] = None
        self.done = False

    def wait(self, blocked_since=None) -> torch.Tensor:
        """Block until done; return the result. ``blocked_since``: the clock mark from which the caller has been
        blocking on it (a synchronous collective blocks from its post)."""
        if not self.done:
            clock = self._clock
            waiting = (blocked_since or clock.mark()) if clock is not None else None
            if self._work is not None:
                try:
                    self._work.wait()
                except Exception as e:
                    mark_in_collective(e)         # a consequence, not the job's cause (axgrid.launch.report)
                    if self._comm is not None and self._comm.recorder is not None:
                        self._comm.recorder.failed(self._record, e)
                    raise
                if self._record is not None:      # on a GPU backend wait() only queues: the watchdog asks later
                    self._comm.recorder.waited(self._record, done=not self._comm.device_backend)
            if clock is not None and self._posted is not None:
                done = clock.mark()
                if self._entry is not None and self._comm is not None:
                    self._comm.ledger.add_time(self._entry, self._posted, waiting, done)
                if self._tracer is not None and self._work is not None:
                    self._tracer.span(self._label, "comm", self._posted, done)
                    self._tracer.span("wait " + self._label, "wait", waiting, done)
            self._result = self._finish()
            self.done = True
            self._work = self._finish = None  # type: ignore[assignment]
        assert self._result is not None
        return self._result


#: Live communicators by key, so that the compiled-graph ops below can reach them (a registry, not a switch).
_COMMUNICATORS: "weakref.WeakValueDictionary[int, Communicator]" = weakref.WeakValueDictionary()
_KEYS = itertools.count()


# Under torch.compile a synchronous collective is one opaque op in the graph (no graph break): the op runs the
# communicator's own eager method, so the ledger, timing and tracing count it exactly as in eager mode.
@torch.library.custom_op("axgrid::all_reduce", mutates_args=())
def _compiled_all_reduce(t: torch.Tensor, key: int, dim: str, average: bool) -> torch.Tensor:
    return _COMMUNICATORS[key].all_reduce(t.clone(), dim, average=average)


@_compiled_all_reduce.register_fake
def _(t: torch.Tensor, key: int, dim: str, average: bool) -> torch.Tensor:
    return torch.empty_like(t)


@torch.library.custom_op("axgrid::all_gather", mutates_args=())
def _compiled_all_gather(t: torch.Tensor, key: int, dim: str) -> torch.Tensor:
    return _COMMUNICATORS[key].all_gather(t, dim)


@_compiled_all_gather.register_fake
def _(t: torch.Tensor, key: int, dim: str) -> torch.Tensor:
    return t.new_empty((_COMMUNICATORS[key].sizes[dim], *t.shape))


@torch.library.custom_op("axgrid::reduce_scatter", mutates_args=())
def _compiled_reduce_scatter(t: torch.Tensor, key: int, dim: str, average: bool) -> torch.Tensor:
    return _COMMUNICATORS[key].reduce_scatter(t.clone(), dim, average=average)


@_compiled_reduce_scatter.register_fake
def _(t: torch.Tensor, key: int, dim: str, average: bool) -> torch.Tensor:
    return t.new_empty((t.shape[0] // _COMMUNICATORS[key].sizes[dim], *t.shape[1:]))


def _all_reduce_within(buf: torch.Tensor, group: dist.ProcessGroup, timeout_s: float) -> dist.Work:
    """A sum all-reduce on ``group`` whose time limit is ``timeout_s``, not the group's (the backends take a limit
    per call: gloo and NCCL's watchdog honour it)."""
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    opts.timeout = datetime.timedelta(seconds=timeout_s)
    opts.asyncOp = True
    return group.allreduce([buf], opts)


def _compiling(async_op: bool, p: int) -> bool:
    """True while torch.compile traces a synchronous collective over more than one rank."""
    return not async_op and p > 1 and torch.compiler.is_compiling()


def ready(t: torch.Tensor) -> Pending:
    """A completed :class:`Pending` holding ``t`` (a collective that ran synchronously, or had nothing to do).
    Built complete, without a clock read, so torch.compile traces it without a graph break."""
    p = Pending.__new__(Pending)     # nothing to wait for or time: only the result
    p._work, p._finish, p._result, p.done, p._record = None, None, t, True, None
    return p


class Communicator:
    """Collectives along the grid's dimensions. ``dim`` names a group: "x", "y", "z", "d", "xy", "xyz".

    Members of a group are ordered by global rank (``indices[dim]`` is this rank's place): for one letter that is
    its coordinate; for several letters it follows the grid's rank order."""

    def __init__(self, groups: dict[str, Optional[dist.ProcessGroup]], sizes: dict[str, int],
                 indices: dict[str, int], backend: str, reduce_in_fp32: Optional[bool] = None,
                 record_timing: bool = False, native_reduce_scatter: Optional[bool] = None, tracer=None,
                 clock=None, recorder=None) -> None:
        self.groups, self.sizes, self.indices = groups, sizes, indices
        self.backend = backend
        self.device_backend = backend_device_type(backend) == "cuda"
        self.reduce_in_fp32 = (backend == "gloo") if reduce_in_fp32 is None else reduce_in_fp32
        self.native_reduce_scatter = (backend in ("gloo", "nccl", "fake")) if native_reduce_scatter is None \
            else native_reduce_scatter
        self.record_timing = record_timing
        self.tracer = tracer
        self.clock = clock if clock is not None else (tracer.clock if tracer is not None else None)
        if self.clock is None and record_timing:
            self.clock = HostClock()
        self.recorder = recorder
        self.ledger = Ledger()
        self.key = next(_KEYS)
        _COMMUNICATORS[self.key] = self

    # -- helpers --------------------------------------------------------------------------------------
    def size(self, dim: str) -> int:
        return self.sizes[dim]

    def _check(self, dim: str) -> None:
        if dim not in self.sizes:
            raise ValueError(f"unknown grid dimension {dim!r}; choose one of {sorted(self.sizes)}")

    def _buffer(self, t: torch.Tensor, reduce: bool) -> torch.Tensor:
        """A contiguous buffer the backend can work on (fp32 for low-precision sums when configured)."""
        if reduce and self.reduce_in_fp32 and t.dtype in LOW_PRECISION:
            return t.float().contiguous()
        return t.contiguous()

    def _post(self, dim: str, op: str, nbytes: int, launch: Callable[[], Optional[dist.Work]],
              finish: Callable[[], Any], async_op: bool, on_host: bool = False) -> Any:
        """Post one collective: its ledger entry and flight record, ``launch()`` (failures go to the flight recorder),
        then a :class:`Pending` (``async_op``) or ``finish()``'s result once done. ``on_host``: ``launch`` runs the
        whole collective on the host (an object broadcast) and returns None: it is done when it returns, untimed."""
        entry = self.ledger.record(dim, op, nbytes, self.sizes[dim])
        timed = (self.record_timing or self.tracer is not None) and not on_host
        clock = self.clock if timed else None
        record = self.recorder.posted(dim, op, nbytes) if self.recorder is not None else None
        pending = Pending(None, finish, entry, clock, self.tracer, f"{op}_{dim}", self, record)
        if clock is not None:
            pending._posted = clock.mark()        # an event on the stream the collective waits for: no sync
        try:
            pending._work = launch()
        except Exception as e:
            if isinstance(e, dist.DistError):     # the backend's, not a bad argument of this rank's
                mark_in_collective(e)
            if self.recorder is not None:
                self.recorder.failed(record, e)
            raise
        if record is not None:
            record.work = pending._work
        if on_host:
            if record is not None:
                self.recorder.waited(record, done=True)
            return finish()
        return pending if async_op else pending.wait(blocked_since=pending._posted)

    # -- collectives ----------------------------------------------------------------------------------
    def all_reduce(self, t: torch.Tensor, dim: str, *, average: bool = False,
                   async_op: bool = False, timeout_s: Optional[float] = None) -> torch.Tensor | Pending:
        """Sum (or mean) of ``t`` over the group along ``dim``. ``t`` itself may be overwritten. ``timeout_s``:
        this call's own limit instead of the group's (an agreement where ranks may wait on others' file I/O)."""
        self._check(dim)
        p = self.sizes[dim]
        if p == 1:
            return ready(t) if async_op else t
        if _compiling(async_op, p):
            return torch.ops.axgrid.all_reduce(t, self.key, dim, average)
        buf = self._buffer(t, reduce=True)

        def finish() -> torch.Tensor:
            if average:
                buf.div_(p)
            return buf if buf.dtype == t.dtype else buf.to(t.dtype)

        if timeout_s is None:
            launch = lambda: dist.all_reduce(buf, group=self.groups[dim], async_op=True)  # noqa: E731
        else:
            launch = lambda: _all_reduce_within(buf, self.groups[dim], timeout_s)  # noqa: E731
        return self._post(dim, "all_reduce", buf.numel() * buf.element_size(), launch, finish, async_op)

    def all_gather(self, t: torch.Tensor, dim: str, *, async_op: bool = False,
                   dtype: Optional[torch.dtype] = None) -> torch.Tensor | Pending:
        """Every member's ``t`` stacked in group order: ``[p, *t.shape]``. ``dtype``: gather in this dtype (e.g.
        fp32 weight shards as bf16): this rank's part is cast straight into its slot of the output and gathered in
        place, so the cast makes no temporary."""
        self._check(dim)
        p = self.sizes[dim]
        if p == 1:
            out = t.unsqueeze(0)
            return ready(out) if async_op else out
        if _compiling(async_op, p):
            return torch.ops.axgrid.all_gather(t if dtype is None else t.to(dtype), self.key, dim)
        if dtype is not None and dtype != t.dtype:
            n = t.numel()
            out = torch.empty(p * n, dtype=dtype, device=t.device)
            mine = out[self.indices[dim] * n:(self.indices[dim] + 1) * n]
            mine.copy_(t.reshape(-1))
            src = mine
        else:
            src = t.contiguous().reshape(-1)
            out = torch.empty(p * src.numel(), dtype=t.dtype, device=t.device)
        return self._post(dim, "all_gather", out.numel() * out.element_size(),
                          lambda: _all_gather_single(out, src, group=self.groups[dim], async_op=True),
                          lambda: out.view(p, *t.shape), async_op)

    def all_gather_uneven(self, t: torch.Tensor, dim: str, sizes: Sequence[int], *,
                          async_op: bool = False) -> torch.Tensor | Pending:
        """Concatenate along tensor dim 0 parts whose first sizes are ``sizes`` (one per member, in order).

        Parts are padded to the largest, gathered, and trimmed: ``[sum(sizes), *t.shape[1:]]``.
        """
        self._check(dim)
        p = self.sizes[dim]
        if len(sizes) != p or t.shape[0] != sizes[self.indices[dim]]:
            raise ValueError(f"all_gather_uneven over {dim}: sizes {list(sizes)} do not match group size {p} "
                             f"and this rank's part of {t.shape[0]} rows")
        big = max(sizes)
        if all(s == big for s in sizes):
            padded = t
        else:
            padded = torch.zeros((big, *t.shape[1:]), dtype=t.dtype, device=t.device)
            padded[: t.shape[0]] = t
        res = self.all_gather(padded, dim, async_op=True)
        assert isinstance(res, Pending)

        def finish() -> torch.Tensor:
            stacked = res.wait()                       # [p, big, ...]
            if padded is t:                            # even parts: the gathered buffer already is the result
                return stacked.reshape(p * big, *t.shape[1:])
            return torch.cat([stacked[i, : sizes[i]] for i in range(p)], dim=0)

        pending = Pending(None, finish)
        return pending if async_op else pending.wait()

    def reduce_scatter(self, t: torch.Tensor, dim: str, *, average: bool = False,
                       async_op: bool = False) -> torch.Tensor | Pending:
        """Sum over the group of ``t`` (``[p*s, ...]``), of which this rank keeps its chunk ``[s, ...]``."""
        self._check(dim)
        p = self.sizes[dim]
        if t.shape[0] % p:
            raise ValueError(f"reduce_scatter over {dim}: first size {t.shape[0]} is not divisible by the group "
                             f"size {p}; pad it first")
        if p == 1:
            out = t / p if average else t
            return ready(out) if async_op else out
        if _compiling(async_op, p):
            return torch.ops.axgrid.reduce_scatter(t, self.key, dim, average)
        buf = self._buffer(t, reduce=True)
        chunk = t.shape[0] // p
        idx = self.indices[dim]
        group = self.groups[dim]
        if self.native_reduce_scatter:
            out = torch.empty((chunk, *t.shape[1:]), dtype=buf.dtype, device=t.device)
            flat_in, flat_out = buf.reshape(-1), out.reshape(-1)

            def finish() -> torch.Tensor:
                if average:
                    out.div_(p)
                return out if out.dtype == t.dtype else out.to(t.dtype)

            return self._post(dim, "reduce_scatter", buf.numel() * buf.element_size(),
                              lambda: _reduce_scatter_single(flat_out, flat_in, group=group, async_op=True),
                              finish, async_op)

        def finish_ar() -> torch.Tensor:  # backend without reduce_scatter: all-reduce, keep our chunk
            mine = buf[idx * chunk:(idx + 1) * chunk].clone()
            if average:
                mine.div_(p)
            return mine if mine.dtype == t.dtype else mine.to(t.dtype)

        return self._post(dim, "all_reduce", buf.numel() * buf.element_size(),
                          lambda: dist.all_reduce(buf, group=group, async_op=True), finish_ar, async_op)

    # -- in place, on a flat buffer cut into equal shares (the sharded optimizer's buckets) -----------------
    def reduce_scatter_(self, t: torch.Tensor, dim: str, *, average: bool = False,
                        async_op: bool = False) -> torch.Tensor | Pending:
        """In place on the 1-D contiguous ``t [p·s]``: this rank's share ``t[i·s : (i+1)·s]`` (``i``: its index
        in the group) becomes the sum (or mean) over the group of that share; the rest of ``t`` is unspecified
        afterwards (a backend without reduce-scatter all-reduces it whole). Returns the share (a view of ``t``).
        Low-precision sums follow ``reduce_in_fp32`` (then through an fp32 copy, written back)."""
        self._check(dim)
        p = self.sizes[dim]
        if t.dim() != 1 or not t.is_contiguous() or t.numel() % p:
            raise ValueError(f"reduce_scatter_ over {dim}: needs a contiguous 1-D tensor whose size is a multiple of "
                             f"the group size {p}, got shape {tuple(t.shape)}")
        s, i = t.numel() // p, self.indices[dim]
        share = t[i * s:(i + 1) * s]
        if p == 1:
            return ready(share) if async_op else share
        buf = self._buffer(t, reduce=True)
        out = buf[i * s:(i + 1) * s]
        group = self.groups[dim]

        def finish() -> torch.Tensor:
            if average:
                out.div_(p)
            if not same_memory(out, share):
                share.copy_(out)
            return share

        if self.native_reduce_scatter:
            launch = lambda: _reduce_scatter_single(out, buf, group=group, async_op=True)   # noqa: E731
            op = "reduce_scatter"
        else:                                   # a backend without reduce_scatter: all-reduce the whole buffer
            launch = lambda: dist.all_reduce(buf, group=group, async_op=True)              # noqa: E731
            op = "all_reduce"
        return self._post(dim, op, buf.numel() * buf.element_size(), launch, finish, async_op)

    def all_gather_(self, t: torch.Tensor, dim: str, *, async_op: bool = False) -> torch.Tensor | Pending:
        """In place on the 1-D contiguous ``t [p·s]``: every member's share ``t[j·s : (j+1)·s]`` is filled with
        what member ``j`` holds there (this rank's own share is the input). Returns ``t``."""
        self._check(dim)
        p = self.sizes[dim]
        if t.dim() != 1 or not t.is_contiguous() or t.numel() % p:
            raise ValueError(f"all_gather_ over {dim}: needs a contiguous 1-D tensor whose size is a multiple of the "
                             f"group size {p}, got shape {tuple(t.shape)}")
        if p == 1:
            return ready(t) if async_op else t
        s, i = t.numel() // p, self.indices[dim]
        return self._post(dim, "all_gather", t.numel() * t.element_size(),
                          lambda: _all_gather_single(t, t[i * s:(i + 1) * s], group=self.groups[dim], async_op=True),
                          lambda: t, async_op)

    def send(self, t: torch.Tensor, dim: str, dst_index: int, *, async_op: bool = False,
             tag: int = 0) -> Optional[Pending]:
        """Point to point: ``t`` to member ``dst_index`` of the group along ``dim`` (blocks until it is received,
        or with ``async_op`` a :class:`Pending`; ledger op ``send``, wire bytes = bytes). The receiver calls
        :meth:`recv` with this rank's index and the same ``tag``; messages between one pair match in posting order."""
        self._check(dim)
        buf = t.contiguous()
        dst = dist.get_global_rank(self.groups[dim], dst_index)
        res = self._post(dim, "send", buf.numel() * buf.element_size(),
                         lambda: dist.isend(buf, dst=dst, group=self.groups[dim], tag=tag), lambda: buf, async_op)
        return res if async_op else None

    def recv(self, out: torch.Tensor, dim: str, src_index: int, *, async_op: bool = False,
             tag: int = 0) -> torch.Tensor | Pending:
        """Point to point: fill the contiguous ``out`` with what member ``src_index`` of the group along ``dim``
        sends (ledger op ``recv``, no wire bytes: the sender counts them). Returns ``out`` (with ``async_op`` a
        :class:`Pending` whose ``wait()`` returns it)."""
        self._check(dim)
        if not out.is_contiguous():
            raise ValueError("recv: the output buffer must be contiguous")
        src = dist.get_global_rank(self.groups[dim], src_index)
        return self._post(dim, "recv", out.numel() * out.element_size(),
                          lambda: dist.irecv(out, src=src, group=self.groups[dim], tag=tag), lambda: out, async_op)

    def all_to_all_uneven(self, t: torch.Tensor, dim: str, send_sizes: Sequence[int], recv_sizes: Sequence[int], *,
                          async_op: bool = False) -> torch.Tensor | Pending:
        """Rows of ``t [sum(send_sizes), ...]`` to the members of the group along ``dim``: the first
        ``send_sizes[0]`` rows to member 0, the next to member 1, ...; returns ``[sum(recv_sizes), ...]``, the rows
        member ``j`` sent this rank in place ``j`` (``recv_sizes[j]`` of them, what ``j`` had as ``send_sizes`` for
        this rank). Sizes may be uneven and 0. Ledger op ``all_to_all``: bytes are this rank's sent buffer, wire bytes
        those sent to the other members."""
        self._check(dim)
        p = self.sizes[dim]
        if len(send_sizes) != p or len(recv_sizes) != p or sum(send_sizes) != t.shape[0]:
            raise ValueError(f"all_to_all_uneven over {dim}: send sizes {list(send_sizes)} and receive sizes "
                             f"{list(recv_sizes)} need one per member of the group of {p}, the send sizes summing to "
                             f"the {t.shape[0]} rows given")
        if p == 1:
            return ready(t) if async_op else t
        src = t.contiguous()
        out = src.new_empty((sum(recv_sizes), *t.shape[1:]))
        row = math.prod(src.shape[1:])                         # elements per row (a row may have none)
        sent = (sum(send_sizes) - send_sizes[self.indices[dim]]) * row * src.element_size()
        entry_bytes = src.numel() * src.element_size()

        def launch() -> dist.Work:
            return dist.all_to_all_single(out, src, [int(v) for v in recv_sizes], [int(v) for v in send_sizes],
                                          group=self.groups[dim], async_op=True)

        res = self._post(dim, "all_to_all", entry_bytes, launch, lambda: out, async_op)
        e = self.ledger._entries[(dim, "all_to_all")]
        e.wire_bytes += sent - (p - 1) / p * entry_bytes      # what really left this rank, not a ring's share
        return res

    def broadcast_object(self, obj: object, dim: str, src_index: int = 0) -> object:
        """Member ``src_index``'s picklable ``obj`` on every member of the group along ``dim`` (ledger op
        ``broadcast_object``, bytes unknown before pickling: counted as 0)."""
        self._check(dim)
        if self.sizes[dim] == 1:
            return obj
        box = [obj]
        src = dist.get_global_rank(self.groups[dim], src_index)
        return self._post(dim, "broadcast_object", 0,
                          lambda: dist.broadcast_object_list(box, src=src, group=self.groups[dim]), lambda: box[0],
                          False, on_host=True)

    def close(self) -> None:
        """Stop the flight recorder's watchdog (the grid is being destroyed)."""
        if self.recorder is not None:
            self.recorder.close()

    def broadcast(self, t: torch.Tensor, dim: str, src_index: int = 0) -> torch.Tensor:
        """Member ``src_index``'s ``t`` on every member of the group along ``dim``."""
        self._check(dim)
        if self.sizes[dim] == 1:
            return t
        buf = t.contiguous()
        src = dist.get_global_rank(self.groups[dim], src_index)
        return self._post(dim, "broadcast", buf.numel() * buf.element_size(),
                          lambda: dist.broadcast(buf, src=src, group=self.groups[dim], async_op=True),
                          lambda: buf, False)
