"""GEMM time: a roofline (peak × efficiency). Efficiency comes from a measured table (nearest measured shape in
log space, as written by ``python -m axgrid.kernels export-efficiency``) or from a saturating curve of the smallest GEMM
dimension, eff = eff_max · d / (d + dim_half): per dtype from the machine file's ``gemm_efficiency`` (measured
large-GEMM rates of that GPU), else the two parameters calibration fits (default 0.75, 96); on a machine file with
``sm_count``, times the useful share of the compute units with the best of its ``gemm_tiles`` (tile and wave
quantisation, each tile's operand streaming from L2: ``wave_efficiency``).
Operand layouts are not modelled: the runtime's layout tuner picks the best layout per shape, and no per-layout
table is held for any shipped GPU.

Element-wise time: the bytes a block's memory-bound kernels (layer norms, residual adds, bias + GELU, dropout,
an unfused attention's S×S scores) move through HBM (``elementwise_bytes``, the one formula both the 4D grids and
the TP×PP×DP stages use) at the machine file's ``hbm_bandwidth`` (``memory_time``); not priced on a machine
without that figure."""
from __future__ import annotations

import numpy as np

from .machines import Machine


def curve_efficiency(m, n, k, eff_max: float, dim_half: float) -> np.ndarray:
    """Default efficiency curve in (0, eff_max]: small dimensions starve the GPU."""
    d = np.minimum(np.minimum(np.asarray(m, float), np.asarray(n, float)), np.asarray(k, float))
    return eff_max * d / (d + dim_half)


def _table_rate(m, n, k, machine: Machine, dtype: str) -> np.ndarray | None:
    rows = [g for g in machine.gemm_table if g.dtype == dtype]
    if not rows:
        return None
    t = np.log(np.array([[g.m, g.n, g.k] for g in rows], dtype=float))
    rate = np.array([g.flops_per_s for g in rows], dtype=float)
    m, n, k = np.broadcast_arrays(np.asarray(m, float), np.asarray(n, float), np.asarray(k, float))
    q = np.log(np.maximum(np.stack([m.ravel(), n.ravel(), k.ravel()], axis=1), 1.0))
    # nearest measured shape; chunk to bound memory for big queries
    best = np.empty(q.shape[0], dtype=np.int64)
    for s in range(0, q.shape[0], 4096):
        d = ((q[s:s + 4096, None, :] - t[None, :, :]) ** 2).sum(-1)
        best[s:s + 4096] = d.argmin(1)
    return rate[best].reshape(m.shape)


def tile_efficiency(tile: tuple[int, int], machine: Machine, dtype: str) -> float:
    """The share of a compute unit's peak that a GEMM kernel with a ``tile`` = (rows, columns) output tile keeps
    while its operands stream from the L2 cache: each k-step loads rows + columns operand vectors for rows·columns
    multiply-adds, 2·r·c / ((r + c)·bytes) FLOPs per byte, against the ``peak_flops / l2_bandwidth`` FLOPs per byte
    the machine needs to stay compute-bound (a roofline per tile); 1 without ``l2_bandwidth``."""
    if machine.l2_bandwidth <= 0:
        return 1.0
    r, c = tile
    per_byte = 2.0 * r * c / ((r + c) * (4.0 if dtype == "fp32" else 2.0))
    return min(1.0, per_byte * machine.l2_bandwidth / machine.peak_flops(dtype))


def wave_efficiency(m, n, machine: Machine, batch=1, dtype: str = "bf16") -> np.ndarray:
    """The share of the GPU's ``sm_count`` compute units doing useful work over a GEMM with an [m, n] output
    (``batch`` of them at once), with the best of the machine's ``gemm_tiles`` (as cuBLAS's heuristics pick a
    kernel per shape): with an r×c tile the GEMM runs in waves = ceil(tiles / SMs), tiles = ceil(m/r)·ceil(n/c)
    per GEMM, each unit busy ``tile_efficiency`` of its time, so the useful share is m·n·batch / (waves·SMs·r·c)
    times the tile's efficiency (the last wave's idle units and a partial tile's padding are lost); 1 on a machine
    without ``sm_count``."""
    m, n, batch = (np.asarray(a, float) for a in (m, n, batch))
    if not machine.sm_count:
        return np.ones(np.broadcast_shapes(m.shape, n.shape, batch.shape))
    best = None
    for r, c in machine.gemm_tiles:
        waves = np.ceil(np.ceil(m / r) * np.ceil(n / c) * batch / machine.sm_count)
        useful = m * n * batch / (np.maximum(waves, 1.0) * machine.sm_count * r * c)
        eff = useful * tile_efficiency((r, c), machine, dtype)
        best = eff if best is None else np.maximum(best, eff)
    return best


def gemm_rate(m, n, k, machine: Machine, dtype: str, batch=1) -> np.ndarray:
    """Achieved FLOP/s of an [m,k]·[k,n] GEMM, ``batch`` of them in one kernel (never above the machine's peak):
    the measured table, or the efficiency curve times the useful share of the compute units
    (:func:`wave_efficiency`)."""
    peak = machine.peak_flops(dtype)
    rate = _table_rate(m, n, k, machine, dtype)
    if rate is None:
        c = machine.gemm_curve(dtype)
        return peak * curve_efficiency(m, n, k, c.eff_max, c.dim_half) * wave_efficiency(m, n, machine, batch,
                                                                                        dtype)
    return np.minimum(rate, peak)


def gemm_time(m, n, k, machine: Machine, dtype: str) -> np.ndarray:
    """Seconds for 2·m·n·k FLOPs at the achieved rate; 0 when any dimension is 0."""
    m, n, k = (np.asarray(a, float) for a in (m, n, k))
    flops = 2.0 * m * n * k
    return np.where(flops > 0, flops / gemm_rate(np.maximum(m, 1), np.maximum(n, 1), np.maximum(k, 1),
                                                  machine, dtype), 0.0)


def elementwise_bytes(tokens, width, ffn_width, heads, seq: float, dtype_bytes: int, dropout: bool,
                      fused_attention: bool, norms: int = 2, gated: bool = False,
                      rope_width=0.0, eager: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """HBM bytes one block's forward moves through its element-wise (memory-bound) kernels on one rank, per
    micro-batch: (token-wise kernels, attention-score kernels). Per rank: ``tokens`` rows of the residual stream,
    each ``width`` wide there (the 4D runtime: [m', h/Gx]; Megatron: [mbs·S, h], [mbs·S/TP, h] with sequence
    parallel), the MLP's hidden ``ffn_width`` wide ([·, 4h/Gy] or [·, 4h/TP]), ``heads`` attention heads
    ([·, H/Gy]), activations of ``dtype_bytes``:

    * ``norms`` norms (the GPT's and Llama's two, Gemma 3's four), each reads and writes the stream: 2·b per
      element of [tokens, width] for a fused kernel (the GPT's ``F.layer_norm``, Megatron's); ``eager`` (a Hugging
      Face or torchtitan RMSNorm run op by op, as the 4D runtime's plans run it): the input cast to fp32 (b + 4),
      squared (8), its mean read (4), scaled by the reciprocal root (8), cast back (4 + b), times the weight (2·b):
      28 + 4·b;
    * two residual adds (x + proj, x + down), each reads two and writes one: 6·b, and with ``dropout`` (Megatron's
      fused bias-dropout-add) a 1-byte mask written: +2;
    * bias + GELU reads and writes the MLP hidden: 2·b per element of [tokens, ffn_width]; a ``gated`` MLP
      (SwiGLU, GeGLU) reads the gate's and the up projection's outputs and writes their product: 3·b fused,
      ``eager`` the activation (2·b) then the product (3·b): 5·b;
    * rotary positions (the decoders') read and write q and k: 4·b per element of [tokens, ``rope_width``]
      (the local heads' and key-value heads' features; 0 for the GPT's learned positions);
    * without a fused (flash-style) attention, per score of [tokens/S sequences, heads, S, S]: QKᵀ writes it,
      scale-mask-softmax reads and writes it, ·V reads it: 4·b, and with ``dropout`` dropout reads and writes it
      and writes a 1-byte mask: +2·b + 1. Flash-style attention keeps the scores on chip: 0.

    The backward moves about twice the forward's bytes (each kernel reads its saved input and the incoming
    gradient and writes the gradient); a recompute forward moves the forward's again (``model.evaluate``)."""
    b = float(dtype_bytes)
    tokens = np.asarray(tokens, float)
    norm = (28 + 4 * b) if eager else 2 * b
    stream = tokens * np.asarray(width, float) * (norms * norm + 2 * (3 * b + (1 if dropout else 0)))
    mlp = tokens * np.asarray(ffn_width, float) * ((5 if eager else 3) if gated else 2) * b
    if np.any(np.asarray(rope_width) > 0):
        mlp = mlp + tokens * np.asarray(rope_width, float) * 4 * b
    per_score = 0.0 if fused_attention else 4 * b + ((2 * b + 1) if dropout else 0)
    scores = tokens * seq * np.asarray(heads, float) * per_score
    return stream + mlp, scores


def memory_time(nbytes, machine: Machine) -> np.ndarray:
    """Seconds to move ``nbytes`` through the GPU's HBM at the machine's ``hbm_bandwidth``; 0 where the machine
    file has no figure (the element-wise term is then not priced; ``Machine.elementwise_note`` says so)."""
    nbytes = np.asarray(nbytes, float)
    return nbytes / machine.hbm_bandwidth if machine.hbm_bandwidth > 0 else np.zeros_like(nbytes)


#: Kernels one block's forward launches (each adds ``Machine.kernel_latency``), as Megatron-LM's GPT layer runs
#: them: layer norm, QKV GEMM, QKᵀ, scale-mask-softmax, dropout, ·V, the context's copy to [s, b, h], the
#: attention-out GEMM, bias-dropout-add, layer norm, MLP-up GEMM, bias-GELU, MLP-down GEMM, bias-dropout-add (14);
#: with a fused (flash-style) attention and no dropout, QKᵀ/softmax/dropout/·V are one kernel (11). The backward
#: launches twice as many (each GEMM's data and weight gradients; each element-wise kernel's backward and its bias
#: or weight-gradient reduction).
BLOCK_KERNELS_UNFUSED = 14
BLOCK_KERNELS_FUSED = 11
#: Kernels one decoder layer's forward launches besides its FC layers' GEMMs (``len(block_layers)``: 7 for the
#: Llama structure, 4 for Phi-3's fused ones): its norms (``block_norms``), rotary positions on q and on k (2),
#: the fused attention (1), the gated activation (1), the two residual adds (2); unfused attention: 3 more.
DECODER_KERNELS_BESIDES_NORMS = 6
#: Kernels of the rest of a micro-batch's forward: the embedding lookup, position add and dropout, the final layer
#: norm, the head GEMM and the vocabulary-parallel cross entropy (cast, max, subtract, exp, sum, log, gather, mean);
#: the backward twice as many.
OUTER_KERNELS = 13
#: HBM bytes the optimizer step moves per parameter it updates. Megatron-LM's fp16/bf16 mixed precision
#: ("megatron"): copy the gradients to fp32 (read 2, write 4), unscale and check for inf (read 4, write 4, read 4),
#: the clipping's norm (read 4), Adam (read gradient, master weight, two moments: 16; write weight and moments: 12),
#: copy the master weights to the 16-bit model (read 4, write 2): 56. The 4D runtime ("axgrid", fp32 weights, fused
#: AdamW): the clipping's norm (4), AdamW (28), zeroing the gradients (4): 36.
OPTIMIZER_BYTES = {"megatron": 56.0, "axgrid": 36.0}
#: HBM bytes per logit of the vocabulary-parallel cross entropy (Megatron-LM: the logits cast to fp32, max,
#: subtract, exp, sum, divide, and in the backward softmax − one-hot, scaled, cast back): forward 2 + 4 + 4 + 4 + 4
#: + 4 + 4 + 4 = 30, backward 4 + 4 + 4 + 4 + 4 + 2 = 22.
CROSS_ENTROPY_BYTES = 52.0
