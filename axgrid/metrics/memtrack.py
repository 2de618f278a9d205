"""Measuring tensor memory on one rank: bytes saved for backward, and live tensor bytes over time by storage.

Both count **storages**, not tensors: views share their base's storage, which is counted once, at its full size
(a view of a bigger buffer costs the whole buffer, as it does in the allocator). The tools:

- :func:`storage_bytes` (tensors) -> bytes of their distinct storages (parameters, ``.grad``, optimizer state);
- :class:`SavedBytes`: a ``torch.autograd.graph.saved_tensors_hooks`` context that records every tensor autograd
  saves for backward, by tag (the named module running when it was saved, e.g. ``"blocks.0"``, ``"head"``);
  storages given in ``exclude`` (parameters: a layer saves its weight *shard*, which is a parameter, not an
  activation) are left out. Under ``torch.utils.checkpoint`` (non-reentrant) a block's own saved tensors go
  through the checkpoint's hooks (not seen: they are dropped and recomputed) and the checkpoint saves the
  block's inputs, which ``inputs_of`` attributes to the block.
- :class:`LiveBytes`: a ``TorchDispatchMode`` that sees every tensor an operator returns (factories, collectives'
  output buffers, autograd's backward on the calling thread), registers each new storage once with a
  ``weakref.finalize`` on its ``UntypedStorage`` (run when the last tensor or view of it dies), and so follows
  the live bytes and their peak; ``existing`` seeds it with storages made before it started (parameters,
  gradients, optimizer state). :meth:`LiveBytes.category` attributes what is allocated inside a ``with`` to a
  named category with its own current/peak;
- :func:`watch_weight_source`: what an axgrid runtime's weight source allocates (gathered blocks) as a category,
  and what it hands layers to save (to tell kept gathered blocks from activations).

Why hand-written: the CUDA allocator's ``max_memory_allocated`` exists only on GPUs (and counts allocator blocks,
rounded, not tensors), and ``torch.profiler``'s memory timeline is a profiling run with post-processing, not a number
per component; the dispatch mode and the storage finalizers give the same answer on every device, attributable to a
category. What a backend allocates outside torch's operators (non-tensor scratch) is not seen.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager, nullcontext
from typing import Any, Iterable, Iterator, Mapping, Optional

import torch
import torch._dynamo  # noqa: F401  (entering a TorchDispatchMode imports it, ~2 s: here, once, e.g. in a forkserver)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def storage_key(t: torch.Tensor) -> int:
    """An identity for ``t``'s storage, shared by all its views (the StorageImpl's address while it lives)."""
    return t.untyped_storage()._cdata


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def storage_bytes(tensors: Iterable[Optional[torch.Tensor]]) -> int:
    """Bytes of the distinct storages of ``tensors`` (None skipped; views of one storage counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            seen[storage_key(t)] = _nbytes(t)
    return sum(seen.values())


def live_keys(refs: Iterable[weakref.ref]) -> list[int]:
    """The storage keys of the weakly referenced storages still alive (a dead one's address may be reused)."""
    return [s._cdata for s in (r() for r in refs) if s is not None]


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in ``optimizer.state`` (AdamW: ``exp_avg``, ``exp_avg_sq`` and the 0-d ``step`` per parameter)."""
    return [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


class SavedBytes:
    """Bytes of the storages autograd saves for backward, per tag (see the module docstring).

    ``tags``: {tag: module}; while a tagged module's forward runs, what is saved is recorded under its tag
    (the innermost tagged module wins), else under ``"other"``. ``exclude``: tensors whose storages are never
    counted (the parameters). A storage saved twice (e.g. by two operators) is counted once, under the first tag.
    Storages are told apart by address, so record one forward at a time (what it saves lives until its backward;
    no tensor is kept alive by this object, so it does not change the memory it measures).
    ``inputs_of``: tags of modules run under ``torch.utils.checkpoint`` (non-reentrant): what they save goes
    through the checkpoint's own hooks and is not seen here, and the checkpoint saves their tensor inputs just
    before the module runs, outside its tag; those inputs are recorded under the module's tag.
    """

    def __init__(self, tags: Mapping[str, torch.nn.Module] = {}, exclude: Iterable[torch.Tensor] = (),
                 inputs_of: Iterable[str] = ()) -> None:
        self.tags = dict(tags)
        self.inputs_of = set(inputs_of)
        self.excluded = {storage_key(t) for t in exclude}
        self.records: dict[int, tuple[str, int]] = {}   # storage -> (tag, bytes)
        self.stack: list[str] = []
        self.handles: list[Any] = []
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.record(t, self.stack[-1] if self.stack else "other")
        return t

    def record(self, t: torch.Tensor, tag: str) -> None:
        k = storage_key(t)
        if k in self.records and self.records[k][0] == "other" and tag in self.inputs_of:
            self.records[k] = (tag, self.records[k][1])     # a checkpointed module's input (see inputs_of)
            return
        if k in self.excluded or k in self.records or _nbytes(t) == 0:
            return
        self.records[k] = (tag, _nbytes(t))

    def add_inputs(self, tag: str, *tensors: torch.Tensor) -> None:
        """Record ``tensors`` (a checkpointed block's inputs, which the checkpoint keeps) under ``tag``."""
        for t in tensors:
            self.record(t, tag)

    def exclude(self, keys: Iterable[int]) -> None:
        """Drop the storages ``keys`` (:func:`storage_key`) from what was recorded, and leave them out from now on."""
        for k in keys:
            self.excluded.add(k)
            self.records.pop(k, None)

    @property
    def by_tag(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for tag, n in self.records.values():
            out[tag] = out.get(tag, 0) + n
        return out

    @property
    def total(self) -> int:
        return sum(n for _, n in self.records.values())

    def _enter_hook(self, tag: str):
        def hook(module: torch.nn.Module, args: Any) -> None:
            self.stack.append(tag)
            if tag in self.inputs_of and torch.is_grad_enabled():
                self.add_inputs(tag, *(a for a in args if isinstance(a, torch.Tensor)))
        return hook

    def _exit_hook(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        self.stack.pop()

    def __enter__(self) -> "SavedBytes":
        for tag, mod in self.tags.items():
            self.handles.append(mod.register_forward_pre_hook(self._enter_hook(tag)))
            self.handles.append(mod.register_forward_hook(self._exit_hook))
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.hooks.__exit__(*exc)
        for h in self.handles:
            h.remove()
        self.handles.clear()


class LiveBytes(TorchDispatchMode):
    """Live tensor bytes on this thread's operators, by storage lifetime; ``peak`` since the last
    :meth:`reset_peak`. ``existing``: tensors made before (their storages count as live until they die).

    ``current``/``peak`` cover every storage seen; ``categories[name]`` = [current, peak] of the storages
    allocated inside ``with live.category(name)`` (the innermost category wins).
    """

    def __init__(self, existing: Iterable[Optional[torch.Tensor]] = ()) -> None:
        super().__init__()
        self.current = self.peak = 0
        self.live: dict[int, tuple[int, Optional[str]]] = {}   # storage -> (bytes, category)
        self.categories: dict[str, list[int]] = {}
        self.active: list[str] = []
        self.track(existing)

    def track(self, tensors: Iterable[Optional[torch.Tensor]]) -> None:
        """Count ``tensors``' storages as live (until they are freed), if not already."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._register(t)

    def _register(self, t: torch.Tensor) -> None:
        if t.device.type == "meta":
            return
        s = t.untyped_storage()
        k, n = s._cdata, s.nbytes()
        if k in self.live or n == 0:
            return
        cat = self.active[-1] if self.active else None
        self.live[k] = (n, cat)
        self.current += n
        self.peak = max(self.peak, self.current)
        if cat is not None:
            c = self.categories.setdefault(cat, [0, 0])
            c[0] += n
            c[1] = max(c[1], c[0])
        weakref.finalize(s, self._free, k)

    def _free(self, k: int) -> None:
        n, cat = self.live.pop(k, (0, None))
        self.current -= n
        if cat is not None:
            self.categories[cat][0] -= n

    def reset_peak(self) -> None:
        """Start a new peak from the bytes live now (categories too)."""
        self.peak = self.current
        for c in self.categories.values():
            c[1] = c[0]

    @contextmanager
    def category(self, name: str) -> Iterator[None]:
        """Attribute the storages allocated inside to ``name``."""
        self.active.append(name)
        try:
            yield
        finally:
            self.active.pop()

    def category_peak(self, name: str) -> int:
        return self.categories.get(name, [0, 0])[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._register(t)
        return out


@contextmanager
def watch_weight_source(runtime: Any, live: Optional[LiveBytes] = None, name: str = "gathered",
                        kept: Optional[list] = None) -> Iterator[None]:
    """Inside: what the runtime's weight source (``runtime.weights``, :mod:`axgrid.tensor_parallel.overlap`) allocates
    -- the gathered blocks, and with OAG the prefetched one -- is counted in ``live``'s category ``name``; what it gives
    layers to save for backward (the shard, or with ``keep_gathered_weights`` the gathered block: a weight
    buffer, not an activation) is appended to ``kept`` as weak references to the storages (see
    :func:`live_keys`, e.g. for :meth:`SavedBytes.exclude`)."""
    src = runtime.weights
    plain = {m: getattr(src, m) for m in ("forward", "backward")}

    def wrap(method: str, fn):
        def inner(*a, **k):
            with live.category(name) if live is not None else nullcontext():
                out = fn(*a, **k)
            if kept is not None and method == "forward":
                kept.append(weakref.ref(out[1].untyped_storage()))
            return out
        return inner

    for m, fn in plain.items():
        setattr(src, m, wrap(m, fn))     # instance attributes over the class's methods, removed on the way out
    try:
        yield
    finally:
        for m in plain:
            delattr(src, m)


@contextmanager
def watch_bucket_allocations(buckets: Any, live: LiveBytes, name: str = "buckets") -> Iterator[None]:
    """Inside: what the data-parallel buckets (a :class:`axgrid.data_parallel.buckets.GradBuckets`, or None: nothing to
    watch) allocate in the backward while gradients arrive and are reduced -- zero=2's full buckets, a backend's
    copies -- is counted in ``live``'s category ``name`` (through :meth:`GradBuckets.observed`)."""
    if buckets is None:
        yield
        return
    with buckets.observed(lambda: live.category(name)):
        yield


__all__ = ["storage_key", "storage_bytes", "live_keys", "optimizer_tensors", "SavedBytes", "LiveBytes",
           "watch_weight_source", "watch_bucket_allocations", "BudgetExceeded", "BudgetedLiveBytes"]


class BudgetExceeded(RuntimeError):
    """A rank's live tensor bytes would pass its budget."""


class BudgetedLiveBytes(LiveBytes):
    """:class:`LiveBytes` that raises :class:`BudgetExceeded` at the allocation that takes the live bytes past
    ``budget`` (bytes; 0: none)."""

    def __init__(self, existing: Iterable[Optional[torch.Tensor]], budget: int) -> None:
        self.budget = budget
        super().__init__(existing)

    def _register(self, t: torch.Tensor) -> None:
        super()._register(t)
        if self.budget and self.current > self.budget:
            raise BudgetExceeded(f"{self.current / 2**20:.1f} MiB of live tensors pass the budget of "
                                 f"{self.budget / 2**20:.1f} MiB per rank (tensor {tuple(t.shape)})")
