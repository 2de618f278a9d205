"""Initialisation that needs no communication and no full matrix: every element's value is a hash of
(seed, stream, global index). A rank computes its own shard only, and the result equals slicing the serial
initialisation ``reference_linear(...)`` on any grid (so the same seed gives the same model on every grid).

Values follow ``nn.Linear``'s default distribution: weight and bias ~ U(-1/sqrt(in_features), 1/sqrt(in_features)).
:func:`normal_box` draws N(0, std²) instead (the inverse normal CDF of the hashed uniform), for any box of a dense tensor of any
rank: what a Hugging Face model pre-trained from its config starts from (:mod:`axgrid.plans.initial_weights`).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

_M32 = 0xFFFFFFFF


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """(h * c) mod 2**32 for int64 tensors of values below 2**32, with no int64 overflow."""
    lo = h * (c & 0xFFFF)
    hi = ((h * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """Murmur3's 32-bit finaliser: a bijective mix of 32-bit values."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def hashed_uniform(seed: int, stream: int, index: torch.Tensor) -> torch.Tensor:
    """U(0, 1) values (float64, 24-bit resolution) for global element indices ``index`` (int64, any shape)."""
    key = _fmix32(torch.tensor(((seed & _M32) ^ (stream * 0x9E3779B1)) & _M32, dtype=torch.int64))
    hi = _fmix32((index >> 32) ^ key)
    h = _fmix32((index & _M32) ^ hi)
    h = _fmix32(h ^ key)
    return ((h >> 8).double() + 0.5) / float(1 << 24)


def uniform_block(seed: int, stream: int, n_cols: int, rows: range, cols: range, bound: float,
                  dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """Block ``[len(rows), len(cols)]`` of the matrix whose element (i, j) is U(-bound, bound) drawn from
    index ``i * n_cols + j``, computed on ``device`` (the parameter's: no host copy to make and move)."""
    r = torch.arange(rows.start, rows.stop, dtype=torch.int64, device=device).unsqueeze(1)
    c = torch.arange(cols.start, cols.stop, dtype=torch.int64, device=device).unsqueeze(0)
    u = hashed_uniform(seed, stream, r * n_cols + c)
    return ((2 * u - 1) * bound).to(dtype)


WEIGHT_STREAM, BIAS_STREAM = 1, 2
NORMAL_STREAM = 3


def normal_box(seed: int, dense_shape: Sequence[int], offsets: Sequence[int], shape: Sequence[int], std: float,
               dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
               chunk: int = 1 << 22) -> torch.Tensor:
    """Box ``dense[offsets : offsets + shape]`` of the dense tensor of ``dense_shape`` whose element at row-major
    index ``i`` is N(0, std²) drawn from ``i`` (the inverse of the normal CDF, ``std·√2·erfinv(2u - 1)``, of the
    uniform ``u`` hashed from ``i``: 24 bits, so ``|value| < 5.4·std``), so every box of every grid, and the dense
    tensor, agree element for element. Computed
    in slabs of rows of about ``chunk`` elements (the hash's int64 temporaries are ~10 times the slab's bytes)."""
    numel = math.prod(shape)
    if len(shape) > 1 and numel > chunk:
        out = torch.empty(tuple(shape), dtype=dtype, device=device)
        rows = max(1, chunk // math.prod(shape[1:]))
        for r in range(0, shape[0], rows):
            n = min(rows, shape[0] - r)
            out[r:r + n] = normal_box(seed, dense_shape, (offsets[0] + r, *offsets[1:]), (n, *shape[1:]), std,
                                      dtype, device, chunk=numel)
        return out
    index = torch.zeros((), dtype=torch.int64, device=device)
    stride = 1
    for dim in reversed(range(len(dense_shape))):        # global row-major index of each element of the box
        pos = torch.arange(offsets[dim], offsets[dim] + shape[dim], dtype=torch.int64, device=device)
        index = index + (pos * stride).view(-1, *([1] * (len(dense_shape) - 1 - dim)))
        stride *= int(dense_shape[dim])
    u = hashed_uniform(seed, NORMAL_STREAM, index.expand(tuple(shape)))
    return (torch.erfinv(2.0 * u - 1.0) * (math.sqrt(2.0) * std)).to(dtype)


def linear_bound(in_features: int) -> float:
    return 1.0 / math.sqrt(in_features) if in_features > 0 else 0.0


def reference_linear(in_features: int, out_features: int, bias: bool, seed: int,
                     dtype: torch.dtype = torch.float32) -> nn.Linear:
    """The serial ``nn.Linear`` that a parallel ``axgrid.nn.Linear`` with this seed equals, slice for slice."""
    lin = nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
    b = linear_bound(in_features)
    with torch.no_grad():
        lin.weight.copy_(uniform_block(seed, WEIGHT_STREAM, in_features, range(out_features), range(in_features), b))
        if bias:
            lin.bias.copy_(uniform_block(seed, BIAS_STREAM, out_features, range(1), range(out_features), b)[0])
    return lin
