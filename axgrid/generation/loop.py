"""The autoregressive loop of :func:`axgrid.generate` on the grid."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import nn

from ..device import host_read
from ..core.grid import Grid
from .decoders import decoder_for, vocab_size
from .select import gumbel_noise, vocab_parallel_argmax, vocab_parallel_top_k_floor
from .special import special_tokens


def _int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"axgrid.generate: {name}={value!r} must be an integer >= {low}")
    return value


def _check(input_ids, grid: Grid, temperature, top_k, eos, pad, vocab: int) -> list[int]:
    """Raise (on every rank alike, before any collective) for bad arguments; return the EOS ids."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype.is_floating_point \
            or input_ids.dtype == torch.bool or 0 in input_ids.shape:
        what = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"axgrid.generate: input_ids must be integer token ids [batch, seq] with batch, seq >= 1 "
                         f"(prompts of equal length), got {what}")
    b = input_ids.shape[0]
    gd, gz = grid.size("d"), grid.size("z")
    if b % (gd * gz):
        raise ValueError(f"axgrid.generate: the batch of {b} prompts is not divisible by Gd*Gz={gd}*{gz} of grid "
                         f"{grid.shape} (sequences split over d, then z); pass a multiple of {gd * gz} prompts")
    lo, hi = host_read(input_ids.min()), host_read(input_ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"axgrid.generate: input_ids hold ids in [{lo}, {hi}], outside the vocabulary [0, {vocab})")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0 \
            or not math.isfinite(temperature):
        raise ValueError(f"axgrid.generate: temperature={temperature!r} must be a finite number >= 0 (0: greedy)")
    if top_k is not None:
        _int("top_k", top_k, 1)
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) and not isinstance(eos, bool) else list(eos)
    for name, v in [("eos_token_id", e) for e in eos_ids] + ([("pad_token_id", pad)] if pad is not None else []):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
            raise ValueError(f"axgrid.generate: {name}={v!r} must be a token id in [0, {vocab})")
    return eos_ids


def _same_prompts_everywhere(input_ids: torch.Tensor, grid: Grid) -> None:
    """Raise on every rank alike when the ranks were not all given the same prompts (a user error that would
    otherwise decode each block's own rows of different batches): a fingerprint all-gathered over the block and
    over d, then the verdict summed over both, so that every rank learns it (four collectives of a few numbers)."""
    ids = input_ids.reshape(-1).to(torch.long)
    weights = torch.arange(1, ids.numel() + 1, dtype=torch.long, device=ids.device)
    mine = torch.stack([ids.sum(), (ids * weights).sum(), (ids * ids).sum()]).to(grid.device)   # [3]
    bad = torch.zeros(1, dtype=torch.long, device=grid.device)
    for dim in ("xyz", "d"):
        bad += (grid.comm.all_gather(mine, dim) != mine).any().long()
    for dim in ("xyz", "d"):
        bad = grid.comm.all_reduce(bad, dim)
    if host_read(bad[0]):
        raise ValueError("axgrid.generate: the ranks were given different input_ids; every rank passes the same "
                         "[B, S] prompts (the whole batch) and generate splits the work")


@torch.no_grad()
def generate(model: nn.Module, input_ids: torch.Tensor, grid: Grid, max_new_tokens: int, *,
             temperature: float = 0.0, top_k: Optional[int] = None,
             eos_token_id: Optional[int | Sequence[int]] = None, pad_token_id: Optional[int] = None,
             seed: int = 0, use_cache: bool = True) -> torch.Tensor:
    """Continue ``input_ids`` by up to ``max_new_tokens`` tokens on the parallel ``model``.

    Every rank passes the same prompts ``input_ids [B, S]`` (integer ids, equal length, no padding) and gets the
    same ``[B, S + n]`` back (prompts, then the new tokens): ``n = max_new_tokens``, or fewer when every sequence
    has stopped at an EOS sooner (the longest sequence's count, as transformers' ``generate`` returns). The work
    splits as training does:
    data-parallel rank d decodes sequences ``[d·B/Gd, (d+1)·B/Gd)`` and, inside it, z-rank z its ``1/Gz`` of them
    (``B`` divisible by ``Gd·Gz``); each rank caches its sequences' keys and values of its ``H/Gy`` heads; one
    ``all_gather`` over d at the end gives everyone the whole batch.

    ``model``: axgrid's :class:`~axgrid.models.gpt.GPT` on ``grid``, or a Hugging Face causal LM parallelized on it
    (``axgrid.parallelize`` / ``axgrid.from_pretrained``): with its plan (Llama, Mistral, Qwen2, Qwen3, Gemma 3,
    Phi-3, tied or not), or drop-in (every rank of the block then runs all of its d-slice's sequences and holds
    full logits; see :mod:`axgrid.generation.decoders`). ``temperature=0``: greedy, the argmax over the
    vocabulary-split logits (a ``[B_d/Gz, 2]`` all-gather over y per step, no rank holds full logits), equal to
    the dense model's greedy decoding. ``temperature > 0``: a draw from ``softmax(logits / temperature)`` over
    the ``top_k`` largest logits (all when None) by the Gumbel-max trick, with noise from a generator seeded by
    ``seed`` on every rank alike: the same tokens on every rank, and for the same seed on any grid.
    ``eos_token_id`` (an id or several): a sequence stops after it, the rest of its row is ``pad_token_id``;
    decoding stops when every sequence of a data-parallel rank has stopped. Either id, when not given, is the
    model's as transformers' ``generate`` takes it: its ``generation_config``, then its ``config``; pad's last
    default is the first EOS id (see :mod:`axgrid.generation.special`). ``eos_token_id=[]``: never stop early.
    ``use_cache=False`` runs the whole sequence each step (the reference for the cached path).
    Per step: the model's own collectives on ``[B_d/Gz, 1]`` tokens, one all-gather over z of the new tokens.
    Before the first step, a fingerprint of ``input_ids`` is compared across all ranks (raises when they differ).
    """
    _int("max_new_tokens", max_new_tokens, 0)
    length = (input_ids.shape[-1] if isinstance(input_ids, torch.Tensor) else 0) + max_new_tokens - 1
    vocab = vocab_size(model, grid, length)                  # the tokens the model sees: all but the last new one
    eos_token_id, pad_token_id = special_tokens(model, eos_token_id, pad_token_id)
    eos_ids = _check(input_ids, grid, temperature, top_k, eos_token_id, pad_token_id, vocab)
    _same_prompts_everywhere(input_ids, grid)
    pad = pad_token_id if pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    device = grid.device
    batch, s = input_ids.shape
    bd = batch // grid.size("d")
    b = bd // grid.size("z")
    d, z = grid.index("d"), grid.index("z")
    first = d * bd + z * b                                    # this rank's first sequence of the global batch
    out = torch.full((bd, s + max_new_tokens), pad, dtype=torch.long, device=device)
    out[:, :s] = input_ids[d * bd:(d + 1) * bd].to(device)
    done = torch.zeros(bd, dtype=torch.bool, device=device)
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    gen = torch.Generator(device=device).manual_seed(seed) if temperature > 0 else None
    decoder = decoder_for(model, use_cache, grid)
    vdim = decoder.vocab_dim
    fresh = out[:, :s]                                        # tokens the model has not seen: [B_d, s]
    for t in range(max_new_tokens):
        logits = decoder.step(fresh)                          # [b, V/Gy] fp32 (drop-in: [b, V])
        v_loc = logits.shape[-1]
        if gen is not None:
            if top_k is not None:
                logits = logits.masked_fill(logits < vocab_parallel_top_k_floor(logits, top_k, grid, vdim),
                                            -math.inf)
            v0 = grid.index(vdim) * v_loc if vdim else 0
            logits = logits / temperature + gumbel_noise(gen, batch, vocab, slice(first, first + b),
                                                         slice(v0, v0 + v_loc), device)
        mine = vocab_parallel_argmax(logits, grid, vdim)      # [b] the same on every rank of the x·y block
        new = grid.comm.all_gather(mine, "z").reshape(bd)     # [B_d] the same on every rank of the block
        new = torch.where(done, torch.full_like(new, pad), new)
        out[:, s + t] = new
        if len(eos_ids):
            done |= torch.isin(new, eos)
            if host_read(done.all()):     # a stopping test: the one read of the device per step
                break
        fresh = new.unsqueeze(1) if use_cache else out[:, :s + t + 1]
    whole = grid.comm.all_gather(out, "d").reshape(batch, s + max_new_tokens)
    return whole[:, :s + _longest(whole[:, s:], eos)] if len(eos_ids) else whole


def _longest(new: torch.Tensor, eos: torch.Tensor) -> int:
    """The new tokens of the sequence that ran longest, ``new [B, n]`` (each row up to its first EOS, all ``n``
    without one): the length transformers' ``generate`` stops at, the same on every rank."""
    hit = torch.isin(new, eos)
    steps = torch.where(hit.any(dim=1), hit.int().argmax(dim=1) + 1, new.shape[1])   # [B]
    return int(host_read(steps.max())) if new.shape[1] else 0


__all__ = ["generate"]
