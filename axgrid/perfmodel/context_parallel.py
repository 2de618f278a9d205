"""Context parallelism as perfmodel prices it: what ``axgrid.init(..., cp=N)`` changes in a training step.

Under CP each sequence of ``S`` tokens is cut into ``2·cp`` chunks of ``c = S/(2·cp)``; rank ``r`` of a group
("c": ``cp`` consecutive z-ranks, ``cp`` dividing Gz, :mod:`axgrid.spec.layout`) holds chunks ``r`` and
``2·cp−1−r`` (:mod:`axgrid.context_parallel.chunks`). The tokens per rank ``m' = B·S/(Gz·Gd)`` do not change: a
micro-batch's ``B`` sequences split over ``Gz·Gd/cp`` groups instead of ``Gz·Gd`` ranks, so every FC layer, norm,
table and data-parallel term of the step is the one without CP, and only attention differs. Per layer and
micro-batch, with ``kv = ⌈H_kv/Gy⌉·d`` the key-value width of this rank's heads (GQA: only these travel) and ``b``
the bytes of the keys' dtype (:func:`kv_bytes`), one rank's key-value block ``[2, m'·cp/S, H_kv/Gy, 2c, d]`` holds ``2·m'·kv·b`` bytes:

=======================  =============================================================================================
all-gather (default)     forward AG_c of the block (the ledger counts the output: ``cp·2·m'·kv·b``), again in the
                         recompute forward; backward RS_c of the gathered keys' and values' gradient (the same bytes:
                         the ledger counts the input)
ring                     forward ``cp−1`` sends and ``cp−1`` receives of the block, again in the recompute forward;
                         backward ``cp−1`` of each for the blocks and ``cp`` of each for their gradients (the ledger
                         counts a send's and a receive's bytes alike)
the loss                 nothing new: the group lies inside z, so the loss's AR_z (the GPT's sum; a decoder's
                         ``[sum, count]``) already sums every chunk's tokens and counts, and the normaliser is the
                         batch's token count either way
=======================  =============================================================================================

**Attention's work per rank** (:func:`computed_keys`): each chunk's queries attend to the keys of
:func:`axgrid.context_parallel.attention.visible_keys` as a dense rectangle (a masked SDPA, or the ring's masked
block products), so a rank computes ``Σ_j c·w_j`` query-key pairs per sequence and head, ``w_j`` the visible span of
its chunk ``j``; without a window ``(2·cp+1)·c²`` on every rank (the causal balance: contiguous pieces would give
the last rank ``2·cp−1`` times the first's). Serial attention is priced at ``S`` keys per query (the dense
convention of ``TransformerShape.attended_keys``, which the flash kernel's calibrated rate absorbs); the same
convention under CP counts ``2·Σ_j w_j / 2`` keys per query, i.e. the rectangles' pairs twice:
``(2cp+1)·S/(2cp)`` keys per query, ``(2cp+1)/(2cp)`` times the flash kernel's causal work.

**The kernel**: the all-gather calls SDPA with a boolean mask per chunk; CUDA's flash kernel takes no mask and its
memory-efficient kernel no grouped-query heads with one (ComfyUI PR #15135 reports the fallback), and the dry run's
device runs the math path for any mask, as torch's math path on a GPU: q, k and v upcast to fp32 (k and v repeated to
the query heads), the probabilities materialised. So the all-gather's attention is priced as fp32 GEMMs at the
machine's fp32 rate plus its score matrices through HBM (three passes forward, written, masked, softmaxed; five
backward), and its saved set (:func:`attention_saved_bytes`) is the math path's. The ring runs its block products
in the compute dtype (plain matmuls, no fused kernel), with the same score traffic, and saves only q, k, v, the
output and the log-sum-exp.

**Exposure**: the all-gather and the reduce-scatter are blocking (the runtime posts them synchronously); the ring's
transfer of each step hides under that step's block products (:func:`cp_time`).
"""
from __future__ import annotations

import numpy as np

from axgrid.spec import TransformerShape, ceil_div

from .errors import PerfModelError

#: the two exchanges the runtime has (``axgrid.context_parallel.EXCHANGES``)
EXCHANGES = ("all_gather", "ring")


def check(spec: TransformerShape, cp: int, exchange: str = "all_gather") -> None:
    """A one-line PerfModelError when ``cp`` cannot split ``spec``'s sequences (before any pricing)."""
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise PerfModelError(f"cp={cp!r}: give the context-parallel size, an int >= 1 (1: none)")
    if exchange not in EXCHANGES:
        raise PerfModelError(f"cp exchange {exchange!r}: choose one of {', '.join(EXCHANGES)}")
    if cp > 1 and spec.seq % (2 * cp):
        step = 2 * cp
        raise PerfModelError(f"sequence length {spec.seq} does not cut into 2·cp = {step} equal chunks (cp={cp}); "
                             f"use a multiple of {step}, e.g. {spec.seq // step * step or step} or "
                             f"{(spec.seq // step + 1) * step}")
    if cp > 1 and not spec.is_gpt and exchange != "all_gather":
        raise PerfModelError(f"cp exchange {exchange!r}: a Hugging Face decoder's plan all-gathers keys and values; "
                             f"use all_gather")


def sizes(spec: TransformerShape, gz: int) -> list[int]:
    """The context-parallel sizes a grid with ``gz`` takes for ``spec`` (the runtime's rule: ``cp`` divides Gz, the
    GPT's and the plans'; and the sequence cuts into ``2·cp`` chunks)."""
    return [c for c in range(1, gz + 1) if gz % c == 0 and (c == 1 or spec.seq % (2 * c) == 0)]


def kv_width(spec: TransformerShape, gy) -> np.ndarray:
    """Elements per token of one rank's keys (= its values'): ``⌈H_kv/Gy⌉·d``."""
    return ceil_div(spec.kv_heads, np.asarray(gy, dtype=np.int64)) * spec.head_dim


def kv_bytes(spec: TransformerShape, dtype_bytes: int) -> int:
    """Bytes per element of the keys and values that travel: the GPT's in the compute dtype (its QKV output); a
    Hugging Face decoder's in fp32 whatever the compute dtype, since its rotary tables follow the fp32 hidden states
    and the rotation promotes the bf16 keys to fp32 (their stack with the values promotes those too; measured by
    the dry run, tests/ranks/test_dryrun_context_parallel.py)."""
    return dtype_bytes if spec.is_gpt else 4


def kv_block_bytes(spec: TransformerShape, gy, mprime, dtype_bytes: int) -> np.ndarray:
    """Bytes of one rank's key-value block ``[2, m'·cp/S, H_kv/Gy, 2c, d]``: ``2·m'·kv`` elements of
    :func:`kv_bytes` (``dtype_bytes``: the compute dtype's)."""
    return 2.0 * np.asarray(mprime, dtype=float) * kv_width(spec, gy) * kv_bytes(spec, dtype_bytes)


def step_events(spec: TransformerShape, gy: int, mprime: int, n_microbatches: int, dtype_bytes: int, cp: int,
                exchange: str = "all_gather", recompute: bool = False) -> list[tuple[str, str, int]]:
    """The collectives CP adds to a step, as (dim "c", op, bytes): per micro-batch, every layer's forward, then
    its backward (with recompute its forward again first); see the module docstring. Empty for ``cp`` = 1."""
    if cp <= 1:
        return []
    block = int(kv_block_bytes(spec, gy, mprime, dtype_bytes))
    if exchange == "all_gather":
        fwd = [("c", "all_gather", cp * block)]
        bwd = [("c", "reduce_scatter", cp * block)]
    else:
        fwd = [("c", "send", block), ("c", "recv", block)] * (cp - 1)
        bwd = [("c", "send", block), ("c", "recv", block)] * (2 * cp - 1)
    ev: list[tuple[str, str, int]] = []
    for _ in range(n_microbatches):
        ev += fwd * spec.layers
        ev += ((fwd if recompute else []) + bwd) * spec.layers
    return ev


def cp_bytes(spec: TransformerShape, gy, mprime, dtype_bytes: int, cp: int, exchange: str = "all_gather",
             recompute: bool = False) -> np.ndarray:
    """Bytes [N] over "c" per micro-batch, as the ledger counts them: :func:`step_events`' sum, vectorised."""
    block = np.floor(kv_block_bytes(spec, gy, mprime, dtype_bytes))
    if cp <= 1:
        return 0.0 * block
    if exchange == "all_gather":
        return spec.layers * cp * block * (2 + int(recompute))
    return spec.layers * 2 * block * ((cp - 1) * (1 + int(recompute)) + 2 * cp - 1)


def visible_widths(spec: TransformerShape, cp: int, window: int | None) -> list[tuple[int, int]]:
    """For each rank of the group, the visible key spans ``w`` of its two chunks (a window or None)."""
    c = spec.seq // (2 * cp)
    out = []
    for r in range(cp):
        ws = []
        for j in (r, 2 * cp - 1 - r):
            lo = 0 if window is None else max(0, j * c - window + 1)
            ws.append((j + 1) * c - lo)
        out.append((ws[0], ws[1]))
    return out


def _layer_windows(spec: TransformerShape) -> list[tuple[int | None, int]]:
    """(window or None, how many layers) of the spec."""
    W = spec.sliding_window
    if W <= 0 or W >= spec.seq or spec.sliding_layers == 0:
        return [(None, spec.layers)]
    return [(W, spec.sliding_layers), (None, spec.layers - spec.sliding_layers)]


def computed_keys(spec: TransformerShape, cp: int) -> float:
    """Keys per query one rank computes under CP, averaged over the layers, the busiest rank's (the dense
    convention of ``attended_keys``: the rectangles' pairs counted as a full ``S`` per query counts serial ones)."""
    if cp <= 1:
        return spec.attended_keys()
    total = 0.0
    for window, n in _layer_windows(spec):
        total += n * max(sum(ws) for ws in visible_widths(spec, cp, window))
    return total / spec.layers          # Σ_j c·w_j pairs over 2c queries, counted twice (the dense convention)


def attention_saved_bytes(spec: TransformerShape, gy, mprime, cp: int, act_bytes: int,
                          exchange: str = "all_gather") -> np.ndarray:
    """Bytes one layer's attention saves for backward on one rank under CP, its output (the output projection's
    input ``b·H·d/Gy`` per token) included, averaged over the layers (the busiest rank's):

    - all-gather: per chunk ``j`` the math path's fp32 tensors ``4·n·H_y·(c·d + 2·w_j·d + c·w_j)`` (the scaled
      queries, the scaled keys and the values repeated to the query heads, the probabilities), ``n = m'·cp/S`` the
      sequences; nothing of the gathered block (the math path saves its fp32 copies) nor of the projections;
    - ring: q, k, v (views of the projections' outputs: ``b·(q + 2·kv)`` per token for the GPT's fused QKV, whose
      output they view) and its output and log-sum-exp in the compute dtype (``b·(q + H_y)``; the output
      projection's input is a view of that output)."""
    gy = np.asarray(gy, dtype=np.int64)
    mp = np.asarray(mprime, dtype=float)
    Hy = ceil_div(spec.heads, gy)
    d, q = spec.head_dim, ceil_div(spec.heads, gy) * spec.head_dim
    b = act_bytes
    if exchange == "ring":
        return mp * b * (q + 2 * kv_width(spec, gy) + q + Hy)
    c = spec.seq // (2 * cp)
    per_seq = 0.0
    for window, n in _layer_windows(spec):
        per_seq += n * max(sum(4.0 * (c * d + 2 * w * d + c * w) for w in ws)
                           for ws in visible_widths(spec, cp, window))
    per_seq /= spec.layers                                       # per sequence's share, per local head
    return mp * cp / spec.seq * Hy * per_seq + mp * b * q


def backward_transient_bytes(spec: TransformerShape, gy, mprime, cp: int, exchange: str = "all_gather",
                             act_bytes: int = 4) -> np.ndarray:
    """Bytes live besides the saved set in the backward of CP's attention; 0 without CP.

    - all-gather: the math path's softmax backward holds the gradient of the probabilities and its own output, two
      fp32 ``[n, H/Gy, c, w]`` of the widest chunk (the last: ``w = S`` without a window). Measured: the 8B dry run
      at 131,072 tokens on 1x1x32x2 peaks there (docs/results.md).
    - ring: four score blocks ``[n, H/Gy, c, c]`` in the compute dtype ``act_bytes``: a pair's probabilities and
      their gradient stay live while the next pair's scores and their scaled (masked) copy are made
      (``axgrid/context_parallel/ring.py``'s backward). Measured: the CPU bench's peak
      (experiments/bench/bench_context_parallel.py, docs/results.md) is that allocation."""
    if cp <= 1:
        return np.zeros_like(np.asarray(mprime, dtype=float))
    c = spec.seq // (2 * cp)
    if exchange == "ring":
        n = np.asarray(mprime, dtype=float) * cp / spec.seq
        return 4.0 * act_bytes * n * ceil_div(spec.heads, np.asarray(gy, dtype=np.int64)) * c * c
    widest = max(max(max(ws) for ws in visible_widths(spec, cp, window)) for window, _ in _layer_windows(spec))
    n = np.asarray(mprime, dtype=float) * cp / spec.seq
    return 2 * 4.0 * n * ceil_div(spec.heads, np.asarray(gy, dtype=np.int64)) * c * widest


def serial_attention_saved_bytes(spec: TransformerShape, gy, mprime, act_bytes: int, attention: str = "flash",
                                 math_bytes: int | None = None) -> np.ndarray:
    """What ``perfmodel.memory``'s block activations count for attention without CP (the part CP replaces):
    flash: q, k, v and the output in ``b``, the fp32 log-sum-exp; the math path: q, k, v copies and the
    probabilities in ``math_bytes``, and the output."""
    gy = np.asarray(gy, dtype=np.int64)
    mp = np.asarray(mprime, dtype=float)
    b = act_bytes
    Hy = ceil_div(spec.heads, gy)
    q, kv = Hy * spec.head_dim, kv_width(spec, gy)
    if spec.is_gpt:
        kv = q
    if attention == "flash":
        return mp * (b * (q + 2 * kv) + b * q + 4 * Hy)
    m = math_bytes or b
    keys = spec.seq if spec.is_gpt else spec.attended_keys()
    return mp * (m * (q + 2 * kv) + m * Hy * keys + b * q)


def activation_delta(spec: TransformerShape, gy, mprime, cp: int, act_bytes: int, exchange: str,
                     attention: str = "flash", math_bytes: int | None = None) -> np.ndarray:
    """Bytes one block saves under CP minus what it saves without (0 for ``cp`` = 1): add to
    ``perfmodel.memory``'s block activations."""
    if cp <= 1:
        return np.zeros_like(np.asarray(mprime, dtype=float))
    return (attention_saved_bytes(spec, gy, mprime, cp, act_bytes, exchange)
            - serial_attention_saved_bytes(spec, gy, mprime, act_bytes, attention, math_bytes))


def cp_time(spec: TransformerShape, gy, gz, mprime, cp: int, exchange: str, recompute: bool, dtype: str,
            dtype_bytes: int, machine, rings, z_stride, att_serial: np.ndarray):
    """(attention seconds added to compute, exposed exchange seconds, raw exchange seconds), per micro-batch [N],
    of CP on grids with ``gy``, ``gz`` and ``z_stride`` (rank-number distance of z-neighbours): the attention core
    re-priced (module docstring) minus what ``att_serial`` (one block's forward attention, serial) already
    counts, over forward, backward (twice) and the recompute forward; the exchange over a ring of ``cp`` ranks
    ``z_stride`` apart."""
    from .comm import collective_time, ring_alpha_beta
    from .compute import gemm_rate, memory_time
    mp = np.asarray(mprime, dtype=float)
    n = len(np.atleast_1d(att_serial))
    zeros = np.zeros(n)
    if cp <= 1:
        return zeros, zeros, zeros
    gy = np.asarray(gy, dtype=np.int64)
    L = spec.layers
    passes = 3 + int(recompute)                      # forward, backward (2×), recompute forward, in forwards' units
    keys = computed_keys(spec, cp)
    flops = 4.0 * mp * keys / 2 * spec.attention_width / gy    # the rectangles' pairs, once (module docstring)
    gemm_dtype = "fp32" if exchange == "all_gather" else dtype
    c = spec.seq // (2 * cp)
    batch = np.maximum(mp * cp / spec.seq, 1.0) * spec.heads / gy
    fwd = flops / gemm_rate(c, keys / 2, spec.head_dim, machine, gemm_dtype, batch)
    scores = mp * ceil_div(spec.heads, gy) * keys / 2 * 4.0      # one pass over the fp32 probabilities
    fwd = fwd + memory_time(3 * scores, machine)
    bwd = 2 * (flops / gemm_rate(c, keys / 2, spec.head_dim, machine, gemm_dtype, batch)) + memory_time(5 * scores,
                                                                                                         machine)
    attention = L * (fwd * (1 + int(recompute)) + bwd) - L * passes * att_serial
    a, be, _ = ring_alpha_beta(np.full(n, cp), np.asarray(z_stride) * np.ones(n, dtype=np.int64), machine)
    block = kv_block_bytes(spec, gy, mp, dtype_bytes) * np.ones(n)
    if exchange == "all_gather":
        ag = collective_time("all_gather", np.full(n, cp), cp * block, a, be, machine)
        rs = collective_time("reduce_scatter", np.full(n, cp), cp * block, a, be, machine)
        raw = L * (ag * (1 + int(recompute)) + rs)
        return attention, raw, raw
    step = a + block / be                            # one block to the next rank, all ranks at once
    per_fwd = (cp - 1) * step
    per_bwd = (2 * cp - 1) * step
    raw = L * (per_fwd * (1 + int(recompute)) + per_bwd)
    hide_fwd = np.maximum(per_fwd - fwd * (cp - 1) / cp, 0.0)      # each step's transfer under that step's products
    hide_bwd = np.maximum(per_bwd - bwd * (cp - 1) / cp, 0.0)
    exposed = L * (hide_fwd * (1 + int(recompute)) + hide_bwd)
    return attention, exposed, raw


__all__ = ["EXCHANGES", "check", "sizes", "kv_width", "kv_block_bytes", "step_events", "cp_bytes", "visible_widths",
           "computed_keys", "attention_saved_bytes", "backward_transient_bytes", "serial_attention_saved_bytes", "activation_delta", "cp_time"]
