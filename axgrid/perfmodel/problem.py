"""Inputs of the model: the transformer, the run options, the data types.

The transformer is an ``axgrid.spec.TransformerShape`` of any family the runtime trains: axgrid's GPT (the named
sizes ``axgrid.spec.NAMED_SIZES``) or a Hugging Face decoder (``axgrid.spec.PUBLIC_MODELS``, or read from a
``config.json``). The time model, the collective replay and the parameter counts read the block through its
``block_layers``, ``block_modules`` and ``head_layer``; the norms, the attention (its width, key-value heads and
windows), the MLP's gate and the FLOPs through the shape's properties (``norm_kind``, ``attention_width``,
``attended_keys``, ``gated_mlp``, ``flops_per_iteration``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from axgrid.spec import DEFAULT_BUCKET_BYTES, FCLayer, TransformerShape

from .errors import PerfModelError

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}


def transformer_layers(spec: TransformerShape, head: bool = True) -> list[FCLayer]:
    """All FC layers of the model in forward order: layers × block layers, then the head (when ``head``)."""
    return spec.block_layers() * spec.layers + ([spec.head_layer()] if head else [])


def get_model(name: str) -> TransformerShape:
    """Look up a named model (``axgrid.spec.NAMED_SIZES``); an unknown name raises with the list of known ones."""
    try:
        return TransformerShape.named(name)
    except ValueError as e:
        raise PerfModelError(str(e)) from None


@dataclass(frozen=True)
class Options:
    """Run options.

    overlap_ar / overlap_rs / overlap_ag / overlap_dp: the runtime's OAR, ORS, OAG, ODP switches (ODP: the
        data-parallel all-reduce bucketed under the backward).
    recompute: full activation recompute per block (stores only block inputs; adds one forward).
    keep_gathered: keep all-gathered weights from forward to backward (no second AG_z, more memory).
    microbatches: gradient-accumulation steps per batch; None = the fewest that fit in memory (from
        ``microbatch_choices``).
    order: rank order, fastest-varying dimension first (default "xyzd").
    memory_usable: fraction of GPU memory the model may plan for (rest: allocator, workspace, framework).
    zero1_over_d: shard optimizer states over the data dimension too (used to price Megatron's distributed optimizer).
    zero: the runtime's ``RuntimeConfig.zero`` for the 4D grids: 0 (gradients all-reduced over d, whole optimizer
        state), 1 (reduce-scatter + all-gather over d, optimizer state sharded), 2 (gradients sharded too:
        reduce-scattered in every micro-batch); None: ``evaluate`` and ``rank`` choose per grid the fastest that
        fits (0 when Gd = 1).
    bucket_bytes: size of the data-parallel gradient buckets (the runtime's ``RuntimeConfig.bucket_bytes``,
        default 25 MiB): the gradients are all-reduced over d one bucket per call, so each bucket pays the
        ring latency 2(Gd−1)·α once.
    grad_reduce: the dtype the FC layers' gradients are reduced in (the runtime's ``RuntimeConfig.grad_reduce_dtype``):
        the weight gradients' RS_z, the bias gradients' AR_z and the data-parallel all-reduce are priced at its bytes
        ("fp32" by default, as the runtime sends them under bf16; AG_z and the activations' all-reduces go in the
        problem's dtype).
    dropout / fused_attention: the element-wise kernels the runtime runs (``compute.elementwise_bytes``): the 4D
        runtime's GPT has no dropout and calls ``scaled_dot_product_attention`` (flash-style on a GPU: no S×S
        scores in HBM); Megatron-LM 2022 (Korthikanti et al.) ran dropout and an unfused softmax.
    clip: the step clips the global gradient norm (the drivers' ``--clip``, on by default): one 8-byte all-reduce
        over the block x·y·z, and over d with ``zero`` >= 1 (``perfmodel.comm.clip_events``).
    lora_r / lora_targets: LoRA (``axgrid.lora``): adapters of rank ``lora_r`` on the FC layers named (None: every
        block FC layer), the base frozen; 0: full training. Priced by :mod:`perfmodel.lora`.
    """

    overlap_ar: bool = True
    overlap_rs: bool = True
    overlap_ag: bool = True
    overlap_dp: bool = True
    recompute: bool = True
    keep_gathered: bool = False
    microbatches: int | None = None
    microbatch_choices: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    order: str = "xyzd"
    memory_usable: float = 0.9
    zero1_over_d: bool = False
    zero: int | None = 0
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    dropout: bool = False
    fused_attention: bool = True
    grad_reduce: str = "fp32"
    clip: bool = True
    lora_r: int = 0
    lora_targets: tuple[str, ...] | None = None
    cp: int = 1
    cp_exchange: str = "all_gather"

    def __post_init__(self) -> None:
        if isinstance(self.cp, bool) or not isinstance(self.cp, int) or self.cp < 1:
            raise PerfModelError(f"cp={self.cp!r}: give the context-parallel size, an int >= 1 (1: none)")
        if self.cp_exchange not in ("all_gather", "ring"):
            raise PerfModelError(f"cp_exchange={self.cp_exchange!r}: choose all_gather or ring")
        if isinstance(self.lora_r, bool) or not isinstance(self.lora_r, int) or self.lora_r < 0:
            raise PerfModelError(f"lora_r={self.lora_r!r}: give the adapters' rank, a positive int (0: full training)")
        if self.grad_reduce not in DTYPE_BYTES:
            raise PerfModelError(f"grad_reduce={self.grad_reduce!r}: choose one of {', '.join(DTYPE_BYTES)}")
        if sorted(self.order) != sorted("xyzd"):
            raise PerfModelError(f"order must be a permutation of 'xyzd', got {self.order!r}")
        if self.microbatches is not None and self.microbatches <= 0:
            raise PerfModelError(f"microbatches must be positive, got {self.microbatches}")
        if not isinstance(self.bucket_bytes, int) or self.bucket_bytes <= 0:
            raise PerfModelError(f"bucket_bytes must be a positive int, got {self.bucket_bytes!r}")
        if self.zero not in (None, 0, 1, 2) or isinstance(self.zero, bool):
            raise PerfModelError(f"zero must be 0, 1, 2 or None (choose per grid), got {self.zero!r}")
        if not 0 < self.memory_usable <= 1:
            raise PerfModelError(f"memory_usable must be in (0, 1], got {self.memory_usable}")

    def overlap_spec(self) -> str:
        """The runtime's ``--overlap`` string, e.g. "oar,ors,oag,odp,keep" (or "none")."""
        names = [n for n, on in (("oar", self.overlap_ar), ("ors", self.overlap_rs), ("oag", self.overlap_ag),
                                 ("odp", self.overlap_dp), ("keep", self.keep_gathered)) if on]
        return ",".join(names) or "none"

    @property
    def grad_bytes(self) -> int:
        """Bytes per element of the gradient reductions (``grad_reduce``)."""
        return DTYPE_BYTES[self.grad_reduce]

    def with_(self, **kw) -> "Options":
        """A copy with some fields changed."""
        return replace(self, **kw)


@dataclass(frozen=True)
class Problem:
    """What to rank: a model trained with ``batch`` sequences per step on ``gpus`` GPUs in ``dtype``."""

    model: TransformerShape
    batch: int
    gpus: int
    dtype: str = "bf16"
    options: Options = field(default_factory=Options)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise PerfModelError(f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPE_BYTES)}")
        if not isinstance(self.gpus, int) or self.gpus <= 0:
            raise PerfModelError(f"gpus must be a positive int, got {self.gpus!r}")
        if not isinstance(self.batch, int) or self.batch <= 0:
            raise PerfModelError(f"batch must be a positive int (sequences per step), got {self.batch!r}")
        mb = self.options.microbatches
        if mb is not None and self.batch % mb:
            raise PerfModelError(f"batch {self.batch} is not divisible by microbatches {mb}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def tokens(self) -> int:
        """Tokens per step (batch · seq)."""
        return self.batch * self.model.seq


def model_flops(spec: TransformerShape, batch: int, recompute: bool) -> float:
    """FLOPs per batch of ``batch`` sequences (``TransformerShape.flops_per_iteration``)."""
    return spec.flops_per_iteration(batch, recompute)
