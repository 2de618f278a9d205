"""Run axgrid as on GPUs, on a machine without any: one rank of a grid of any size, its tensors fake (shapes, dtypes
and devices, no storage) on a GPU device, its collectives on torch's fake process group. What a GPU run would hit
shows here: a tensor left on the host, an unintended ``.item()``/``.cpu()`` in the hot path, a device mismatch.

    with dry_run("2x2x2x1", rank=5) as run:            # the grid of rank 5 of 8, on a fake cuda:0
        model = axgrid.parallelize(build_on_cpu(), run.grid)
        with run.watch():                              # the hot path: host traffic is recorded
            logits = model(ids)
    assert not run.host.violations

What torch 2.13's CPU build allows, and so what the two devices of :func:`dry_run` are for:

- ``device="cuda"``: fake tensors on ``cuda:0``. Out-of-place computation works, and a mix of host and device
  tensors raises "Expected all tensors to be on the same device" as on a GPU. In-place ops (``copy_``, ``add_``),
  autograd history (a forward with parameters that require gradients) and random initialisers need a CUDA device
  guard, which a CPU build lacks (it raises, or aborts the process). :func:`cuda_guard` registers one for the
  process: torch's Python device guard (``torch._C._acc``, made for PrivateUse1 backends) answering for CUDA, put
  in c10's guard registry (``c10::impl::device_guard_impl_registry``, an exported symbol) through ctypes. Then the
  forward of a training step runs as on a GPU. A backward still cannot: the autograd engine also needs torch's
  accelerator to be CUDA, which only a CUDA build sets.
- ``device="fakegpu"``: the same fake tensors on torch's PrivateUse1 device, registered under the name "fakegpu"
  with a Python device guard (:func:`accelerator`). Autograd works on it -- backward, optimizer steps -- and
  autocast is emulated for the GEMMs (mm, addmm, bmm, baddbmm, matmul, linear and scaled_dot_product_attention run
  in the autocast dtype, as CUDA's autocast lists them), and attention runs CUDA's flash kernel where CUDA would
  (:func:`_fused_attention`), so that a step holds the memory a GPU's does. The backward of a training step runs
  here. Registering PrivateUse1 cannot be undone and makes it torch's accelerator: after it, a CUDA backward fails
  in this process, so the two devices are used in different processes (:func:`axgrid.testing.isolated.run_isolated`
  in tests; a process per ``python -m axgrid.dryrun``).

Pieces, for tests and for a dry run of a full-size job:

- :class:`FakeGpuDevice`: the :class:`axgrid.device.Device` of a GPU that is not there (events on the host clock,
  counted synchronisations: a timed step must not synchronise).
- :func:`fake_world`: torch's fake process group (``FakeStore``) as rank ``rank`` of ``world_size``; collectives
  return at once and move nothing.
- :class:`HostWatch`: a dispatch mode that records host traffic: a device tensor's value read on the host
  (``item``, ``float()``, ``tolist``) and a copy from the device to the host, unless through
  :func:`axgrid.device.host_read` (the library's intended reads; fake values read 0), and host computation on
  tensors of more than ``HOST_ELEMENTS`` elements (views of host tensors and bare allocations excepted:
  parallelizing a model built on the CPU reads slices of its weights).
- :func:`dry_run`: all of them around ``axgrid.init``. Optimizer state must live on the device, as a GPU
  training loop keeps it anyway (``AdamW(capturable=True)`` or ``fused=True``): a host-side step counter has no
  value in a dry run.
"""
from __future__ import annotations

import contextlib
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ..device.base import Device, Event, HostEvent
from ..metrics.energy import Energy

#: The name torch's PrivateUse1 device is registered under (:func:`accelerator`).
FAKE_ACCELERATOR = "fakegpu"
#: Host tensors larger than this, computed inside a watched region, are reported.
HOST_ELEMENTS = 64

aten = torch.ops.aten
#: Ops that only allocate (no computation, no pages touched): not host compute.
_ALLOCATIONS = (aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default)


# ----------------------------------------------------------------------------------------------- the device

class FakeGpuDevice(Device):
    """The device of a rank whose GPU is not there (``torch.device("cuda", i)`` or ``("fakegpu", i)``): answers
    without touching torch.cuda, and counts what a timed step must not do (``synchronizations``) and the events it
    makes (``events``: host-clock events, :class:`~axgrid.device.HostEvent`; each is recorded by its maker at once)."""

    is_gpu = True
    memory_source = "none (a fake GPU holds no memory)"

    def __init__(self, device: torch.device | str = "cuda:0") -> None:
        device = torch.device(device)
        super().__init__(device if device.index is not None else torch.device(device.type, 0))
        self.kind = self.torch.type
        self.synchronizations = 0
        self.events = 0

    def name(self) -> str:
        return f"fake GPU ({self.torch}, no hardware)"

    def energy_key(self) -> str:
        return f"{socket.gethostname()}/fake-{self.torch}"

    def energy(self) -> Energy:
        return Energy(None, "none: a fake GPU (dry run)")

    def synchronize(self) -> None:
        self.synchronizations += 1

    def event(self) -> Event:
        self.events += 1
        return HostEvent()

    def peak_memory(self) -> int:
        return 0


# ----------------------------------------------------------------------------------------------- fakegpu: autograd

_LOWER_PRECISION = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "scaled_dot_product_attention")
#: ops that CUDA (and the CPU) run as one kernel but a device without a kernel of its own decomposes into several
#: (their ``CompositeImplicitAutograd`` form), each result a temporary a GPU never holds: SiLU's backward (SwiGLU's
#: gate) makes four ``[m', f/Gy]`` tensors that way. A kernel registered for the fakegpu device keeps them whole;
#: fake tensors answer before it is reached (their meta kernels give the one output).
_FUSED = ("silu_backward",)
_REGISTRATION: list = []          # the process's registration (PrivateUse1 cannot be registered twice)
_CUDA_GUARD: list = []            # the guard object c10's registry points at (kept alive)


def cuda_guard() -> torch.device:
    """Give this process a CUDA device guard (see the module docstring; once, irreversibly), so that fake CUDA
    tensors take in-place ops and autograd history. Returns ``torch.device("cuda", 0)``."""
    if not _CUDA_GUARD:
        import ctypes
        import os

        class _Guard(torch._C._acc.DeviceGuard):
            def type_(self):
                return torch._C._autograd.DeviceType.CUDA

        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        registry = (ctypes.c_void_p * 64).in_dll(lib, "_ZN3c104impl26device_guard_impl_registryE")
        cuda, pu1 = 1, 20                                   # c10::DeviceType::CUDA, PrivateUse1
        if registry[cuda]:
            raise RuntimeError("this torch has a CUDA device guard already (a CUDA build): use the real GPU")
        held = registry[pu1]
        guard = _Guard()
        torch._C._acc.register_python_privateuseone_device_guard(guard)    # lands in the PrivateUse1 slot...
        registry[cuda], registry[pu1] = registry[pu1], held                # ... and moves to CUDA's
        _CUDA_GUARD.append(guard)
    return torch.device("cuda", 0)


def accelerator() -> torch.device:
    """Register torch's PrivateUse1 device as "fakegpu" in this process (once; it cannot be undone), with a Python
    device guard so autograd runs on it, and autocast emulated for the GEMMs. Returns ``torch.device("fakegpu",
    0)``."""
    if not _REGISTRATION:
        from torch.utils.backend_registration import _DummyBackendModule, _setup_privateuseone_for_python_backend

        class _Module(_DummyBackendModule):
            def get_amp_supported_dtype(self) -> list[torch.dtype]:
                return [torch.bfloat16, torch.float16]

        _setup_privateuseone_for_python_backend(rename=FAKE_ACCELERATOR, backend_module=_Module())
        everything = torch.library.Library("_", "IMPL")                 # autocast: pass through by default...
        everything.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
        gemms = torch.library.Library("aten", "IMPL")                    # ... GEMMs in the autocast dtype
        for name in _LOWER_PRECISION:
            for overload in getattr(aten, name).overloads():
                op = getattr(getattr(aten, name), overload)
                gemms.impl(op, _autocast_to_lower(op), "AutocastPrivateUse1")
        attention = torch.library.Library("aten", "IMPL")                # fused attention, as CUDA picks it
        attention.impl("scaled_dot_product_attention", _fused_attention, "AutogradPrivateUse1")
        fused = torch.library.Library("aten", "IMPL")                    # one kernel, as on a GPU
        for name in _FUSED:
            fused.impl(name, _unreachable(name), "PrivateUse1")
        _REGISTRATION.extend([everything, gemms, attention, fused])
    return torch.device(FAKE_ACCELERATOR, 0)


def _unreachable(name: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"aten::{name} on the fakegpu device with real tensors: the device holds only fake ones")
    return kernel


def _fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                     dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                     enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` on the fakegpu device as on a GPU: CUDA's flash kernel where it takes the
    inputs (no mask, no dropout; grouped-query attention's fewer k, v heads included, as CUDA's and the CPU's flash
    kernels take them), saving for backward what it saves there (its output and the fp32 log-sum-exp ``[b, H, S]``;
    q, k, v as given), else the math path. Without this the device would run torch's math
    decomposition (a PrivateUse1 backend gets no fused kernel), which saves the ``[b, H, S, S]`` probabilities a
    GPU never holds. Registered on the device's autograd key, over the composite; the fused ops' own derivatives
    and fake-tensor kernels do the rest."""
    if attn_mask is None and dropout_p == 0.0:          # grouped-query too: the flash kernel takes fewer k, v heads
        return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, False, scale=scale)[0]
    return aten._scaled_dot_product_attention_math(q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale,
                                                   enable_gqa=enable_gqa)[0]


#: the attention implementation a Hugging Face model runs with on fake tensors (:func:`hf_attention`)
HF_ATTENTION = "axgrid_fake_sdpa"


def hf_attention() -> str:
    """Register and return :data:`HF_ATTENTION`: transformers' own ``sdpa`` attention under a name transformers'
    mask functions do not know, so that it builds no mask and attention runs causal (``is_causal``, no mask: the
    flash kernel), as it does on real tensors for a batch without padding or packing. On fake tensors transformers
    cannot read the position ids to rule out packed sequences, so with ``"sdpa"`` it builds a ``[b, 1, S, S]``
    mask: torch's math attention, the probabilities ``[b, H, S, S]`` saved, which a GPU run never holds. Only for
    training steps without an ``attention_mask`` (a dry run's)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    AttentionInterface.register(HF_ATTENTION, sdpa_attention_forward)
    return HF_ATTENTION


def _autocast_to_lower(op) -> Callable[..., Any]:
    excluded = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        dt = torch.get_autocast_dtype(FAKE_ACCELERATOR)

        def cast(a: Any) -> Any:
            return a.to(dt) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return op(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})
    return kernel


# ----------------------------------------------------------------------------------------------- host traffic

@dataclass
class Violation:
    """One piece of host traffic in a watched region: what, the op, and where in axgrid it came from."""

    what: str          # "host read" | "copy to host" | "host compute"
    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.what}: {self.op} at {self.where}"


def _origin() -> str:
    """The innermost frame of axgrid (or of the caller) that led here, as ``file:line in function``."""
    frame = sys._getframe(2)
    fallback = None
    while frame is not None:
        f = frame.f_code.co_filename
        if "torch/" not in f and "axgrid/dryrun/harness" not in f:
            here = f"{f.split('axgrid/')[-1] if 'axgrid/' in f else f}:{frame.f_lineno} in {frame.f_code.co_name}"
            if "/axgrid/" in f:
                return here
            fallback = fallback or here
        frame = frame.f_back
    return fallback or "?"


def _intended() -> bool:
    """Whether the host read under way goes through :func:`axgrid.device.host_read`."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "host_read" and frame.f_code.co_filename.endswith("device/base.py"):
            return True
        frame = frame.f_back
    return False


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


class HostWatch(TorchDispatchMode):
    """Records host traffic of the ops dispatched while active (see the module docstring); ``violations`` lists
    it. A fake tensor read on the host answers 0 (False, 0.0), so a watched run goes on to its end and reports
    every violation, not only the first."""

    def __init__(self, host_elements: int = HOST_ELEMENTS) -> None:
        super().__init__()
        self.host_elements = host_elements
        self.violations: list[Violation] = []
        self.intended_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors((args, kwargs))
        on_device = any(t.device.type not in ("cpu", "meta") for t in inputs)
        if func is aten._local_scalar_dense.default:
            if on_device:
                self._note("host read", func)
            elif _is_fake(inputs[0]) and _intended():
                self.intended_reads += 1
            else:       # a host-side scalar: no traffic; a fake one has no value (FakeTensorMode says so)
                return func(*args, **kwargs)
            return _placeholder(inputs[0]) if _is_fake(inputs[0]) else func(*args, **kwargs)
        out = func(*args, **kwargs)
        outputs = _tensors(out)
        if on_device and any(t.device.type == "cpu" for t in outputs):
            self._note("copy to host", func)
        elif func is aten.copy_.default and args[0].device.type == "cpu" and args[1].device.type not in ("cpu",
                                                                                                         "meta"):
            self._note("copy to host", func)
        elif (not on_device and not func.is_view and func not in _ALLOCATIONS
              and any(t.device.type == "cpu" and t.numel() > self.host_elements for t in outputs)):
            self.violations.append(Violation("host compute", str(func), _origin()))
        return out

    def _note(self, what: str, func) -> None:
        """A value or copy leaving the device: counted when :func:`axgrid.device.host_read` asked for it, else a
        violation."""
        if _intended():
            self.intended_reads += 1
        else:
            self.violations.append(Violation(what, str(func), _origin()))

    def report(self) -> str:
        return "\n".join(str(v) for v in self.violations) or "no host traffic"


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor)


def _placeholder(t: torch.Tensor) -> Any:
    if t.dtype == torch.bool:
        return False
    return 0.0 if t.is_floating_point() else 0


# ----------------------------------------------------------------------------------------------- world and grid

@contextlib.contextmanager
def fake_world(world_size: int, rank: int) -> Iterator[None]:
    """torch's fake process group as rank ``rank`` of ``world_size`` (destroyed at the end)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@dataclass
class DryRun:
    """What :func:`dry_run` yields: the grid, its fake device, the fake tensor mode and the host watch."""

    grid: Any
    device: FakeGpuDevice
    mode: Any
    host: HostWatch = field(default_factory=HostWatch)

    @contextlib.contextmanager
    def watch(self) -> Iterator[HostWatch]:
        """Record host traffic inside the block (the hot path under test)."""
        with self.host:
            yield self.host

    @contextlib.contextmanager
    def autocast(self, dtype: torch.dtype = torch.bfloat16) -> Iterator[None]:
        """``torch.autocast`` on the grid's device. On ``cuda`` a CPU build's ``torch.autocast("cuda")`` switches
        itself off (no CUDA available): the CUDA autocast state is set directly instead, and the CUDA autocast
        kernels torch ships in every build do the casting, as on a GPU."""
        kind = self.grid.device.type
        if kind != "cuda":
            with torch.autocast(kind, dtype=dtype):
                yield
            return
        before = (torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
        torch.set_autocast_enabled(kind, True)
        torch.set_autocast_dtype(kind, dtype)
        try:
            yield
        finally:
            torch.set_autocast_enabled(kind, before[0])
            torch.set_autocast_dtype(kind, before[1])
            torch.clear_autocast_cache()


@contextlib.contextmanager
def dry_run(grid: str, rank: int = 0, device: str = "cuda", config: Any = None, cp: int = 1,
            ep: int = 1) -> Iterator[DryRun]:
    """Rank ``rank`` of ``grid`` (e.g. "2x2x2x1") on a fake GPU: a fake world, ``FakeTensorMode`` (real tensors
    from outside, such as a model built on the CPU, are taken in as fake ones), ``axgrid.init`` with a
    :class:`FakeGpuDevice`. ``device``: "cuda" (forward only) or "fakegpu" (autograd too; see the module
    docstring). ``cp``, ``ep``: the context- and expert-parallel sizes (``axgrid.init``'s). The grid is destroyed at the end."""
    import axgrid
    from axgrid.spec.layout import GridShape
    from torch._subclasses.fake_tensor import FakeTensorMode
    world = GridShape.parse(grid).size
    torch_device = accelerator() if device == FAKE_ACCELERATOR else cuda_guard()
    dev = FakeGpuDevice(torch_device)
    with fake_world(world, rank):
        g = axgrid.init(grid, config=config or axgrid.RuntimeConfig(timeout_s=60, seed=0), device=dev, cp=cp, ep=ep)
        try:
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                yield DryRun(g, dev, mode)
        finally:
            g.destroy()


__all__ = ["FAKE_ACCELERATOR", "HF_ATTENTION", "HOST_ELEMENTS", "DryRun", "FakeGpuDevice", "HostWatch",
           "Violation", "accelerator", "cuda_guard", "dry_run", "fake_world", "hf_attention"]
