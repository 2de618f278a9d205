"""Configuration objects of the runtime. Behaviour is switched here, never by module-level flags."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .spec import DEFAULT_BUCKET_BYTES

#: ``gemm(a, b, role) -> a @ b`` for 2-D tensors; ``role`` is "forward", "input_grad" or "weight_grad".
GemmFn = Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]


@dataclass(frozen=True)
class OverlapConfig:
    """Which collectives run asynchronously under compute. Results are identical with any combination.

    - ``oar``: in backward, the input-gradient all-reduce runs under the weight-gradient GEMM.
    - ``ors``: the weight-gradient reduce-scatter over z runs under the backward of earlier layers.
    - ``oag``: the next layer's weight all-gather over z is prefetched in forward execution order.
    - ``odp``: the data-parallel all-reduce over d is bucketed and runs under the backward.
    - ``keep_gathered_weights``: keep the forward's gathered weights for backward (one all-gather fewer,
      more memory).
    """

    oar: bool = False
    ors: bool = False
    oag: bool = False
    odp: bool = False
    keep_gathered_weights: bool = False

    @staticmethod
    def parse(spec: str) -> "OverlapConfig":
        """``"oar,ors"`` / ``"all"`` / ``"none"`` -> OverlapConfig."""
        names = {"oar", "ors", "oag", "odp"}
        spec = spec.strip().lower()
        if spec in ("", "none", "off"):
            return OverlapConfig()
        chosen = {s.strip() for s in spec.split(",") if s.strip()}
        if "all" in chosen:
            chosen = (chosen - {"all"}) | names
        unknown = chosen - names - {"keep"}
        if unknown:
            raise ValueError(f"unknown overlap switch(es) {sorted(unknown)}; choose from oar, ors, oag, odp, keep, "
                             f"all, none")
        return OverlapConfig(**{n: n in chosen for n in names}, keep_gathered_weights="keep" in chosen)


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything that changes how the runtime behaves; the grid's :class:`~axgrid.runtime.Runtime` holds it
    (``grid.runtime.config``).

    ``timeout_s``: limit for every collective and for the start-up rendezvous (a lost or hung rank ends the
    job with an error, not a hang): 120 s by default; raise it when one rank may legitimately keep the others
    waiting longer (a slow checkpoint write, a long first compilation, thousands of ranks starting).
    ``reduce_in_fp32``: sum bf16/fp16 tensors in fp32 (None: True on gloo, which otherwise sums in bf16,
    False on NCCL/RCCL). ``gemm``: the GEMM used by parallel layers (e.g. a ``kernels.GemmTuner``);
    None means ``torch.matmul``. ``record_timing``: time every collective in the ledger (synchronises
    the device on GPU). ``trace``: keep a per-rank timeline of compute and collectives.
    ``bucket_bytes``: size of the data-parallel gradient buckets.
    ``zero``: what the data-parallel ranks share out (the ZeRO stages of DeepSpeed): 0 -- every d-rank keeps the
    whole optimizer state and all-reduces the gradients; 1 -- the gradients are reduce-scattered over d, each
    d-rank keeps and steps the optimizer state of its 1/Gd share of the buckets (:func:`axgrid.shard_optimizer`)
    and the updated parameters are all-gathered over d; 2 -- also only the 1/Gd share of the gradients is kept.
    Needs Gd > 1 (:func:`axgrid.init` refuses it otherwise). See :mod:`axgrid.grad_buckets`.
    ``gemm_tuning``: "off", "on-first-use" or "cache-only": run the layers' three GEMMs through a
    ``kernels.GemmTuner`` built by the runtime (``grid.runtime.gemm_fn``), whose decisions every rank of an
    x-y group shares (rank 0 of the group decides, so replicas never diverge). ``gemm_cache``: its cache file
    (None: $AXGRID_GEMM_CACHE or the user cache directory). An explicit ``gemm`` callable wins over both.
    """

    timeout_s: float = 120.0
    reduce_in_fp32: Optional[bool] = None
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    gemm: Optional[GemmFn] = None
    record_timing: bool = False
    trace: bool = False
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    seed: Optional[int] = None
    gemm_tuning: str = "off"
    gemm_cache: Optional[str] = None
    zero: int = 0

    def __post_init__(self) -> None:
        if self.zero not in (0, 1, 2) or isinstance(self.zero, bool):
            raise ValueError(f"zero={self.zero!r}: choose 0 (no sharding over d), 1 (optimizer state) or 2 "
                             f"(optimizer state and gradients)")
        if self.gemm_tuning not in ("off", "on-first-use", "cache-only"):
            raise ValueError(f"gemm_tuning={self.gemm_tuning!r}: choose 'off', 'on-first-use' or 'cache-only'")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s={self.timeout_s!r} must be a finite number of seconds > 0, e.g. 120")
