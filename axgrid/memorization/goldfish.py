"""Goldfish loss: leave some target tokens out of the loss so that a model cannot reproduce a passage verbatim.

Two ways to choose the dropped targets of ``inputs [B, S]`` (target ``t`` is the token that follows input
position ``t``; the mask is over target positions, shape ``[B, S]``, 1 = kept, 0 = dropped):

- ``"static"``: every k-th target of each sequence is dropped (positions ``k-1, 2k-1, ...``). Simple, but the
  mask depends on where a passage sits in the sequence.
- ``"hash"``: target ``t`` is dropped when a hash of the ``h`` input tokens ending at position ``t`` (the ``h``
  tokens that precede the target) falls below ``1/k``. The mask depends only on the text, so a passage gets the
  same mask wherever it appears (another batch, another offset, another run). The first ``h - 1`` positions of
  a sequence have no full context and are never dropped.

The loss is then averaged over kept targets only. With data parallelism and micro-batches the average must be
over the kept targets of the whole step, not per rank: :func:`kept_count` of the global batch (every rank can
compute it when every rank sees the global batch), passed to ``GPT.forward(..., normalizer=kept / Gd)``;
:func:`step_mask` returns both, for every trainer (train_gpt, finetune, the memorization study).

The hash is 32-bit, vectorised and platform independent: Murmur3's finaliser over the token ids combined in
order with a seed, so ``seed`` selects a different (but equally fixed) mask family.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch

from ..device import host_read
from ..nn.init import _fmix32, _mul32

Mode = Literal["static", "hash"]
_M32 = 0xFFFFFFFF


def _check(k: int, h: int, mode: str) -> None:
    if not isinstance(k, int) or k < 2:
        raise ValueError(f"goldfish k={k!r} must be an integer >= 2 (one target in k is dropped); k=1 drops all")
    if not isinstance(h, int) or h < 1:
        raise ValueError(f"goldfish h={h!r} (context length of the hash) must be an integer >= 1")
    if mode not in ("static", "hash"):
        raise ValueError(f"goldfish mode={mode!r}; choose 'static' or 'hash'")


def context_hash(inputs: torch.Tensor, h: int, seed: int = 0) -> torch.Tensor:
    """32-bit hash (int64 values in [0, 2^32)) of each window of ``h`` consecutive ids along the last dimension.

    ``inputs [..., S]`` -> ``[..., S - h + 1]``: entry ``j`` hashes ``inputs[..., j : j + h]``.
    """
    if inputs.shape[-1] < h:
        return torch.zeros((*inputs.shape[:-1], 0), dtype=torch.int64, device=inputs.device)
    ids = inputs.long() & _M32
    n = inputs.shape[-1] - h + 1
    acc = torch.full((*inputs.shape[:-1], n), host_read(_fmix32(torch.tensor(seed & _M32))), dtype=torch.int64,
                     device=inputs.device)
    for j in range(h):
        acc = _fmix32(_mul32(acc, 0x01000193) ^ _fmix32(ids[..., j:j + n] ^ (0x9E3779B9 * (j + 1) & _M32)))
    return acc


def goldfish_mask(inputs: torch.Tensor, k: int, h: int = 13, mode: Mode = "hash", seed: int = 0) -> torch.Tensor:
    """Keep-mask ``[B, S]`` (float, 1 kept / 0 dropped) over the targets of ``inputs [B, S]``; see the module doc."""
    _check(k, h, mode)
    if inputs.dim() != 2:
        raise ValueError(f"inputs must be [batch, seq], got shape {tuple(inputs.shape)}")
    b, s = inputs.shape
    keep = torch.ones(b, s, dtype=torch.float32, device=inputs.device)
    if mode == "static":
        keep[:, k - 1::k] = 0.0
        return keep
    hashes = context_hash(inputs, h, seed)                       # [B, S - h + 1]: windows ending at h-1 .. S-1
    u = (hashes >> 8).double() / float(1 << 24)                  # U[0, 1)
    keep[:, h - 1:] = (u >= 1.0 / k).float()
    return keep


def kept_count(mask: torch.Tensor) -> int:
    """Number of kept targets in ``mask`` (the normaliser of the goldfish-averaged loss)."""
    return int(host_read(mask.sum()))


def step_mask(inputs: torch.Tensor, k: int, h: int = 13, mode: Mode = "hash", data_parallel: int = 1,
              keep: Optional[torch.Tensor] = None) -> tuple[Optional[torch.Tensor], float]:
    """The keep-mask of a whole optimizer step and the loss normaliser every rank passes with it.

    ``inputs [B, S]`` is the step's global batch (all micro-batches, all data-parallel ranks); ``keep [B, S]``
    (optional, 1/0) the targets that may enter the loss at all, e.g. the assistant's tokens in instruction
    fine-tuning. Returns ``(mask [B, S] | None, normalizer)``: ``mask`` is ``keep`` times :func:`goldfish_mask`
    (either factor left out when absent: ``k == 0`` means every target kept; None when both are) and
    ``normalizer = kept / data_parallel`` (at least ``1 / data_parallel``, so a step without kept targets gives a
    zero loss, not a NaN). Each rank sums its micro-batches' per-target losses times the mask and divides by
    ``normalizer``; the mean over d of the gradient sync then makes the step's loss the mean over every kept
    target of the step, exactly as one serial rank would compute it.
    """
    if data_parallel < 1:
        raise ValueError(f"data_parallel={data_parallel!r} must be >= 1 (the grid's Gd)")
    if keep is not None and keep.shape != inputs.shape:
        raise ValueError(f"keep has shape {tuple(keep.shape)}; it must match inputs {tuple(inputs.shape)}")
    mask = goldfish_mask(inputs, k, h, mode) if k else None
    if keep is not None:
        mask = keep.float() if mask is None else mask * keep.float()
    if mask is None:
        return None, inputs.numel() / data_parallel
    return mask, max(kept_count(mask), 1) / data_parallel
