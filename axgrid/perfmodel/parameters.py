"""The trainable tensors of one rank, for every family perfmodel prices, and their gradients' elements on N grids.

One list per family, the one the collective replay uses: the GPT's ``perfmodel.gpt.gpt_parameters``, a Hugging
Face decoder's ``perfmodel.decoder.decoder_parameters`` (both in ``model.parameters()`` order). The data-parallel
buckets (``perfmodel.buckets.pack``), the memory of each ``zero`` mode and the bytes over d all read the elements
from here, so the time model, the memory model and the replay pack the same tensors.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from axgrid.spec import TransformerShape

from .decoder import decoder_parameters
from .gpt import GPTParam, gpt_parameters


def trainable_parameters(spec: TransformerShape, grid: tuple[int, int, int, int]) -> list[GPTParam]:
    """The trainable tensors of one rank of ``grid`` in ``model.parameters()`` order."""
    return gpt_parameters(spec, grid) if spec.is_gpt else decoder_parameters(spec, grid)


@lru_cache(maxsize=4096)
def _elements(spec: TransformerShape, gx: int, gy: int, gz: int) -> tuple[int, ...]:
    """Elements of each trainable tensor of one rank of (``gx``, ``gy``, ``gz``, any Gd), ``model.parameters()``
    order; cached: a ranking asks for the same few hundred grids' lists thousands of times (a shape is frozen)."""
    return tuple(p.elems for p in trainable_parameters(spec, (gx, gy, gz, 1)))


def gradient_elements(spec: TransformerShape, gx, gy, gz) -> list[np.ndarray]:
    """Elements of every gradient on one rank of each grid (``gx``, ``gy``, ``gz``: arrays [N]), in the buckets'
    packing order (reverse ``model.parameters()``), each an int64 array [N]. The lists are built once per distinct
    (Gx, Gy, Gz) and must have one length (a family's tensors do not depend on the grid)."""
    gx, gy, gz = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64).reshape(-1) for a in (gx, gy, gz)))
    triples, which = np.unique(np.stack([gx, gy, gz], axis=1), axis=0, return_inverse=True)
    table = [_elements(spec, int(x), int(y), int(z)) for x, y, z in triples]
    lengths = {len(t) for t in table}
    if len(lengths) != 1:
        raise ValueError(f"{spec.name}: the trainable tensors' count depends on the grid ({sorted(lengths)}); "
                         f"perfmodel packs one list per family")
    elems = np.asarray(table, dtype=np.int64)[np.asarray(which).reshape(-1)]      # [N, tensors]
    return [elems[:, i] for i in range(elems.shape[1] - 1, -1, -1)]


__all__ = ["gradient_elements", "trainable_parameters"]
