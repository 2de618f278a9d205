"""The ways to compute one GEMM C[m, n] = A[m, k] @ B[k, n].

A candidate fixes
  * the operand layouts "XY" (X for A, Y for B): "N" = row-major contiguous copy of the operand,
    "T" = the operand's transpose materialised contiguously and used through ``.t()``.
    A copy is only made when the incoming tensor is not already in that layout, and its cost
    is part of what is timed;
  * the order: "AB" computes A @ B, "BtAt" computes (Bᵀ @ Aᵀ)ᵀ;
  * the backend: torch's matmul or, on CUDA with cupy installed, cupy's cuBLAS path via DLPack.

Every candidate returns a row-major contiguous [m, n] tensor, like ``torch.matmul`` does, so
the choice never changes what the caller sees beyond floating-point reassociation.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from axgrid.device import cuda as gpu, of

from .signature import ROLE_INPUT_LAYOUTS, GemmSignature

LAYOUTS: tuple[str, ...] = ("NN", "NT", "TN", "TT")
ORDERS: tuple[str, ...] = ("AB", "BtAt")
DEFAULT = "default"


@dataclass(frozen=True)
class Candidate:
    """One way of computing a GEMM; ``name`` is what the cache stores."""

    backend: str  # "torch" | "cupy" | "default"
    layout: str = "NN"
    order: str = "AB"

    @property
    def name(self) -> str:
        if self.backend == DEFAULT:
            return DEFAULT
        return f"{self.backend}:{self.layout}:{self.order}"

    @classmethod
    def parse(cls, name: str) -> "Candidate":
        """Inverse of ``name``; raises ValueError naming the bad string."""
        if name == DEFAULT:
            return cls(DEFAULT)
        parts = name.split(":")
        if len(parts) != 3 or parts[0] not in ("torch", "cupy") or parts[1] not in LAYOUTS or parts[2] not in ORDERS:
            raise ValueError(f"bad GEMM candidate name {name!r}; expected 'default' or "
                             f"'<torch|cupy>:<{'|'.join(LAYOUTS)}>:<{'|'.join(ORDERS)}>'")
        return cls(parts[0], parts[1], parts[2])


@functools.lru_cache(maxsize=None)
def cupy_version() -> str | None:
    """cupy's version string, or None when cupy cannot be imported."""
    try:
        import cupy  # noqa: PLC0415  (optional dependency)
    except Exception:  # ImportError, or a broken CUDA install raising at import
        return None
    return str(cupy.__version__)


def cupy_usable(sig: GemmSignature) -> bool:
    """True when cupy candidates apply: cupy importable, a CUDA device present, dtype cupy supports."""
    if sig.device != "cuda" or sig.dtype == "bfloat16":  # cupy has no bfloat16 dtype
        return False
    return cupy_version() is not None and gpu.available()


def candidates_for(sig: GemmSignature, distinct: bool = True) -> list[Candidate]:
    """Candidates for ``sig``, the default (plain torch.matmul) first.

    With ``distinct``, the torch candidate that is the default's own computation for the role's usual
    operand layouts (no copy, order A·B) is left out: timing it against the default only adds noise.
    """
    backends = ["torch"] + (["cupy"] if cupy_usable(sig) else [])
    same_as_default = Candidate("torch", "".join(ROLE_INPUT_LAYOUTS[sig.role]), "AB")
    return [Candidate(DEFAULT)] + [c for c in (Candidate(be, lay, order)
                                               for be in backends for lay in LAYOUTS for order in ORDERS)
                                   if not (distinct and c == same_as_default)]


def _as_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x [r, c] as row-major ("N") or as the .t() of a row-major [c, r] tensor ("T"); copies only if needed."""
    return x.contiguous() if layout == "N" else x.t().contiguous().t()


def _torch_mm(a: torch.Tensor, b: torch.Tensor, order: str) -> torch.Tensor:
    if order == "AB":
        return torch.matmul(a, b)
    return torch.matmul(b.t(), a.t()).t().contiguous()  # [n, m] -> row-major [m, n]


def _cupy_mm(a: torch.Tensor, b: torch.Tensor, order: str) -> torch.Tensor:
    import cupy  # noqa: PLC0415  (only reached when cupy_usable)

    stream = of(a.device).current_stream()
    with cupy.cuda.Device(a.device.index), cupy.cuda.ExternalStream(stream.cuda_stream):
        ca, cb = cupy.from_dlpack(a), cupy.from_dlpack(b)
        cc = cupy.matmul(ca, cb) if order == "AB" else cupy.matmul(cb.T, ca.T).T
        cc = cupy.ascontiguousarray(cc)
    return torch.from_dlpack(cc)


def run(cand: Candidate, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Compute a [m, k] @ b [k, n] with candidate ``cand``; returns a contiguous [m, n] tensor."""
    if cand.backend == DEFAULT:
        return torch.matmul(a, b)
    a2, b2 = _as_layout(a, cand.layout[0]), _as_layout(b, cand.layout[1])
    if cand.backend == "cupy":
        return _cupy_mm(a2, b2, cand.order)
    return _torch_mm(a2, b2, cand.order)
