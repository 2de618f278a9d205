"""The data-parallel buckets on N grids at once (numpy arrays [N]): the runtime's packing itself
(``axgrid.spec.pack_buckets``, the one packer), run once per distinct grid and summed up.

Every trainable parameter's gradient (token and position tables, norms, FC weight shards and biases) in the packing
order -- reverse ``model.parameters()`` order, ``perfmodel.parameters.gradient_elements`` -- packed into buckets of
``Options.bucket_bytes``: a tensor joins the open bucket, which is closed once it holds the limit or more; with
``zero`` >= 1 each bucket is padded to a multiple of Gd elements. The element counts feed
the memory of each ``zero`` mode (``perfmodel.memory``), the bytes the collectives over d (``perfmodel.model``,
``perfmodel.step``).
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from axgrid.spec import pack_buckets


class BucketTotals(NamedTuple):
    """Per grid [N]: ``count`` buckets; ``numel`` real gradient elements; ``padded`` elements with each bucket
    padded to a multiple of ``parts``; ``largest`` / ``first`` / ``second`` / ``last`` padded elements of the
    largest bucket, of the first two in the packing (the last parameters: the head's, reduced first) and of the
    last (the first parameters: the embeddings, reduced last in the backward and gathered first for the
    forward)."""

    count: np.ndarray
    numel: np.ndarray
    padded: np.ndarray
    largest: np.ndarray
    first: np.ndarray
    second: np.ndarray
    last: np.ndarray


def pack(elems: list[np.ndarray], element_bytes: int, bucket_bytes: int, parts) -> BucketTotals:
    """:class:`BucketTotals` of gradients of ``elems`` (packing order, arrays [N]) of ``element_bytes`` each, in
    buckets of ``bucket_bytes``, padded to multiples of ``parts`` [N] (1: no padding): the runtime's own packing
    (``axgrid.spec.pack_buckets``), run once per distinct (elements, parts) among the N grids."""
    n = len(elems[0])
    parts = np.broadcast_to(np.asarray(parts, dtype=np.int64), (n,))
    table = np.stack([np.broadcast_to(np.asarray(e, dtype=np.int64), (n,)) for e in elems] + [parts], axis=1)
    rows, which = np.unique(table, axis=0, return_inverse=True)
    totals = np.asarray([_totals(tuple(row[:-1].tolist()), element_bytes, bucket_bytes, int(row[-1]))
                         for row in rows], dtype=np.int64)[np.asarray(which).reshape(-1)]      # [N, 7]
    return BucketTotals(*(totals[:, i] for i in range(7)))


@lru_cache(maxsize=4096)
def _totals(numels: tuple[int, ...], element_bytes: int, bucket_bytes: int, parts: int) -> tuple[int, ...]:
    """(count, numel, padded, largest, first, second, last) of :class:`BucketTotals` for one grid."""
    buckets = [b for b in pack_buckets(numels, [element_bytes] * len(numels), [0] * len(numels), bucket_bytes,
                                       parts) if b.numel > 0]
    if not buckets:
        return (0,) * 7
    padded = [b.padded for b in buckets]
    return (len(buckets), sum(b.numel for b in buckets), sum(padded), max(padded), padded[0],
            padded[1] if len(padded) > 1 else 0, padded[-1])


__all__ = ["BucketTotals", "pack"]
