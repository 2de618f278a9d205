"""Per-GPU memory in bytes, vectorised over grids and micro-batch sizes.

static:  every weight shard (padded block / Gz) × (param + grad + optimizer bytes); biases (split over x or y,
         replicated over z) likewise; the 2L+1 layer norms' weight and bias [h/Gx] each and the embedding tables
         (token [V, h/Gx] and position [S, h/Gx]: all rows, features over x, replicated over y, z and d, as
         ``axgrid.nn.Embedding`` holds them), each with its gradient and optimizer state.
         Optimizer = AdamW: fp32 master + 2 fp32 moments (12 B) for bf16/fp16; 2 moments (8 B) for fp32.
         zero1_over_d divides the optimizer bytes by Gd (Megatron's distributed optimizer).
buffers: gathered weight blocks: current + (prefetched, OAG) in forward; gathered W + full dW (+ one in flight,
         ORS) in backward; with recompute the 4 gathered blocks of the block being recomputed; with
         keep_gathered every layer's gathered block; plus the dense fp32 gradient of the token table
         [V, h/Gx] that the embedding's backward builds and all-reduces over z.
activations (flash-style attention, no S×S tensor stored), per token per block with m' tokens per GPU:
         4h/Gx (block input, LN1 out, residual, LN2 out) + 12h/Gy (QKV out 3h, attention out h, MLP-up out 4h,
         GELU out 4h); with recompute only the block input h/Gx per block plus one block's full set;
         plus logits m'·V/Gy·(b + 4) and 2 activation-gradient buffers m'·4h/Gy·b.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from axgrid.spec import ceil_div

from .comm import layer_volumes
from .spec import Options, TransformerSpec


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU by component (float arrays [N])."""

    static: np.ndarray
    buffers: np.ndarray
    activations: np.ndarray
    total: np.ndarray


def bytes_per_param(dtype_bytes: int, fp32: bool) -> tuple[int, int]:
    """(param + grad bytes, optimizer bytes) per stored parameter element."""
    return 2 * dtype_bytes, (8 if fp32 else 12)


def memory_per_gpu(spec: TransformerSpec, gx, gy, gz, gd, mprime, dtype_bytes: int, fp32: bool,
                   opt: Options, inflight=1.0, seq_split=1) -> Memory:
    """Memory per GPU with ``mprime`` tokens per GPU per micro-batch (all arguments broadcast).

    Pipeline stages (``perfmodel.pipeline``): ``inflight`` micro-batches keep their stored activations alive at
    once (1F1B: up to the pipeline depth on the first stage); ``seq_split`` > 1 is sequence parallelism, which
    splits the h/Gx activations (block input, layer-norm outputs, residual) that many ways as well."""
    gx, gy, gz, gd = (np.asarray(a, dtype=np.int64) for a in (gx, gy, gz, gd))
    mp = np.asarray(mprime, dtype=float)
    inflight, seq_split = np.asarray(inflight, dtype=float), np.asarray(seq_split, dtype=float)
    h, L, V, S = spec.hidden, spec.layers, spec.vocab, spec.seq
    b = dtype_bytes
    pg, optb = bytes_per_param(b, fp32)
    vols = [layer_volumes(layer, gx, gy, gz, 1) for layer in spec.block_layers()]
    head = layer_volumes(spec.head_layer(), gx, gy, gz, 1)
    hx = ceil_div(h, gx)
    shard = L * sum(v.shard for v in vols) + head.shard
    small = L * sum(v.bias_loc for v in vols) + (2 * L + 1) * 2 * hx   # biases + layer norms, replicated over z
    small = small + (V + S) * hx                                        # embedding tables, replicated over y, z
    elems = (shard + small).astype(float)
    opt_div = gd if opt.zero1_over_d else 1
    static = elems * pg + elems * optb / opt_div

    max_block = np.maximum.reduce([v.padded for v in vols] + [head.padded]).astype(float)
    n_buf = 2 + int(opt.overlap_ag) + int(opt.overlap_rs)
    buffers = max_block * b * n_buf
    if opt.keep_gathered:
        buffers = buffers + (L * sum(v.padded for v in vols) + head.padded) * float(b)
    elif opt.recompute:
        buffers = buffers + sum(v.padded for v in vols) * float(b)
    buffers = buffers + (V * hx).astype(float) * 4.0

    full_block = 4.0 * h / (gx * seq_split) + 12.0 * h / gy
    if opt.recompute:
        act = mp * b * (inflight * L * h / (gx * seq_split) + full_block)
    else:
        act = mp * b * inflight * L * full_block
    act = act + mp * ceil_div(V, gy) * (b + 4) + 2 * mp * 4.0 * h / gy * b
    buffers = np.broadcast_to(buffers, act.shape).astype(float)
    static = np.broadcast_to(static, act.shape).astype(float)
    return Memory(static, buffers, act, static + buffers + act)
