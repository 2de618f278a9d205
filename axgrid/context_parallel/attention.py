"""Attention over a sequence split among the ranks of the context-parallel group: keys and values all-gathered.

Each rank holds ``2c`` rows of each sequence -- chunks ``r`` and ``2·cp − 1 − r`` (:mod:`.chunks`) -- as queries,
keys and values ``[b, H, 2c, d]`` (rotary already applied at the rows' own positions, :func:`.chunks.positions`).
Forward: one all-gather over ``"c"`` of this rank's keys and values together, ``[2, b, H_kv, 2c, d]`` -> the
whole sequence's ``[2, b, H_kv, S, d]``; then each local chunk attends, with ``scaled_dot_product_attention``, to
the keys it may see: ``[0, end of chunk)`` under the causal mask, trimmed to the last ``window`` positions with a
sliding window. Backward: SDPA's own, then one reduce-scatter over ``"c"`` of the keys' and values' gradients, which
hands each rank the sum, over every rank's queries, of the gradients of its own rows.

GQA: only the ``H_kv`` key-value heads travel; the query heads share them inside SDPA (``enable_gqa``), never
repeated before the transfer. Bytes per layer and rank, forward: ``2·b·S·H_kv·d`` elements gathered (of which
``(cp−1)/cp`` arrive over the wire); backward the same in the reduce-scatter.

Why an all-gather of K/V and not a ring (as Llama 3's training chose, Dubey et al. 2024, "The Llama 3 Herd of Models"
§3.3.2): with GQA the keys and values are ``H/H_kv`` times smaller than the queries, so gathering them whole costs
little next to attention's compute at long sequences; any mask (causal, sliding window, and later documents) is a
plain SDPA mask on the gathered keys, with no per-step mask bookkeeping; and each chunk's softmax sees all its keys in
one call, so forward and backward equal serial attention within round-off without merging partial results by their
log-sum-exp. What it gives up: a ring overlaps each step's transfer with the previous block's compute and holds only
two key-value blocks at a time, where this holds the sequence's keys and values for one layer (saved for the
backward), and the gather here is not overlapped with compute: ``exchange="ring"`` (:mod:`.ring`) is that other
way, the same result within round-off.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..core.comm import Communicator
from .chunks import chunk_ids, unshard
from .ring import ring_attention

#: The two ways keys and values reach the other ranks: one all-gather (here), or passed around a ring (:mod:`.ring`).
EXCHANGES = ("all_gather", "ring")


class _GatherKeysValues(torch.autograd.Function):
    """``kv [2, b, H_kv, 2c, d]`` -> every member's, stacked in group order ``[cp, 2, b, H_kv, 2c, d]``;
    backward: the gradient's reduce-scatter over the group (this rank's rows, summed over all members' uses)."""

    @staticmethod
    def forward(ctx, kv: torch.Tensor, comm: Communicator, dim: str) -> torch.Tensor:  # type: ignore[override]
        ctx.comm, ctx.dim = comm, dim
        return comm.all_gather(kv, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return ctx.comm.reduce_scatter(grad.contiguous(), ctx.dim)[0], None, None


def visible_keys(chunk: int, c: int, window: Optional[int]) -> tuple[int, int]:
    """The key positions ``[lo, hi)`` that queries of chunk ``chunk`` (positions ``[chunk·c, (chunk+1)·c)``) may see:
    up to their own position, and with a ``window`` only the ``window`` latest (a query sees itself and the
    ``window − 1`` positions before it, transformers' ``sliding_window``)."""
    lo, hi = 0, (chunk + 1) * c
    if window is not None:
        lo = max(0, chunk * c - window + 1)
    return lo, hi


def chunk_mask(chunk: int, c: int, window: Optional[int], device: torch.device) -> torch.Tensor:
    """``[c, hi − lo]`` bool, True where a query of chunk ``chunk`` attends to a key of :func:`visible_keys`."""
    lo, hi = visible_keys(chunk, c, window)
    q = torch.arange(chunk * c, (chunk + 1) * c, device=device)[:, None]
    k = torch.arange(lo, hi, device=device)[None, :]
    mask = k <= q
    if window is not None:
        mask &= q - k < window
    return mask


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Communicator, *,
                               window: Optional[int] = None, scale: Optional[float] = None,
                               dim: str = "c", exchange: str = "all_gather") -> torch.Tensor:
    """Causal attention of this rank's rows over the whole sequence split along the group ``dim`` of ``comm``.

    ``q [b, H, 2c, d]``, ``k, v [b, H_kv, 2c, d]`` (``H_kv`` divides ``H``): this rank's chunks ``r`` and
    ``2·cp − 1 − r`` of each sequence, in that order. ``window``: a sliding window (None: the whole causal past).
    ``scale``: SDPA's (None: ``1/√d``). ``exchange``: ``"all_gather"`` (this module) or ``"ring"``
    (:mod:`.ring`: transfers overlapped, two key-value blocks held). Returns ``[b, H, 2c, d]``, this rank's rows of
    serial causal attention.
    """
    if exchange not in EXCHANGES:
        raise ValueError(f"context_parallel_attention: exchange={exchange!r}; choose one of {list(EXCHANGES)}")
    if q.dim() != 4 or k.shape != v.shape or k.shape[:1] + k.shape[2:] != q.shape[:1] + q.shape[2:3] + k.shape[3:]:
        raise ValueError(f"context_parallel_attention: q {tuple(q.shape)} must be [b, H, 2c, d] and k, v "
                         f"{tuple(k.shape)}, {tuple(v.shape)} [b, H_kv, 2c, d] with the same b and 2c")
    heads, kv_heads, rows = q.shape[1], k.shape[1], q.shape[2]
    if heads % kv_heads or rows % 2:
        raise ValueError(f"context_parallel_attention: {heads} query heads over {kv_heads} key-value heads and "
                         f"{rows} rows per rank: H_kv must divide H and the rows be two equal chunks")
    if window is not None and window < 1:
        raise ValueError(f"sliding window {window} must be >= 1 token (None: no window)")
    if exchange == "ring":
        return ring_attention(q, k, v, comm, window=window, scale=scale, dim=dim)
    cp, index, c = comm.size(dim), comm.indices[dim], rows // 2
    gathered = _GatherKeysValues.apply(torch.stack([k, v]), comm, dim)          # [cp, 2, b, H_kv, 2c, d]
    keys, values = unshard(gathered, dim=3).unbind(0)                           # [b, H_kv, S, d] each
    outs = []
    for half, chunk in enumerate(chunk_ids(cp, index)):
        lo, hi = visible_keys(chunk, c, window)
        outs.append(F.scaled_dot_product_attention(
            q[:, :, half * c:(half + 1) * c], keys[:, :, lo:hi], values[:, :, lo:hi],
            attn_mask=chunk_mask(chunk, c, window, q.device), scale=scale, enable_gqa=heads != kv_heads))
    return torch.cat(outs, dim=2)
