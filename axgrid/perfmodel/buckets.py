"""The data-parallel buckets on N grids at once (numpy arrays [N]): the runtime's packing
(``axgrid.spec.buckets``), vectorised.

Every trainable parameter's gradient (token and position tables, layer norms, FC weight shards and biases) in the
packing order -- reverse ``model.parameters()`` order, ``perfmodel.parameters.gradient_elements`` -- packed into buckets of ``Options.bucket_bytes``: a tensor
joins the open bucket, which is closed once it holds the limit or more; with ``zero`` >= 1 each bucket is padded
to a multiple of Gd elements. The element counts feed
the memory of each ``zero`` mode (``perfmodel.memory``), the bytes the collectives over d (``perfmodel.model``,
``perfmodel.gpt``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from axgrid.spec import ceil_div


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
    buckets of ``bucket_bytes``, padded to multiples of ``parts`` [N] (1: no padding)."""
    n = len(elems[0])
    parts = np.broadcast_to(np.asarray(parts, dtype=np.int64), (n,))
    count = np.zeros(n, dtype=np.int64)
    fill = np.zeros(n, dtype=np.int64)                 # elements of the open bucket
    numel = np.zeros(n, dtype=np.int64)
    padded = np.zeros(n, dtype=np.int64)
    largest = np.zeros(n, dtype=np.int64)
    first = np.zeros(n, dtype=np.int64)
    second = np.zeros(n, dtype=np.int64)
    pad = lambda e: ceil_div(e, parts) * parts        # noqa: E731
    for e in elems:
        new = (e > 0) & ((fill == 0) | (fill * element_bytes >= bucket_bytes))
        close = new & (fill > 0)
        done = np.where(close, pad(fill), 0)
        padded += done
        largest = np.maximum(largest, done)
        first = np.where(close & (count == 1), done, first)
        second = np.where(close & (count == 2), done, second)
        count += new
        fill = np.where(new, e, fill + e)
        numel += e
    last = np.where(fill > 0, pad(fill), 0)
    padded += last
    largest = np.maximum(largest, last)
    first = np.where(count == 1, last, first)
    second = np.where(count == 2, last, second)
    return BucketTotals(count, numel, padded, largest, first, second, last)


__all__ = ["BucketTotals", "pack"]
