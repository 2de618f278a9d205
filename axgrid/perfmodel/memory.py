"""Per-GPU memory in bytes, vectorised over grids and micro-batch sizes, for two layouts.

``layout="axgrid"`` (the 4D grids) is what axgrid's runtime holds, checked against it byte for byte by
``tests/test_memory_agreement.py`` (``axgrid.metrics.memtrack`` measures the runtime). ``m'`` tokens per rank per
micro-batch, ``hx = h/Gx``, ``hy = h/Gy``, ``fy = 4h/Gy``, ``Hy = heads/Gy``, ``Vy = V/Gy``, ``b`` = the activation
dtype's bytes (2 under bf16/fp16 autocast, 4 in fp32):

params/grads/optimizer: the runtime keeps fp32 weights (autocast casts them per GEMM): 4 B per stored element for
         the parameter, 4 for its gradient, 8 for AdamW's two moments plus 4 per parameter tensor (its 0-d
         ``step``). Stored elements: every FC weight shard (padded block / Gz), the biases ``[n/G_out]``
         (replicated over z), the 2L+1 layer norms' weight and bias ``[hx]``, the token and position tables
         ``[V, hx]``, ``[S, hx]`` (all rows, replicated over y, z, d).
zero:    (``Options.zero``, ``RuntimeConfig.zero``; :mod:`axgrid.data_parallel.buckets` lists the buffers) with Gd > 1
the
         gradients are views of the data-parallel buckets: one copy in every mode (no bucket copy besides).
         ``zero=0``: as above. ``zero=1``: the parameters and gradients are views of the buckets, each padded to a
         multiple of Gd elements (:mod:`perfmodel.buckets`): 4 B each per padded element; AdamW's moments only for
         this rank's 1/Gd share of every bucket (8 B per padded element / Gd; a step per parameter still).
         ``zero=2``: also only the gradient share persists (4 B per padded element / Gd), and during the backward
         the full buckets being filled and reduce-scattered (``dp buckets``, :class:`DataParallelBytes`): while
         the last block's backward runs (the peak's second candidate below) the first bucket of the layout if it
         holds more than the head's and ln_f's gradients (still filling), else the second (filling) and with ODP
         the first (in flight); a head tied to the token table has its gradient in the table's bucket, the last
         of the layout, alive from the head's backward on (so the first bucket holds the final norm's and the
         last block's gradients, and is filling); at the end of the backward, with the activations gone, the
         largest bucket being reduce-scattered (with ODP up to ``GRADIENT_WINDOW`` + 1 of them), and on a device
         whose reduce-scatter copies its input (gloo) one copy. (``zero=1`` with ODP on gloo holds such copies too,
         until the backward ends: not counted.)
gathered: Gz > 1 only (with Gz = 1 the block *is* the shard, a view): fp32 blocks ``[n_blk, k_blk]`` from the
         weight source (``axgrid/tensor_parallel/overlap.py``); without keep, one block at a time (the largest), with
         OAG the prefetched next one too (two consecutive layers in forward; in backward only with recompute, whose
         forwards prefetch); keep: every layer's block, alive from its forward to its backward; keep + recompute:
         the head's, or one recomputed block's four (+ with OAG the next block's first, prefetched by the last).
activations, saved for backward, per block per token (recompute off):
         ``8·hx + 8`` the two layer norms' fp32 ``xhat`` and ``rstd``; ``2·c·hx`` their outputs, saved by the next
         FC layer (``c = b``: the layer saves its input in the autocast dtype, what its GEMMs read);
         ``b·(3hy + 2fy)`` the QKV output (attention's q, k, v are views of it), MLP-up output (GELU's input),
         GELU output; attention (``attention=``, what the device's SDPA kernel saves): ``"flash"`` its output
         ``b·hy`` (attention-out's input is a view of it) and the fp32 log-sum-exp ``4·Hy``; ``"math"`` (no fused
         kernel) q, k, v copies and the probabilities ``[b, H, S, S]`` in ``math_bytes`` (the CPU's math path
         computes bf16 in fp32: 4) plus the output's contiguous copy ``b·hy``, and not the QKV output.
         With recompute: the block input (fp32 residual, ``4·hx``), which the checkpoint keeps.
         Head: final LN ``4·hx + 4`` and its output ``c·hx``; cross entropy: Gy = 1 torch's log-softmax
         ``4·V`` + targets 8 (+ one 4-byte scalar per micro-batch); Gy > 1 the softmax slice ``4·Vy`` + targets 8 +
         mask 1. Embeddings: the token and position ids, 16.
optimizer step: no temporaries. The drivers and the dry run build AdamW with :func:`axgrid.adamw`, the fused
         kernel on every device axgrid runs on (CPU, CUDA, the dry run's fakegpu), which updates in place; torch's
         default for-each AdamW would hold a 4 B fp32 temporary per parameter element at the step (its
         ``exp_avg_sq.sqrt()`` list; ``tests/ranks/test_optimizer_choice.py`` measures both), which this model
         does not price.
peak:    the total is the peak of a micro-batch that starts with gradients already accumulated (micro-batch 2 on),
         which is in backward: static + all stored activations + the larger of the loss gradient at the start of
         backward (Gy > 1: two fp32 ``[m', Vy]`` and under autocast a copy in b bytes; Gy = 1: torch's two fp32
         ``[m', V]``) with, for Gy = 1, only the gathered blocks kept from the forward (none without keep: the head's
         backward gathers its block after it), for Gy > 1 the gathered blocks live in backward, and the gathered
         blocks live in backward + the last block's backward
         (with ``zero=2``'s dp buckets) with its saved set (recomputed under recompute), the fp32 residual
         gradient and either MLP-down's backward (input gradient ``[m', fy]``, weight gradient ``[fy, hx]`` in b
         bytes and fp32, the weight block's low-precision copy, and what the
         device adds: :class:`Device`) or a layer norm's (five fp32 ``[m', hx]`` temporaries). Within 5% of the
         runtime's peak of live tensor bytes on the test's grids. With ``zero=2`` a third candidate: the end of the
         backward (static + the buckets being reduce-scattered). With one micro-batch the real peak is lower by up
         to the gradient bytes when Gd = 1 (they do not exist during the forward; with Gd > 1 they are the buckets).

``layout="megatron"`` (TP×PP×DP stages, ``perfmodel.pipeline``): Megatron-LM's layout as Korthikanti et al.
price it: bf16 weights and gradients with fp32 master + moments in the optimizer (12 B, divided by Gd with the
distributed optimizer, ``zero1_over_d``); the token table's rows split over TP (VocabParallelEmbedding), no dense
fp32 table gradient; flash attention; activations per token per block ``4h/t`` (block input,
LN1 out, residual, LN2 out, divided by the sequence-parallel split; a norm more per extra norm) + ``12h/t`` in b
bytes (a decoder: ``(2a + 2·kv + 4f)/t``: q and the attention's output, k and v of the key-value heads, the gated
MLP's four ``[·, f]``), logits
``m'·V/t·(b + 4)`` and two activation-gradient buffers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from axgrid.spec import DEFAULT_BUCKET_BYTES, GRADIENT_WINDOW, TransformerShape, ceil_div

from .buckets import pack
from .comm import layer_volumes
from .errors import PerfModelError
from .context_parallel import activation_delta, backward_transient_bytes
from .lora import (LoraPlan, check_lora_spec, dead_layers, lora_block_activations, lora_head_activations,
                   lora_plan, lora_static_bytes)
from .parameters import gradient_elements, trainable_parameters
from .problem import Options

ATTENTION_KINDS = ("flash", "math")
LAYOUTS = ("axgrid", "megatron")


@dataclass(frozen=True)
class Device:
    """What the runtime does differently on a device, as far as memory goes.

    ``attention``: what ``F.scaled_dot_product_attention`` saves there: ``"flash"`` (a fused kernel: CUDA's flash
    or memory-efficient attention, and the CPU's flash kernel, which torch picks for this GPT's causal attention
    without a mask) or ``"math"`` (the unfused path, e.g. where no fused kernel takes the inputs); ``math_bytes``:
    the math path's compute precision (the CPU computes bf16 attention in fp32: 4; None: the input's).
    ``reduce_in_fp32``: the runtime sums bf16/fp16 collectives in fp32 (``RuntimeConfig.reduce_in_fp32``'s default
    on gloo), so each such all-reduce holds an fp32 copy and a converted result besides its input.
    ``reduce_scatter_copies``: the backend's reduce-scatter works on a copy of its whole input (gloo's does).
    """

    attention: str = "flash"
    math_bytes: int | None = None
    reduce_in_fp32: bool = False
    reduce_scatter_copies: bool = False

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise PerfModelError(f"attention={self.attention!r}: choose one of {', '.join(ATTENTION_KINDS)}")


#: a CUDA/ROCm GPU with NCCL/RCCL (flash attention, collectives in the tensors' dtype)
GPU = Device()
#: this project's CPU ranks on gloo (the CPU's flash kernel; bf16 sums in fp32)
CPU_GLOO = Device(math_bytes=4, reduce_in_fp32=True, reduce_scatter_copies=True)


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU by component (float arrays [N]): ``static`` = params + grads + optimizer; ``buffers`` =
    gathered weights + the largest transient (which may include the dp buckets); ``activations``: saved for backward
    (blocks, head, embeddings)."""

    static: np.ndarray
    buffers: np.ndarray
    activations: np.ndarray
    total: np.ndarray
    params: np.ndarray | None = None
    grads: np.ndarray | None = None
    optimizer: np.ndarray | None = None
    gathered: np.ndarray | None = None
    dp_buckets: np.ndarray | None = None
    transient: np.ndarray | None = None
    block_activations: np.ndarray | None = None     # one block's saved bytes (recompute off)
    stored_block: np.ndarray | None = None          # what one block keeps from forward to backward (recompute: input)
    head_activations: np.ndarray | None = None      # final LN + head + cross entropy
    embedding_activations: np.ndarray | None = None


def bytes_per_param(dtype_bytes: int, fp32: bool) -> tuple[int, int]:
    """Megatron's layout: (param + grad bytes, optimizer bytes) per stored parameter element."""
    return 2 * dtype_bytes, (8 if fp32 else 12)


def parameter_tensors(spec: TransformerShape) -> int:
    """Parameter tensors on every rank (each has a 0-d AdamW ``step``): ``perfmodel.parameters``' list (the GPT:
    tables 2; per block each FC layer's weight (+ bias) and its layer norm's weight and bias; the head: ``ln_f`` 2 +
    weight 1)."""
    return len(trainable_parameters(spec, (1, 1, 1, 1)))


def stored_elements(spec: TransformerShape, gx, gy, gz) -> np.ndarray:
    """Parameter elements stored on one rank (weight shards, biases, norms, embedding tables): the sum of
    ``perfmodel.parameters.gradient_elements``."""
    shape = np.broadcast_shapes(*(np.shape(a) for a in (gx, gy, gz)))
    return np.asarray(sum(gradient_elements(spec, gx, gy, gz)), dtype=float).reshape(shape)


class DataParallelBytes(NamedTuple):
    """What the data-parallel buffers take per GPU (arrays): ``params``, ``grads``, ``optimizer`` (AdamW's moments
    and steps), and ``zero=2``'s full gradient buckets: ``at_block`` alive during the last block's backward,
    ``at_end`` while the last ones are reduce-scattered at the end of the backward (activations gone)."""

    params: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    at_block: np.ndarray
    at_end: np.ndarray


def data_parallel_bytes(spec: TransformerShape, gx, gy, gz, gd, opt: Options, device: "Device | None" = None
                        ) -> DataParallelBytes:
    """:class:`DataParallelBytes` in ``opt.zero``'s mode (see the module docstring; arrays broadcast over the
    grids): the buffers :mod:`axgrid.data_parallel.buckets` keeps, for the rank that owns the most (d = 0: its shares
    hold no padding)."""
    zero = opt.zero
    if zero not in (0, 1, 2):
        raise PerfModelError(f"Options.zero={zero!r}: memory is priced for one mode, 0, 1 or 2")
    gx, gy, gz, gd = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in (gx, gy, gz, gd)))
    steps = 4.0 * parameter_tensors(spec)                     # AdamW's 0-d step per parameter (or piece)
    none = np.zeros(gx.shape)
    if zero == 0:
        elems = stored_elements(spec, gx, gy, gz)
        return DataParallelBytes(4.0 * elems, 4.0 * elems, 8.0 * elems + steps, none, none)
    shape = gx.shape
    flat = [a.reshape(-1) for a in (gx, gy, gz, gd)]
    hx = ceil_div(spec.hidden, flat[0])
    head = layer_volumes(spec.head_layer(), *flat[:3], 1)
    bt = pack(gradient_elements(spec, *flat[:3]), 4, opt.bucket_bytes, flat[3])
    padded, share = bt.padded.reshape(shape) * 4.0, (bt.padded // flat[3]).reshape(shape) * 4.0
    if zero == 1:
        return DataParallelBytes(padded, padded, 2.0 * share + steps, none, none)
    copies = 2.0 if (device or GPU).reduce_scatter_copies else 1.0     # the reduce-scatter's copy of its input
    first, second = bt.first.reshape(shape) * 4.0, bt.second.reshape(shape) * 4.0
    # the first bucket is complete before the last block's backward when it holds only gradients final before it:
    # the final norm's and an untied head's (a tied head's is the token table's, final after the lookup's backward
    # and packed last); then the second fills (and with ODP the first is in flight); else the first is still filling
    final = spec.norm_parameters * hx + (0 if spec.tied else head.shard)
    early = (final * 4 >= opt.bucket_bytes).reshape(shape) & (bt.count.reshape(shape) > 1)
    at_block = np.where(early, second + (first if opt.overlap_dp else 0.0), first)
    if spec.tied:     # the table's bucket (the last) holds the head's gradient from the head's backward on
        at_block = at_block + np.where(bt.count.reshape(shape) > 1, bt.last.reshape(shape) * 4.0, 0.0)
    # at the end: the buckets waited for (with ODP the last one and the GRADIENT_WINDOW before it) and the copy of
    # the one being reduced
    alive = np.minimum(bt.count, GRADIENT_WINDOW + 1 if opt.overlap_dp else 1).reshape(shape) + (copies - 1.0)
    return DataParallelBytes(padded, share, 2.0 * share + steps, at_block, bt.largest.reshape(shape) * 4.0 * alive)


def static_bytes(spec: TransformerShape, grid: tuple[int, int, int, int], zero: int = 0,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, lora: LoraPlan | None = None) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer) bytes of one rank of ``grid`` (the d = 0 rank): :func:`data_parallel_bytes`
    in ``zero``'s mode with buckets of ``bucket_bytes`` (Gd = 1: every mode holds what ``zero=0`` holds);
    ``lora``: the frozen base's parameters and the adapters' (``perfmodel.lora.lora_static_bytes``)."""
    gx, gy, gz, gd = (int(v) for v in grid)
    if lora is not None:
        st = lora_static_bytes(spec, lora, stored_elements(spec, gx, gy, gz), gx, gy, gd, zero if gd > 1 else 0,
                               bucket_bytes, True, False, 0)
    else:
        st = data_parallel_bytes(spec, gx, gy, gz, gd, Options(zero=zero, bucket_bytes=bucket_bytes))
    return int(st.params), int(st.grads), int(st.optimizer)


def block_activation_bytes(spec: TransformerShape, gx, gy, mprime, act_bytes: int,
                           device: Device = GPU) -> np.ndarray:
    """Bytes one block saves for backward on one rank (recompute off); see the module docstring (the GPT) and
    :func:`decoder_block_activation_bytes` (a Hugging Face decoder)."""
    if not spec.is_gpt:
        return decoder_block_activation_bytes(spec, gx, gy, mprime, act_bytes, device)
    gx, gy = np.asarray(gx, dtype=np.int64), np.asarray(gy, dtype=np.int64)
    mp = np.asarray(mprime, dtype=float)
    h, b = spec.hidden, act_bytes
    hx, hy, fy, Hy = ceil_div(h, gx), ceil_div(h, gy), ceil_div(spec.ffn, gy), ceil_div(spec.heads, gy)
    per_token = 8 * hx + 8 + 2 * b * hx + b * 2 * fy
    if device.attention == "flash":
        per_token = per_token + b * 3 * hy + b * hy + 4 * Hy
    else:
        c = device.math_bytes or b
        per_token = per_token + 3 * c * hy + c * Hy * spec.seq + b * hy
    return mp * per_token


def norm_readers(spec: TransformerShape) -> list[int]:
    """For each norm of a block that an FC layer reads: how many FC layers read its output (a norm's layer and the
    normal layers right after it: Llama's q, k, v and gate, up; the GPT's and Phi-3's fused ones, one each)."""
    out: list[int] = []
    reading = False                              # the layers since the last norm read its output
    for layer in spec.block_layers():
        if layer.norm:
            out.append(1)
            reading = True
        elif layer.transposed:
            reading = False
        elif reading:
            out[-1] += 1
    return out


def decoder_block_activation_bytes(spec: TransformerShape, gx, gy, mprime, act_bytes: int,
                                   device: Device = GPU) -> np.ndarray:
    """Bytes one decoder layer (the Llama structure under its plan, ``axgrid.plans.hf``) saves for backward on one
    rank (recompute off), per token, with ``q = H·d``, ``kv = H_kv·d`` the attention widths, ``f`` the MLP width:

    - each norm its fp32 input ``4·hx`` and statistic 4 (``block_norms`` of them);
    - the FC layers reading a norm's output each save their input in the compute dtype: under autocast each casts
      it on its own (``b·hx`` per reader: Llama's q, k, v and gate, up: five), in fp32 one shared copy per norm;
    - flash attention its rotated q and k and v ``b·(q + kv)/Gy`` (only the key-value heads' k and v: GQA), its
      output ``b·q/Gy`` (o_proj's input) and the fp32 log-sum-exp ``4·H/Gy`` (the math path: q, k, v, the
      probabilities ``[H/Gy, S, K]`` in ``math_bytes`` and the output);
    - the gated MLP's gate and up outputs, the activation and the product (down's input): ``4·b·f/Gy``.

    A fused q, k, v projection (Phi-3's ``qkv_proj``, with flash attention) saves ``b·(2q + kv)/Gy`` more: v is a
    view of the fused output, which stays alive whole, and one more ``[m', q/Gy]`` (measured on the dry run of five
    tiny Phi-3 configs, recompute off: hidden, key-value heads, MLP width, Gy and bf16/fp32 varied one at a time,
    equal to the byte; Phi-3's head size is h/H, so the second q-width tensor cannot be told from an h/Gy one).
    Gemma 3's layer saves ``b·q/Gy`` more (measured on nine tiny Gemma 3 dry runs, recompute off: head size, key-value
    heads, hidden, MLP width, Gx, Gy and the sliding layers varied one at a time, equal to the byte; not known which
    tensor: Gemma 3 normalises q after its transpose, Qwen3 before).

    Measured on the dry run of 22 tiny Llama configs (hidden, heads, key-value heads, head size, MLP width, Gx, Gy,
    bf16 and fp32 varied one at a time, by hand): equal to the byte; ``tests/ranks/test_dryrun.py``'s Hugging Face
    cases keep it equal to the dry run's activations on its grids."""
    gx, gy = np.asarray(gx, dtype=np.int64), np.asarray(gy, dtype=np.int64)
    mp = np.asarray(mprime, dtype=float)
    b = act_bytes
    hx, fy, Hy = ceil_div(spec.hidden, gx), ceil_div(spec.ffn, gy), ceil_div(spec.heads, gy)
    qy, kvy = Hy * spec.head_dim, ceil_div(spec.kv_heads, gy) * spec.head_dim
    readers = norm_readers(spec)
    saved_inputs = b * hx * sum(readers) if b < 4 else 4 * hx * len(readers)
    per_token = spec.block_norms() * (4 * hx + 4) + saved_inputs + 4 * b * fy
    if spec.head_norms:                          # q_norm, k_norm: their fp32 inputs and statistics
        per_token = per_token + 4 * (qy + kvy) + 4 * (Hy + ceil_div(spec.kv_heads, gy))
    if device.attention == "flash":
        per_token = per_token + b * (qy + kvy) + b * kvy + b * qy + 4 * Hy
        if next(layer for layer in spec.block_layers() if layer.attention).n > spec.attention_width:
            # a fused q, k, v projection (Phi-3): v is a view of the fused output, which stays alive whole (q and k
            # besides v), and one more ``[m', q/Gy]``: b·(2q + kv)/Gy (measured: below)
            per_token = per_token + b * (2 * qy + kvy)
        if spec.family == "gemma3_text":       # measured: one more [m', q/Gy] (below)
            per_token = per_token + b * qy
    else:
        c = device.math_bytes or b
        per_token = per_token + c * (qy + 2 * kvy) + c * Hy * spec.attended_keys() + b * qy
    return mp * per_token


def head_activation_bytes(spec: TransformerShape, gx, gy, mprime, act_bytes: int) -> np.ndarray:
    """Bytes the final layer norm, the head and the cross entropy save on one rank (per micro-batch)."""
    gx, gy = np.asarray(gx, dtype=np.int64), np.asarray(gy, dtype=np.int64)
    mp = np.asarray(mprime, dtype=float)
    hx, vy = ceil_div(spec.hidden, gx), ceil_div(spec.vocab, gy)
    ce = np.where(gy > 1, mp * (4 * vy + 9), mp * (4 * spec.vocab + 8) + 4)
    return mp * (4 * hx + 4 + act_bytes * hx) + ce


def rotary_tables(spec: TransformerShape) -> int:
    """The rotary tables (cos and sin) a decoder's layers read: Gemma 3's sliding layers have their own (the local
    base frequency), so 2 where its layers mix sliding and full attention (measured: 8·S·d B more), else 1."""
    return 2 if spec.family == "gemma3_text" and 0 < spec.sliding_layers < spec.layers else 1


def embedding_activation_bytes(mprime, spec: TransformerShape | None = None, recompute: bool = False) -> np.ndarray:
    """The GPT's token and position ids ``[m']`` (int64) the two embedding lookups save; a decoder's token ids and
    one byte per token besides (two when tied; measured), and without recompute the rotary table's cos and sin
    ``[S, d]`` in fp32 that the layers' rotations save, once per micro-batch (Hugging Face's position ids are
    ``[1, S]``; with recompute the checkpoints hold them as inputs, not saved for backward)."""
    mp = np.asarray(mprime, dtype=float)
    if spec is None or spec.is_gpt:
        return 16.0 * mp
    rope = 0.0 if recompute else 8.0 * rotary_tables(spec) * spec.seq * spec.head_dim
    return (10.0 if spec.tied else 9.0) * mp + rope


def memory_per_gpu(spec: TransformerShape, gx, gy, gz, gd, mprime, dtype_bytes: int, fp32: bool,
                   opt: Options, inflight=1.0, seq_split=1, layout: str = "axgrid", device: Device = GPU) -> Memory:
    """Memory per GPU with ``mprime`` tokens per GPU per micro-batch (all arguments broadcast); ``layout`` as in
    the module docstring, ``device``: what the runtime does there (:class:`Device`).

    Pipeline stages (``perfmodel.pipeline``, the Megatron layout): ``inflight`` micro-batches keep their stored
    activations alive at once (1F1B: up to the pipeline depth on the first stage); ``seq_split`` > 1 is sequence
    parallelism, which splits the h/Gx activations (block input, layer-norm outputs, residual) that many ways."""
    if layout not in LAYOUTS:
        raise PerfModelError(f"layout={layout!r}: choose one of {', '.join(LAYOUTS)}")
    if layout == "megatron":
        return _megatron(spec, gx, gy, gz, gd, mprime, dtype_bytes, fp32, opt, inflight, seq_split)
    gx, gy, gz, gd = (np.asarray(a, dtype=np.int64) for a in (gx, gy, gz, gd))
    mp = np.asarray(mprime, dtype=float)
    inflight = np.asarray(inflight, dtype=float)
    L, b = spec.layers, dtype_bytes
    plan = lora_plan(spec, opt)
    if plan is None:
        params, grads, optimizer, dp_block, dp_end = data_parallel_bytes(spec, gx, gy, gz, gd, opt, device)
    else:                                       # LoRA: the base frozen, the adapters trained (perfmodel.lora)
        check_lora_spec(spec, plan)
        params, grads, optimizer, dp_block, dp_end = lora_static_bytes(
            spec, plan, stored_elements(spec, gx, gy, gz), gx, gy, gd, opt.zero, opt.bucket_bytes, opt.overlap_dp,
            (device or GPU).reduce_scatter_copies, GRADIENT_WINDOW)

    vols = [layer_volumes(layer, gx, gy, gz, 1) for layer in spec.block_layers()]
    head = layer_volumes(spec.head_layer(), gx, gy, gz, 1)
    blocks = [v.padded * float(b) for v in vols]                # gathered blocks, forward order: in the compute
    head_blk = head.padded * float(b)                           # dtype (the runtime gathers bf16 under autocast)
    order = blocks + [head_blk]
    pairs = np.maximum.reduce([a + c for a, c in zip(order, order[1:])] + ([blocks[-1] + blocks[0]] if L > 1 else []))
    largest = np.maximum.reduce(order)
    if opt.keep_gathered and opt.recompute:     # the block recomputed keeps its four (+ the next one prefetched)
        gathered = np.maximum(head_blk, sum(blocks) + (blocks[0] if opt.overlap_ag else 0.0))
        in_backward = gathered
    elif opt.keep_gathered:
        gathered = in_backward = head_blk + L * sum(blocks)
        if plan is not None:                    # LoRA: block 0's layers without a backward keep nothing
            names = [layer.name for layer in spec.block_layers()]
            gathered = in_backward = gathered - sum(blocks[names.index(n)] for n in dead_layers(spec, plan))
    elif opt.overlap_ag:                         # the current block and the prefetched next one
        gathered = pairs
        # backward gathers one block at a time; with recompute its forwards prefetch as the forward does
        in_backward = np.maximum(pairs, largest + blocks[0]) if opt.recompute else largest
    else:
        gathered = in_backward = largest
    in_backward = np.where(gz > 1, in_backward, 0.0)
    gathered = np.where(gz > 1, gathered, 0.0)

    blk = block_activation_bytes(spec, gx, gy, mp, b, device) + activation_delta(
        spec, gy, mp, opt.cp, b, opt.cp_exchange, device.attention, device.math_bytes)   # context parallelism
    hx, vy, fy = ceil_div(spec.hidden, gx), ceil_div(spec.vocab, gy), ceil_div(spec.ffn, gy)
    head_act = head_activation_bytes(spec, gx, gy, mp, b)
    emb = embedding_activation_bytes(mp, spec, opt.recompute)
    unsaved = 0.0                               # what block 0 does not save under LoRA (its input needs no gradient)
    if plan is not None:
        adapters, unsaved = lora_block_activations(spec, plan, gx, gy, mp, b)
        blk = blk + adapters
        head_act = head_act + lora_head_activations(spec, plan, gx, gy, mp, b)
        emb = 0.0 * emb                         # the frozen tables save nothing (no gradient flows to them)
    stored_blk = mp * 4.0 * hx if opt.recompute else blk
    act = inflight * (L * stored_blk - (0.0 if opt.recompute else unsaved)) + head_act + emb

    # the largest transient in backward (see the module docstring's "peak"): the loss gradient, or the last
    # block's backward (MLP-down's or a layer norm's, whichever holds more)
    loss_grad = np.where(gy > 1, mp * vy * (8.0 + (b if b < 4 else 0)), mp * spec.vocab * 8.0)
    red = np.where((gx > 1) & device.reduce_in_fp32 & (b < 4), 4.0 + b, 0.0)
    rs_copy = np.where((gz > 1) & device.reduce_scatter_copies, 4.0, 0.0)
    # a low-precision copy of the weight block: the GEMMs' cast of the fp32 block with Gz = 1; with Gz > 1 the block
    # is gathered in bf16 already, but the measured peak still holds a block-sized bf16 buffer there (kept: the
    # peaks agree within the tolerance with it, and are under-predicted without it)
    cast = b if b < 4 else 0.0
    # the weight-gradient block in b, its fp32 flat copy and the reduce-scatter's copy: none for a frozen base
    dw = 0.0 if plan is not None else b + 4.0 + rs_copy
    mlp_bwd = mp * (b * hx + fy * (b + red)) + fy * hx * (dw + cast)
    ln_bwd = mp * (24.0 * hx - 2.0 * b * fy - b * hx)
    block_bwd = (blk - stored_blk) + mp * 4.0 * hx + np.maximum(
        np.maximum(mlp_bwd, ln_bwd), backward_transient_bytes(spec, gy, mp, opt.cp, opt.cp_exchange, b))   # CP's softmax
    transient = block_bwd - head_act + dp_block
    static = params + grads + optimizer
    # zero=2: the end of the backward, when the last buckets are reduce-scattered, may hold more than the rest
    transient = np.maximum(transient, dp_end - in_backward - act)
    # Gy = 1: torch's loss gradient comes before the head's backward gathers its block, and is freed by then: only
    # the blocks kept from the forward are alive with it (keep: every layer's, or with recompute the head's; without
    # keep none: measured on the dry run of LLaMA-3.1-70B on 1x1x16x4, whose peak is there, docs/results.md).
    # Gy > 1: the vocabulary-parallel loss gradient's buffers are still alive at the head's backward, with its
    # gathered block (the LoRA dry runs' peaks at 2x2x2x2, tests/ranks/test_lora_dryrun.py, equal to the byte)
    kept = in_backward if opt.keep_gathered and not opt.recompute else (head_blk if opt.keep_gathered else 0.0)
    at_loss = np.where((gz > 1) & (gy == 1), kept, in_backward)
    buffers = np.maximum(in_backward + transient, at_loss + loss_grad)   # the peak is in backward (the docstring)
    transient = buffers - in_backward
    dp_buckets = np.maximum(dp_block, dp_end)
    shape = np.broadcast_shapes(np.shape(act), np.shape(static), np.shape(buffers))
    bc = lambda a: np.broadcast_to(np.asarray(a, dtype=float), shape).astype(float)  # noqa: E731
    return Memory(bc(static), bc(buffers), bc(act), bc(static + buffers + act), params=bc(params),
                  grads=bc(grads), optimizer=bc(optimizer), gathered=bc(gathered), dp_buckets=bc(dp_buckets),
                  transient=bc(transient), block_activations=bc(blk), stored_block=bc(stored_blk),
                  head_activations=bc(head_act),
                  embedding_activations=bc(emb))


def _megatron(spec: TransformerShape, gx, gy, gz, gd, mprime, dtype_bytes: int, fp32: bool, opt: Options,
              inflight, seq_split) -> Memory:
    """Megatron-LM's layout (see the module docstring)."""
    gx, gy, gz, gd = (np.asarray(a, dtype=np.int64) for a in (gx, gy, gz, gd))
    mp = np.asarray(mprime, dtype=float)
    inflight, seq_split = np.asarray(inflight, dtype=float), np.asarray(seq_split, dtype=float)
    h, L, V = spec.hidden, spec.layers, spec.vocab
    b = dtype_bytes
    pg, optb = bytes_per_param(b, fp32)
    vols = [layer_volumes(layer, gx, gy, gz, 1) for layer in spec.block_layers()]
    head = layer_volumes(spec.head_layer(), gx, gy, gz, 1)
    hx = ceil_div(h, gx)
    # Megatron's VocabParallelEmbedding splits the token table's rows over TP (y here), not its features
    elems = stored_elements(spec, gx, gy, gz) - (V - ceil_div(V, gy)) * hx
    opt_div = gd if opt.zero1_over_d else 1
    static = elems * pg + elems * optb / opt_div

    max_block = np.maximum.reduce([v.padded for v in vols] + [head.padded]).astype(float)
    n_buf = 2 + int(opt.overlap_ag) + int(opt.overlap_rs)
    buffers = max_block * b * n_buf
    if opt.keep_gathered:
        buffers = buffers + (L * sum(v.padded for v in vols) + head.padded) * float(b)
    elif opt.recompute:
        buffers = buffers + sum(v.padded for v in vols) * float(b)

    # the stream's copies (block input, each norm's output, the residual: the GPT's 4·h) split by SP, and what the
    # tensor-parallel ranks hold: q, k, v and the attention's output, the MLP's hidden (the GPT's up and GELU outputs
    # 2f = 8h: 12·h with the attention's 4h; a gated MLP's gate, up, activation and product: 4f)
    stream = (2 + spec.block_norms()) * h
    split = spec.attention_width * 2 + 2 * spec.kv_heads * spec.head_dim + (4 if spec.gated_mlp else 2) * spec.ffn
    full_block = stream / (gx * seq_split) + float(split) / gy
    if opt.recompute:
        act = mp * b * (inflight * L * h / (gx * seq_split) + full_block)
    else:
        act = mp * b * inflight * L * full_block
    act = act + mp * ceil_div(V, gy) * (b + 4) + 2 * mp * 4.0 * h / gy * b
    buffers = np.broadcast_to(buffers, act.shape).astype(float)
    static = np.broadcast_to(static, act.shape).astype(float)
    return Memory(static, buffers, act, static + buffers + act)
