"""Inputs of the model: the transformer, the run options, the data types.

Named GPT sizes (layers / hidden / heads) are the ones of the AxoNN papers (REFERENCE.md). Sequence length and
vocabulary are not given there; we use seq = 2048 and vocab = 51200 (GPT-NeoX's 50,257 padded to a multiple of
1024) for all of them. ``gpt-1t`` is 128 / 25600 / 160 (≈1.01e12 parameters, the Megatron-LM 1T shape); ``gpt-175b`` is the GPT-3 shape
96 / 12288 / 96 and ``gpt-22b`` 48 / 6144 / 48 (≈21.8e9): our assumption for the Frontier study's 22B and 175B,
whose exact shapes are not held here.
``gpt-tiny`` and ``gpt-mini`` are sized to run on a laptop CPU with gloo.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .errors import PerfModelError

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}
#: The runtime's default data-parallel gradient bucket (``axgrid.RuntimeConfig.bucket_bytes``, 25 MiB).
DEFAULT_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class TransformerSpec:
    """A GPT-style decoder: ``layers`` blocks of 4 FC layers (QKV, attn-out, MLP-up, MLP-down) + an LM head."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int = 2048
    vocab: int = 51200
    bias: bool = True

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "seq", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise PerfModelError(f"TransformerSpec.{f} must be a positive int, got {v!r}")
        if self.hidden % self.heads:
            raise PerfModelError(f"hidden {self.hidden} is not divisible by heads {self.heads}")

    @property
    def params(self) -> int:
        """Parameter count: blocks (12h² weights + 13h biases/LN), embeddings V·h + S·h, untied head V·h."""
        h, L, V, S = self.hidden, self.layers, self.vocab, self.seq
        return L * (12 * h * h + 13 * h) + 2 * V * h + S * h + 2 * h


MODELS: dict[str, TransformerSpec] = {
    s.name: s
    for s in (
        TransformerSpec("gpt-tiny", 2, 64, 4, seq=64, vocab=256),
        TransformerSpec("gpt-mini", 4, 128, 4, seq=128, vocab=256),
        TransformerSpec("gpt-5b", 24, 4096, 32),
        TransformerSpec("gpt-10b", 32, 5120, 40),
        TransformerSpec("gpt-20b", 32, 7168, 56),
        TransformerSpec("gpt-40b", 38, 9216, 72),
        TransformerSpec("gpt-60b", 56, 9216, 72),
        TransformerSpec("gpt-80b", 42, 12288, 96),
        TransformerSpec("gpt-160b", 84, 12288, 96),
        TransformerSpec("gpt-320b", 96, 16384, 128),
        TransformerSpec("gpt-640b", 192, 16384, 128),
        TransformerSpec("gpt-22b", 48, 6144, 48),
        TransformerSpec("gpt-175b", 96, 12288, 96),
        TransformerSpec("gpt-1t", 128, 25600, 160),
    )
}


def get_model(name: str) -> TransformerSpec:
    """Look up a named model; an unknown name raises with the list of known ones."""
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise PerfModelError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None


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
    bucket_bytes: size of the data-parallel gradient buckets (the runtime's ``RuntimeConfig.bucket_bytes``,
        default 25 MiB): the gradients are all-reduced over d one bucket per call, so each bucket pays the
        ring latency 2(Gd−1)·α once.
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
    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    def __post_init__(self) -> None:
        if sorted(self.order) != sorted("xyzd"):
            raise PerfModelError(f"order must be a permutation of 'xyzd', got {self.order!r}")
        if self.microbatches is not None and self.microbatches <= 0:
            raise PerfModelError(f"microbatches must be positive, got {self.microbatches}")
        if not isinstance(self.bucket_bytes, int) or self.bucket_bytes <= 0:
            raise PerfModelError(f"bucket_bytes must be a positive int, got {self.bucket_bytes!r}")
        if not 0 < self.memory_usable <= 1:
            raise PerfModelError(f"memory_usable must be in (0, 1], got {self.memory_usable}")

    def overlap_spec(self) -> str:
        """The runtime's ``--overlap`` string, e.g. "oar,ors,oag,odp,keep" (or "none")."""
        names = [n for n, on in (("oar", self.overlap_ar), ("ors", self.overlap_rs), ("oag", self.overlap_ag),
                                 ("odp", self.overlap_dp), ("keep", self.keep_gathered)) if on]
        return ",".join(names) or "none"

    def with_(self, **kw) -> "Options":
        """A copy with some fields changed."""
        return replace(self, **kw)


@dataclass(frozen=True)
class Problem:
    """What to rank: a model trained with ``batch`` sequences per step on ``gpus`` GPUs in ``dtype``."""

    model: TransformerSpec
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


def model_flops(spec: TransformerSpec, batch: int, recompute: bool) -> float:
    """FLOPs per batch (REFERENCE.md): 96·B·S·L·h²·(1 + S/(6h) + V/(16·L·h)) with full recompute,
    72·B·S·L·h²·(1 + S/(6h) + V/(12·L·h)) without (forward counted 3× instead of 4× in the blocks; the head is
    never recomputed, so its 6·B·S·h·V stays the same in both)."""
    B, S, L, h, V = batch, spec.seq, spec.layers, spec.hidden, spec.vocab
    if recompute:
        return 96.0 * B * S * L * h * h * (1 + S / (6 * h) + V / (16 * L * h))
    return 72.0 * B * S * L * h * h * (1 + S / (6 * h) + V / (12 * L * h))
