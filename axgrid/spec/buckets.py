"""How a model's parameters are packed into the flat data-parallel buckets, and which share of each bucket a d-rank
owns: the one place that knows it (pure arithmetic, no torch), read by the runtime (:mod:`axgrid.data_parallel.buckets`)
and by perfmodel (its bucket counts, bytes and the memory of each ``zero`` mode).

The packing: the trainable parameters in **reverse** ``model.parameters()`` order (roughly the order their gradients
become final in the backward, as DDP and Megatron lay out theirs), packed one after another; a parameter joins the
open bucket if it shares the bucket's kind (dtype, device), and a bucket is closed as soon as it holds ``limit``
bytes or more (Megatron's rule: every bucket but the last holds at least the limit). With ``parts`` = Gd > 1
(``zero`` >= 1) each bucket is zero-padded to a multiple of Gd and d-rank ``i`` owns its ``i``-th equal share --
the rule of :func:`axgrid.spec.tiles.split_part` -- so one reduce-scatter of a bucket leaves every rank its own
share reduced, and one all-gather of the shares rebuilds the bucket::

    buckets = pack_buckets(numels, element_bytes, kinds, limit, parts)
    b = buckets[0]
    b.members, b.offsets     # parameter indices (into the given order) and their element offsets in the bucket
    b.share(i)               # [lo, hi) of the bucket that d-rank i owns
    b.piece(k, i)            # [lo, hi) of member k's elements that d-rank i owns (possibly empty)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

from .tiles import ceil_div


@dataclass(frozen=True)
class Bucket:
    """One flat bucket: ``members`` (indices into the parameter list given to :func:`pack_buckets`) at element
    ``offsets``, ``numel`` real elements, padded to ``padded = parts · ceil(numel / parts)`` and cut into ``parts``
    equal shares."""

    members: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    parts: int = 1

    @property
    def numel(self) -> int:
        return self.offsets[-1] + self.sizes[-1] if self.members else 0

    @property
    def share_numel(self) -> int:
        """Elements of one share (``padded / parts``)."""
        return ceil_div(self.numel, self.parts)

    @property
    def padded(self) -> int:
        return self.share_numel * self.parts

    def share(self, index: int) -> tuple[int, int]:
        """``[lo, hi)`` of the (padded) bucket that share ``index`` holds."""
        s = self.share_numel
        return index * s, (index + 1) * s

    def piece(self, k: int, index: int) -> tuple[int, int]:
        """``[lo, hi)`` of member ``k``'s own elements (0 .. size) that lie in share ``index``; ``lo == hi`` when
        none do."""
        lo, hi = self.share(index)
        start, size = self.offsets[k], self.sizes[k]
        a, b = max(lo, start), min(hi, start + size)
        return (a - start, b - start) if b > a else (0, 0)


def pack_buckets(numels: Sequence[int], element_bytes: Sequence[int], kinds: Sequence[Hashable], limit: int,
                 parts: int = 1) -> list[Bucket]:
    """The buckets of parameters with ``numels`` elements of ``element_bytes`` each and ``kinds`` (a dtype and
    device: a bucket holds one kind), in the order given (the packing order: see the module docstring)."""
    if limit <= 0:
        raise ValueError(f"bucket limit must be a positive number of bytes, got {limit}")
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    groups: list[list[int]] = []
    fill = 0
    for i, (n, eb) in enumerate(zip(numels, element_bytes)):
        # a parameter without elements here (a shard that is empty on this rank) never opens a bucket
        if not groups or (n > 0 and fill >= limit) or kinds[i] != kinds[groups[-1][0]]:
            groups.append([])
            fill = 0
        groups[-1].append(i)
        fill += n * eb
    out = []
    for g in groups:
        offsets, off = [], 0
        for i in g:
            offsets.append(off)
            off += numels[i]
        out.append(Bucket(tuple(g), tuple(offsets), tuple(numels[i] for i in g), parts))
    return out


__all__ = ["Bucket", "pack_buckets"]
