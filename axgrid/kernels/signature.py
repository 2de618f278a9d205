"""GEMM signatures: what a tuned decision is keyed by.

A signature describes one product ``C[m, n] = A[m, k] @ B[k, n]`` as it occurs in a
tensor-parallel FC layer: its sizes, element type, device type, device model (a GPU's name: two GPU models
sharing a cache file keep their own entries instead of re-tuning each other's) and *role*. The role fixes
the memory layout in which the caller hands over the operands (see ``ROLE_INPUT_LAYOUTS``),
which is what makes one operand layout cheaper than another.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

ROLES: tuple[str, ...] = ("forward", "input_grad", "weight_grad")

# Layout in which the FC layer passes (A, B) for each role: "N" = row-major [rows, cols],
# "T" = a transposed view of a row-major tensor (e.g. ``W.t()``).
#   forward:     Y  = X[m',k]  @ W_blk.t()      -> A "N", B "T"
#   input_grad:  dX = dY[m',n] @ W_blk[n,k]     -> A "N", B "N"
#   weight_grad: dW = dY.t()   @ X[m',k]        -> A "T", B "N"
ROLE_INPUT_LAYOUTS: dict[str, tuple[str, str]] = {
    "forward": ("N", "T"),
    "input_grad": ("N", "N"),
    "weight_grad": ("T", "N"),
}

_DTYPE_ALIASES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp64": torch.float64, "float64": torch.float64, "double": torch.float64,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Return the torch dtype for ``dtype`` ("bf16", "fp32", torch.float16, ...)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPE_ALIASES.values():
            raise ValueError(f"unsupported GEMM dtype {dtype}; use one of float32, float16, bfloat16, float64")
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPE_ALIASES)}")
    return _DTYPE_ALIASES[key]


def dtype_name(dtype: str | torch.dtype) -> str:
    """Canonical short name of a dtype: 'float32', 'bfloat16', ..."""
    return str(parse_dtype(dtype)).removeprefix("torch.")


def device_type(device: str | torch.device) -> str:
    """Device type used in keys: 'cpu', 'cuda' (ROCm builds also report 'cuda')."""
    return torch.device(device).type


@functools.lru_cache(maxsize=None)
def device_model(device: str) -> str:
    """The model of a GPU ``device`` ("cuda", "cuda:1") as the driver names it; "" for a CPU (its model and threads
    are in the entries' validators) or a GPU this process cannot see. Cached: it is asked on every GEMM call."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return ""
    from axgrid.device import cuda, of
    if cuda.count() == 0:
        return ""
    return of(dev).name()


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown GEMM role {role!r}; use one of {ROLES}")
    return role


@dataclass(frozen=True)
class GemmSignature:
    """One GEMM C[m, n] = A[m, k] @ B[k, n] of a given dtype, device type and role."""

    m: int
    n: int
    k: int
    dtype: str  # canonical name, e.g. "bfloat16"
    device: str  # device type, e.g. "cuda"
    role: str
    model: str = ""  # the GPU model, e.g. "NVIDIA H100 80GB HBM3" ("" on a CPU)

    @classmethod
    def make(cls, m: int, n: int, k: int, dtype: str | torch.dtype,
             device: str | torch.device, role: str, model: str | None = None) -> "GemmSignature":
        """Build a signature, normalising dtype/device and validating sizes and role. ``model``: the GPU's name
        (None: asked of the device, :func:`device_model`)."""
        for name, v in (("m", m), ("n", n), ("k", k)):
            if int(v) != v or v < 1:
                raise ValueError(f"GEMM size {name}={v!r} must be a positive integer")
        model = device_model(str(torch.device(device))) if model is None else model
        return cls(int(m), int(n), int(k), dtype_name(dtype), device_type(device), check_role(role), model)

    @classmethod
    def of(cls, a: torch.Tensor, b: torch.Tensor, role: str) -> "GemmSignature":
        """Signature of ``a @ b`` for 2-D tensors a [m, k], b [k, n]."""
        check_operands(a, b)
        return cls.make(a.shape[0], b.shape[1], a.shape[1], a.dtype, a.device, role)

    @property
    def key(self) -> str:
        """Stable string key used in the cache file."""
        where = f"{self.device}[{self.model}]" if self.model else self.device
        return f"{where}|{self.dtype}|{self.role}|m={self.m},n={self.n},k={self.k}"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)


def check_operands(a: torch.Tensor, b: torch.Tensor) -> None:
    """Raise a clear error unless a [m, k] and b [k, n] are 2-D, conformable, same dtype/device."""
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"GemmTuner takes 2-D operands, got a{tuple(a.shape)} and b{tuple(b.shape)}; "
                         "flatten leading dims first (x.reshape(-1, x.shape[-1]))")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner sizes differ: a{tuple(a.shape)} @ b{tuple(b.shape)}")
    if a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"operands differ in dtype/device: {a.dtype}@{a.device} vs {b.dtype}@{b.device}")


def layout_of(t: torch.Tensor) -> str:
    """'N' if ``t`` is row-major contiguous, 'T' if it is a transposed view of a row-major tensor, else '?'."""
    if t.is_contiguous():
        return "N"
    if t.t().is_contiguous():
        return "T"
    return "?"
