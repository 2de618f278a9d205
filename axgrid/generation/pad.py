""":func:`axgrid.generate` for any number of prompts: a batch that does not split over the grid is padded.

Generation splits the prompts as training splits sequences, over d and then z (``B`` divisible by ``Gd·Gz``). With
fewer prompts, or a number that does not divide, the batch is padded to the next multiple of ``Gd·Gz`` with copies of
its last prompt (valid ids, the same length), decoded with the rest, and only the real rows are returned. A padded
copy costs what a real prompt does; on a grid whose ``Gd·Gz`` divides ``B`` nothing changes.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..core.grid import Grid
from .loop import generate as generate_split


def generate(model: nn.Module, input_ids: torch.Tensor, grid: Grid, max_new_tokens: int, **kwargs: Any
             ) -> torch.Tensor:
    """:func:`axgrid.generation.loop.generate` (see it for every argument) on ``input_ids [B, S]`` for any ``B``:
    padded with copies of the last prompt to a multiple of ``Gd·Gz``, the padding dropped from the result
    ``[B, S + max_new_tokens]`` (every rank gets the same)."""
    split = grid.size("d") * grid.size("z")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] in (0, split) \
            or input_ids.shape[0] % split == 0:
        return generate_split(model, input_ids, grid, max_new_tokens, **kwargs)   # it checks and explains
    b = input_ids.shape[0]
    extra = -b % split
    padded = torch.cat([input_ids, input_ids[-1:].expand(extra, -1)])
    return generate_split(model, padded, grid, max_new_tokens, **kwargs)[:b]


generate.__doc__ = f"{generate.__doc__}\n\n{generate_split.__doc__}"
