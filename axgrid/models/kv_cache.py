"""The key/value cache of axgrid's GPT for incremental decoding, split as the attention heads are.

Each rank caches, per layer, the keys and values of its own sequences (``b = B_d/Gz``: z splits by sequence) and
its own heads (``H/Gy``: the QKV layer's rows split over y in whole heads): ``[b, H/Gy, T, head_dim]`` with ``T``
the tokens seen so far. Nothing is communicated: attention on local heads needs only local keys and values.

Written here rather than reusing ``transformers.DynamicCache`` because axgrid's GPT does not depend on
``transformers`` (an optional extra); the Hugging Face models keep their own cache (see :mod:`axgrid.generate`).
"""
from __future__ import annotations

from typing import Optional

import torch


class LayerKV:
    """One layer's cached ``keys``/``values`` ``[b, H/Gy, T, head_dim]`` (None before the first step)."""

    def __init__(self) -> None:
        self.keys: Optional[torch.Tensor] = None
        self.values: Optional[torch.Tensor] = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this step's ``k, v [b, H/Gy, s, head_dim]``; return every cached key and value ``[b, H/Gy, T+s, d]``."""
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys = torch.cat([self.keys, k], dim=2)
            self.values = torch.cat([self.values, v], dim=2)
        return self.keys, self.values


class KVCache:
    """The cache of every layer of one :class:`~axgrid.models.gpt.GPT`; ``length`` = tokens cached so far."""

    def __init__(self, layers: int) -> None:
        self.layers = [LayerKV() for _ in range(layers)]

    @property
    def length(self) -> int:
        keys = self.layers[0].keys if self.layers else None
        return 0 if keys is None else keys.shape[2]


__all__ = ["KVCache", "LayerKV"]
