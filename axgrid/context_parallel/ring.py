"""Attention over the context-parallel group with keys and values passed around a ring, transfers overlapped.

The same rows per rank as :mod:`.attention` (chunks ``r`` and ``2·cp − 1 − r``), the same result within round-off,
a different exchange: in ``cp`` steps each rank's key-value block ``[2, b, H_kv, 2c, d]`` travels once around the
group (to ``r + 1``, from ``r − 1``). While step ``i`` attends to the block it holds, the block for step ``i + 1`` is
already on the wire (:meth:`~axgrid.core.comm.Communicator.send` / ``recv`` posted asynchronously, ledger ops
``send``/``recv`` over ``"c"``). Each step's partial result is merged into the running one by its log-sum-exp
(the online softmax), so only two key-value blocks are held at a time, never the whole sequence's.

Causal balance, step by step: with ``o`` the owner of the block held, of the four chunk pairs (query chunk, key
chunk) one is always fully visible (``2cp−1−r`` against ``o``), one never (``r`` against ``2cp−1−o``), and of
the other two exactly one is visible (``r`` against ``o`` when ``o < r``, ``2cp−1−r`` against ``2cp−1−o`` when
``o > r``); step 0 (its own block) computes two causal diagonals and the full pair. So every rank computes ``2c²``
query-key pairs per step, head and sequence -- the same on all ranks. A sliding window skips pairs it hides.

Backward (a custom autograd function; nothing of the blocks is saved but the final log-sum-exp): the key-value blocks
travel the ring again, each with the gradient of its keys and values summed so far, which after ``cp`` steps reaches
its owner; the gradient's transfer of step ``i`` is hidden under step ``i + 1``'s compute.
Per layer and rank the ring sends ``(cp − 1)`` blocks forward and ``(cp − 1)`` blocks plus ``cp`` gradient blocks
backward, what the all-gather and the reduce-scatter move on the wire, in ``cp − 1`` steps each.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..core.comm import Communicator
from .chunks import chunk_ids

_KV, _GRAD = 0, 1      # message tags: key-value blocks, their gradients


def _pair_mask(q_chunk: int, k_chunk: int, c: int, window: Optional[int],
               device: torch.device) -> Optional[torch.Tensor]:
    """``[c, c]`` bool mask of query chunk against key chunk, None when all visible; a mask with no True when
    nothing is (the caller skips the pair)."""
    q = torch.arange(q_chunk * c, (q_chunk + 1) * c, device=device)[:, None]
    k = torch.arange(k_chunk * c, (k_chunk + 1) * c, device=device)[None, :]
    mask = k <= q
    if window is not None:
        mask = mask & (q - k < window)
    return None if bool(mask.all()) else mask


def _pairs(mine: tuple[int, int], theirs: tuple[int, int], c: int, window: Optional[int], device: torch.device):
    """``(query half, key half, mask or None)`` of every pair with something visible."""
    out = []
    for qh, qc in enumerate(mine):
        for kh, kc in enumerate(theirs):
            mask = _pair_mask(qc, kc, c, window, device)
            if mask is None or bool(mask.any()):
                out.append((qh, kh, mask))
    return out


def _scores(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """``q [b, H_kv, g, c, d]`` against ``k [b, H_kv, c, d]``: ``[b, H_kv, g, c, c]``, hidden pairs -inf."""
    s = (q @ k.unsqueeze(2).transpose(-1, -2)) * scale
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


class _Shift:
    """One ring step's exchange: ``t`` to the next member, the previous member's into a new buffer; ``wait()``
    returns what arrived (after this rank's own send is done too)."""

    def __init__(self, t: torch.Tensor, comm: Communicator, dim: str, tag: int) -> None:
        cp, r = comm.size(dim), comm.indices[dim]
        self.into = torch.empty_like(t)
        self.sent = comm.send(t, dim, (r + 1) % cp, async_op=True, tag=tag)
        self.got = comm.recv(self.into, dim, (r - 1) % cp, async_op=True, tag=tag)

    def wait(self) -> torch.Tensor:
        self.sent.wait()
        return self.got.wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Communicator, dim: str,
                window: Optional[int], scale: float) -> torch.Tensor:  # type: ignore[override]
        b, heads, rows, d = q.shape
        kvh = k.shape[1]
        cp, r, c = comm.size(dim), comm.indices[dim], rows // 2
        qg = q.reshape(b, kvh, heads // kvh, rows, d)
        out = torch.zeros_like(qg)
        lse = torch.full(qg.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        held = torch.stack([k, v]).contiguous()                       # [2, b, H_kv, 2c, d]
        for step in range(cp):
            shift = _Shift(held, comm, dim, _KV) if step < cp - 1 else None
            for qh, kh, mask in _pairs(chunk_ids(cp, r), chunk_ids(cp, (r - step) % cp), c, window, q.device):
                rows_q = slice(qh * c, (qh + 1) * c)
                kb, vb = held[0][:, :, kh * c:(kh + 1) * c], held[1][:, :, kh * c:(kh + 1) * c]
                s = _scores(qg[:, :, :, rows_q], kb, mask, scale)
                blk = torch.logsumexp(s, dim=-1)                        # -inf where a row sees nothing here
                blk_out = torch.exp(s - torch.where(blk.isinf(), 0.0, blk).unsqueeze(-1)) @ vb.unsqueeze(2)
                old = lse[:, :, :, rows_q]
                new = torch.logaddexp(old, blk)
                safe = torch.where(new.isinf(), 0.0, new)
                out[:, :, :, rows_q] = (out[:, :, :, rows_q] * torch.exp(old - safe).unsqueeze(-1)
                                        + blk_out * torch.exp(blk - safe).unsqueeze(-1))
                lse[:, :, :, rows_q] = new
            if shift is not None:
                held = shift.wait()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm, ctx.dim, ctx.window, ctx.scale = comm, dim, window, scale
        return out.reshape(b, heads, rows, d)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        comm, dim, window, scale = ctx.comm, ctx.dim, ctx.window, ctx.scale
        b, heads, rows, d = q.shape
        kvh = k.shape[1]
        cp, r, c = comm.size(dim), comm.indices[dim], rows // 2
        qg = q.reshape(b, kvh, heads // kvh, rows, d)
        dog = grad_out.reshape(qg.shape)
        delta = (dog * out).sum(-1)                                    # [b, H_kv, g, 2c]
        dq = torch.zeros_like(qg)
        held = torch.stack([k, v]).contiguous()
        coming: Optional[_Shift] = None                                # the gradient of the block held, so far
        for step in range(cp):
            shift = _Shift(held, comm, dim, _KV) if step < cp - 1 else None
            dkv = torch.zeros_like(held)
            for qh, kh, mask in _pairs(chunk_ids(cp, r), chunk_ids(cp, (r - step) % cp), c, window, q.device):
                rows_q, rows_k = slice(qh * c, (qh + 1) * c), slice(kh * c, (kh + 1) * c)
                kb, vb = held[0][:, :, rows_k], held[1][:, :, rows_k]
                qb, dob = qg[:, :, :, rows_q], dog[:, :, :, rows_q]
                p = torch.exp(_scores(qb, kb, mask, scale) - lse[:, :, :, rows_q].unsqueeze(-1))
                dkv[1][:, :, rows_k] += (p.transpose(-1, -2) @ dob).sum(2)
                ds = p * (dob @ vb.unsqueeze(2).transpose(-1, -2) - delta[:, :, :, rows_q].unsqueeze(-1))
                dq[:, :, :, rows_q] += (ds @ kb.unsqueeze(2)) * scale
                dkv[0][:, :, rows_k] += (ds.transpose(-1, -2) @ qb).sum(2) * scale
            if coming is not None:
                dkv += coming.wait()
            coming = _Shift(dkv, comm, dim, _GRAD) if cp > 1 else None
            if shift is not None:
                held = shift.wait()
        dkv = coming.wait() if coming is not None else dkv              # my own block's, from every rank
        return dq.reshape(b, heads, rows, d), dkv[0], dkv[1], None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Communicator, *,
                   window: Optional[int] = None, scale: Optional[float] = None, dim: str = "c") -> torch.Tensor:
    """:func:`~axgrid.context_parallel.attention.context_parallel_attention`'s result (shapes, rows, ``window``,
    ``scale`` alike) with the key-value blocks passed around the ring (module docstring)."""
    return _RingAttention.apply(q, k, v, comm, dim, window, scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
