"""Which tokens of a sequence a context-parallel rank holds: the causal load balance.

A sequence of ``S`` tokens is cut into ``2·cp`` chunks of ``c = S / (2·cp)`` tokens; rank ``r`` of the group (its
index along ``"c"``) holds chunks ``r`` and ``2·cp − 1 − r``, in that order, as ``2c`` rows. Under a causal mask a
query at position ``p`` attends to ``p + 1`` keys, so chunk ``j`` costs about ``(j + ½)·c²``; the pair
``r, 2·cp − 1 − r`` costs ``2·cp·c²`` on every rank -- the same work for all, where ``cp`` contiguous pieces
would leave the last rank ``2·cp − 1`` times the first's.

    cp = 2, S = 8 (c = 2):   positions 0 1 | 2 3 | 4 5 | 6 7
                             rank 0 holds chunks 0 and 3: 0 1 6 7;  rank 1 holds chunks 1 and 2: 2 3 4 5
"""
from __future__ import annotations

import torch


def chunks_that_work(seq: int, cp: int, around: int = 2) -> list[int]:
    """Sequence lengths near ``seq`` that cut into ``2·cp`` equal chunks (``around`` below and above, > 0)."""
    step = 2 * cp
    below = [seq // step * step - i * step for i in range(around)]
    above = [(seq // step + 1 + i) * step for i in range(around)]
    return sorted(v for v in below + above if v > 0 and v != seq)


def check_sequence(seq: int, cp: int) -> int:
    """The chunk length ``seq / (2·cp)``; a one-line ValueError naming lengths that work when ``seq`` does not cut
    into ``2·cp`` equal chunks (call it before any collective)."""
    if not isinstance(cp, int) or cp < 1:
        raise ValueError(f"context-parallel size cp={cp!r} must be an integer >= 1")
    if seq < 2 * cp or seq % (2 * cp):
        raise ValueError(f"sequence length {seq} does not cut into 2·cp = {2 * cp} equal chunks (cp={cp}, causal "
                         f"balance); use a multiple of {2 * cp}, e.g. {', '.join(map(str, chunks_that_work(seq, cp)))}")
    return seq // (2 * cp)


def chunk_ids(cp: int, index: int) -> tuple[int, int]:
    """The two chunks rank ``index`` of a ``cp`` group holds, in the order of its rows."""
    if not 0 <= index < cp:
        raise ValueError(f"index {index} is outside a context-parallel group of {cp}")
    return index, 2 * cp - 1 - index


def positions(seq: int, cp: int, index: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The positions in the whole sequence of rank ``index``'s ``2c`` rows, ``[2c]`` int64: the rotary position ids
    (and learned-position rows) of its tokens."""
    c = check_sequence(seq, cp)
    first, second = chunk_ids(cp, index)
    return torch.cat([torch.arange(first * c, (first + 1) * c, device=device),
                      torch.arange(second * c, (second + 1) * c, device=device)])


def sample_spans(seq: int, cp: int, index: int) -> list[tuple[int, int]]:
    """The positions ``[a, b)`` of a sample's ``seq + 1`` tokens that rank ``index``'s rows use: inputs at its
    chunks' positions and targets one further, so each chunk and the token after it (what a corpus reader under
    context parallelism reads, :meth:`axgrid.data.Corpus.batch`)."""
    c = check_sequence(seq, cp)
    return [(k * c, (k + 1) * c + 1) for k in chunk_ids(cp, index)]


def shard(x: torch.Tensor, cp: int, index: int, dim: int = 1) -> torch.Tensor:
    """Rank ``index``'s rows of ``x`` (the whole sequence along ``dim``, e.g. tokens ``[B, S]``): ``[.., 2c, ..]``."""
    c = check_sequence(x.shape[dim], cp)
    first, second = chunk_ids(cp, index)
    return torch.cat([x.narrow(dim, first * c, c), x.narrow(dim, second * c, c)], dim=dim)


def unshard(parts: torch.Tensor, dim: int) -> torch.Tensor:
    """The whole sequence from every rank's rows stacked in group order (``parts [cp, ..]``, each ``[.., 2c, ..]``
    along ``dim`` of a part, as :func:`shard` cut them): ``[.., S, ..]``."""
    cp = parts.shape[0]
    c = parts.shape[dim + 1] // 2
    halves = [parts[r].narrow(dim, 0, c) for r in range(cp)] + [parts[r].narrow(dim, c, c) for r in reversed(range(cp))]
    return torch.cat(halves, dim=dim)
