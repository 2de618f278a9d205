"""Picking the next token from vocabulary-parallel logits, without any rank holding a full row of logits.

Input: this rank's ``scores [b, V/Gy]`` -- its sequences, its slice ``[y·V/Gy, (y+1)·V/Gy)`` of the vocabulary (the
output layout of the LM head, replicated over x).

- :func:`vocab_parallel_argmax`: local maximum and its index, then one ``all_gather`` over y of ``[b, 2]``
  (value, global index); every member picks the largest value, ties to the lowest global index (the lowest y
  whose slice holds the maximum, and inside a slice ``torch.argmax``'s first index), as ``torch.argmax`` over the
  whole row does.
- :func:`vocab_parallel_top_k_floor`: the k-th largest logit of each row from the local top-k candidates,
  one ``all_gather`` over y of ``[b, min(k, V/Gy)]``; logits below it are dropped (as ``transformers``' top-k:
  ties at the k-th value are kept).
- :func:`gumbel_noise`: sampling by the Gumbel-max trick, ``argmax(logits/T + G)`` with ``G`` standard Gumbel
  noise, is a draw from ``softmax(logits/T)`` (restricted to the kept logits), and it reuses the argmax above.
  The noise of step t is drawn for the whole ``[B, V]`` batch from one generator seeded with the same ``seed`` on
  every rank, and each rank keeps its rows and vocabulary slice: every rank of a block picks the same token, and
  the tokens do not depend on the grid (only on the seed and the logits).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..core.grid import Grid


def vocab_parallel_argmax(scores: torch.Tensor, grid: Grid, dim: Optional[str] = "y") -> torch.Tensor:
    """The global index ``[b]`` (int64) of each row's maximum of vocabulary-split ``scores [b, V/G_dim]``
    (``dim=None``: the rows are whole; no collective)."""
    v_loc = scores.shape[-1]
    idx = scores.argmax(dim=-1)                                               # first maximum of the slice
    val = scores.gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    if dim is None or grid.size(dim) == 1:
        return idx
    pair = torch.stack([val.double(), (idx + grid.index(dim) * v_loc).double()], dim=-1)   # [b, 2], exact
    every = grid.comm.all_gather(pair, dim)                                   # [G_dim, b, 2] in y order
    best = every[..., 0].argmax(dim=0)                                        # lowest y holding the maximum
    return every[..., 1].gather(0, best.unsqueeze(0)).squeeze(0).long()


def vocab_parallel_top_k_floor(logits: torch.Tensor, k: int, grid: Grid, dim: Optional[str] = "y") -> torch.Tensor:
    """The ``k``-th largest value ``[b, 1]`` of each row of vocabulary-split ``logits [b, V/G_dim]`` (the whole
    row's, ``k`` clamped to the vocabulary; ``dim=None``: the rows are whole, no collective)."""
    v_loc = logits.shape[-1]
    if dim is None:
        return logits.topk(min(k, v_loc), dim=-1).values[:, -1:]
    k = min(k, v_loc * grid.size(dim))
    local = logits.topk(min(k, v_loc), dim=-1).values                         # [b, k_loc]: the candidates
    every = grid.comm.all_gather(local, dim)                                  # [G_dim, b, k_loc]
    candidates = every.permute(1, 0, 2).reshape(logits.shape[0], -1)          # [b, G_dim·k_loc]
    return candidates.topk(k, dim=-1).values[:, -1:]


def gumbel_noise(gen: torch.Generator, batch: int, vocab: int, rows: slice, cols: slice,
                 device: torch.device) -> torch.Tensor:
    """This rank's part ``[rows, cols]`` of one step's standard Gumbel noise ``[batch, vocab]`` (fp32)."""
    e = torch.empty(batch, vocab, device=device).exponential_(generator=gen)   # -log(E) is Gumbel
    return -e[rows, cols].log()


__all__ = ["vocab_parallel_argmax", "vocab_parallel_top_k_floor", "gumbel_noise"]
