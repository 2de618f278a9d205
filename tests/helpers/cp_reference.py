"""Context-parallel attention against serial ``torch.nn.functional.scaled_dot_product_attention``, on one rank of a
grid with a context-parallel group (run on every rank by the ``ranks`` fixture; tests/ranks/test_context_parallel.py).

Every rank draws the whole sequences of its context-parallel group (a seed per group, so neighbouring groups hold
different data and a transfer across groups would show), computes serial attention and its gradients on them -- the
reference: SDPA with the key-value heads repeated for GQA, ``is_causal`` or the sliding window's boolean mask, and
rotary embeddings from transformers' Llama at positions ``0..S-1`` -- then its own rows under context parallelism,
rotary at :func:`axgrid.context_parallel.positions`, and returns the largest differences of its rows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AttentionCase:
    grid: str
    cp: int
    batch: int
    kv_heads: int
    group: int               # query heads per key-value head (1: no GQA)
    chunk: int               # tokens per chunk: S = 2·cp·chunk
    head_dim: int
    window: Optional[int]    # sliding window in tokens (None: causal only)
    rotary: bool
    seed: int
    exchange: str = "all_gather"
    order: str = "xyzd"

    @property
    def seq(self) -> int:
        return 2 * self.cp * self.chunk


def _rotary(q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor):
    """transformers' Llama rotary embedding applied to ``q, k [b, H, n, d]`` at ``position_ids [n]``."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    d = q.shape[-1]
    cfg = LlamaConfig(hidden_size=d * q.shape[1], num_attention_heads=q.shape[1], head_dim=d,
                      max_position_embeddings=4096, rope_theta=10000.0)
    cos, sin = LlamaRotaryEmbedding(cfg)(q, position_ids[None].expand(q.shape[0], -1))
    return apply_rotary_pos_emb(q, k, cos, sin)


def serial(case: AttentionCase, q, k, v, dout):
    """Serial attention's output and the gradients of q, k, v (leaves, whole sequences)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    qr, kr = _rotary(q, k, torch.arange(case.seq)) if case.rotary else (q, k)
    kr, vr = kr.repeat_interleave(case.group, dim=1), v.repeat_interleave(case.group, dim=1)
    if case.window is None:
        out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    else:
        i = torch.arange(case.seq)
        mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < case.window)
        out = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def attention_differences(case: AttentionCase, timeout_s: float = 30.0) -> dict[str, float]:
    """On one rank: max |context parallel − serial| of this rank's rows of the output and of dq, dk, dv, and the
    largest magnitude among them (``"scale"``)."""
    import axgrid
    from axgrid.context_parallel import context_parallel_attention, positions, shard
    torch.set_num_threads(1)
    grid = axgrid.init(case.grid, order=case.order, cp=case.cp,
                       config=axgrid.RuntimeConfig(timeout_s=timeout_s, seed=0))
    try:
        group = min(grid.layout.cp_group_of(grid.rank))
        gen = torch.Generator().manual_seed(case.seed * 1000 + group)
        b, s, d, hkv = case.batch, case.seq, case.head_dim, case.kv_heads
        q = torch.randn(b, hkv * case.group, s, d, generator=gen)
        k, v = torch.randn(b, hkv, s, d, generator=gen), torch.randn(b, hkv, s, d, generator=gen)
        dout = torch.randn(b, hkv * case.group, s, d, generator=gen)
        want = serial(case, q, k, v, dout)

        cp, index = grid.size("c"), grid.index("c")
        mine = [shard(t, cp, index, dim=2).requires_grad_() for t in (q, k, v)]
        ql, kl = _rotary(mine[0], mine[1], positions(s, cp, index)) if case.rotary else mine[:2]
        out = context_parallel_attention(ql, kl, mine[2], grid.comm, window=case.window, exchange=case.exchange)
        out.backward(shard(dout, cp, index, dim=2))
        got = (out.detach(), mine[0].grad, mine[1].grad, mine[2].grad)
        diffs = {name: (g - shard(w, cp, index, dim=2)).abs().max().item()
                 for name, g, w in zip(("out", "dq", "dk", "dv"), got, want)}
        diffs["scale"] = max(w.abs().max().item() for w in want)
        diffs["ledger_c_bytes"] = sum(e.bytes for (dim, _), e in grid.ledger.entries.items() if dim == "c")
        return diffs
    finally:
        grid.destroy()


def loss_differences(grid_spec: str, cp: int, seed: int, timeout_s: float = 30.0) -> tuple[float, float, float]:
    """On one rank: the masked mean over whole sequences of per-token losses, under context parallelism
    (:func:`axgrid.context_parallel.whole_sequence_mean` of this rank's chunks) and serially (``torch.mean`` of the
    kept tokens), and the largest difference of the gradient of this rank's per-token losses."""
    import axgrid
    from axgrid.context_parallel import shard, whole_sequence_mean
    grid = axgrid.init(grid_spec, cp=cp, config=axgrid.RuntimeConfig(timeout_s=timeout_s, seed=0))
    try:
        gen = torch.Generator().manual_seed(seed * 1000 + min(grid.layout.cp_group_of(grid.rank)))
        per_token = torch.rand(3, 4 * cp, generator=gen).requires_grad_()
        mask = torch.rand(3, 4 * cp, generator=gen) < 0.5
        mask[0, 0] = True
        want = per_token[mask].mean()
        want.backward()
        index = grid.index("c")
        mine = shard(per_token.detach(), cp, index, dim=1).requires_grad_()
        kept = shard(mask, cp, index, dim=1)
        got = whole_sequence_mean((mine * kept).sum(), kept.sum(), grid.comm)
        got.backward()
        grad_diff = (mine.grad - shard(per_token.grad, cp, index, dim=1)).abs().max().item()
        return float(got), float(want), grad_diff
    finally:
        grid.destroy()
