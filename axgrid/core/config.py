"""Configuration objects of the runtime. Behaviour is switched here, never by module-level flags."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..spec import DEFAULT_BUCKET_BYTES, OverlapConfig

#: ``gemm(a, b, role) -> a @ b`` for 2-D tensors; ``role`` is "forward", "input_grad" or "weight_grad".
GemmFn = Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything that changes how the runtime behaves; the grid's :class:`~axgrid.core.runtime.Runtime` holds it
    (``grid.runtime.config``).

    ``timeout_s``: limit for every collective and for the start-up rendezvous (a lost or hung rank ends the
    job with an error, not a hang): 600 s by default, NCCL's own default; raise it when one rank may legitimately
    keep the others waiting longer (a long first compilation, thousands of ranks starting).
    ``io_timeout_s``: the limit of the agreements of checkpoint saving and loading, where ranks wait while others
    write, fsync and hash whole files on a parallel file system (default 30 minutes).
    ``flight_records``: collectives the flight recorder keeps per rank (:mod:`axgrid.launch.flight`; 0: off); it dumps
    them when a collective fails or makes no progress for ``hang_s`` (None: 0.8 × ``timeout_s``, before the
    backend's own timeout ends the process) or when ``axgrid launch`` asks, to ``run_dir``/flight/JOB/ (None: the
    launcher's ``AXGRID_RUN_DIR``, else printed only).
    ``reduce_in_fp32``: sum bf16/fp16 tensors in fp32 (None: True on gloo, which otherwise sums in bf16,
    False on NCCL/RCCL).
    ``grad_reduce_dtype``: the dtype the FC layers' gradients are reduced in -- the weight gradients' reduce-scatter
    over z, the bias gradients' all-reduce over z and the data-parallel all-reduce over d. fp32 by default, as
    Megatron-LM (fp32 gradient accumulation and all-reduce under bf16) and torchtitan (FSDP ``reduce_dtype``
    float32) do: a sum over many ranks in bf16 loses the small gradients' low bits; with the usual fp32 parameters
    (autocast) it is their own dtype, so nothing is cast. ``torch.bfloat16`` halves those bytes at that cost;
    None: each parameter's own dtype. Under bf16 autocast the weights are gathered over z in bf16 (the GEMMs'
    dtype) whatever this says, and the activations' all-reduces carry what the GEMMs produce. See
    docs/gpu.md#precision. ``gemm``: the GEMM used by parallel layers (e.g. a ``kernels.GemmTuner``);
    None means ``torch.matmul``. ``record_timing``: time every collective in the ledger (synchronises
    the device on GPU). ``trace``: keep a per-rank timeline of compute and collectives.
    ``bucket_bytes``: size of the data-parallel gradient buckets.
    ``zero``: what the data-parallel ranks share out (the ZeRO stages of DeepSpeed): 0 -- every d-rank keeps the
    whole optimizer state and all-reduces the gradients; 1 -- the gradients are reduce-scattered over d, each
    d-rank keeps and steps the optimizer state of its 1/Gd share of the buckets (:func:`axgrid.shard_optimizer`)
    and the updated parameters are all-gathered over d; 2 -- also only the 1/Gd share of the gradients is kept.
    Needs Gd > 1 (:func:`axgrid.init` refuses it otherwise). See :mod:`axgrid.data_parallel.buckets`.
    ``gemm_tuning``: "off", "on-first-use" or "cache-only": run the layers' three GEMMs through a
    ``kernels.GemmTuner`` built by the runtime (``grid.runtime.gemm_fn``), whose decisions every rank of an
    x-y group shares (rank 0 of the group decides, so replicas never diverge). ``gemm_cache``: its cache file
    (None: $AXGRID_GEMM_CACHE or the user cache directory). An explicit ``gemm`` callable wins over both.
    """

    timeout_s: float = 600.0
    io_timeout_s: float = 1800.0
    reduce_in_fp32: Optional[bool] = None
    grad_reduce_dtype: Optional[torch.dtype] = torch.float32
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    gemm: Optional[GemmFn] = None
    record_timing: bool = False
    trace: bool = False
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    seed: Optional[int] = None
    gemm_tuning: str = "off"
    gemm_cache: Optional[str] = None
    flight_records: int = 32
    hang_s: Optional[float] = None
    run_dir: Optional[str] = None
    zero: int = 0

    def __post_init__(self) -> None:
        if self.zero not in (0, 1, 2) or isinstance(self.zero, bool):
            raise ValueError(f"zero={self.zero!r}: choose 0 (no sharding over d), 1 (optimizer state) or 2 "
                             f"(optimizer state and gradients)")
        if self.gemm_tuning not in ("off", "on-first-use", "cache-only"):
            raise ValueError(f"gemm_tuning={self.gemm_tuning!r}: choose 'off', 'on-first-use' or 'cache-only'")
        for name in ("timeout_s", "io_timeout_s") + (("hang_s",) if self.hang_s is not None else ()):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name}={v!r} must be a finite number of seconds > 0, e.g. 600")
        if self.grad_reduce_dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"grad_reduce_dtype={self.grad_reduce_dtype!r}: use torch.float32 (the default), "
                             f"torch.bfloat16, torch.float16 or None (each parameter's dtype)")
        if not (isinstance(self.flight_records, int) and self.flight_records >= 0):
            raise ValueError(f"flight_records={self.flight_records!r} must be an int >= 0 (0: no flight recorder)")

    def hang_seconds(self) -> float:
        """When the flight recorder dumps a collective that makes no progress (see the class docstring)."""
        return self.hang_s if self.hang_s is not None else 0.8 * self.timeout_s
