"""The causal-LM loss of a Hugging Face model whose head gives vocabulary-split logits (``model.loss_function``).

Takes this z-rank's ``logits [B/Gz, S, V/Gy]`` and ``labels [B/Gz, S]`` (the batch split by sequence), shifts the
labels by one inside each sequence (as ``transformers``' ``ForCausalLMLoss``), and returns the mean cross entropy
over every kept label of all ``B`` sequences (``ignore_index`` dropped; divided by ``num_items_in_batch`` when
given): vocab-parallel CE per token, then one all-reduce over z of ``[sum, count]``. The value is the same on every
rank of the x·y·z block; its gradient is this rank's own tokens' part (no collective in backward).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F

from ..core.grid import Grid
from ..tensor_parallel.vocab_parallel import vocab_parallel_cross_entropy


class VocabParallelCausalLMLoss:
    """``loss_function(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None)``
    for a model whose logits are split over the vocabulary (y) and its batch over z."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def __call__(self, logits: torch.Tensor, labels: Optional[torch.Tensor], vocab_size: int,
                 num_items_in_batch: Optional[torch.Tensor | int] = None, ignore_index: int = -100,
                 shift_labels: Optional[torch.Tensor] = None, **kwargs) -> torch.Tensor:
        grid = self.grid
        if logits.shape[-1] * grid.size("y") != vocab_size:
            raise ValueError(f"logits carry {logits.shape[-1]} vocabulary entries, expected vocab_size/Gy = "
                             f"{vocab_size}/{grid.size('y')}")
        if shift_labels is None:
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        targets = shift_labels.reshape(-1).to(logits.device)
        keep = targets != ignore_index
        per_token = vocab_parallel_cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.where(keep, targets, torch.zeros_like(targets)), grid, "y")
        local = (per_token * keep).sum()
        both = torch.stack([local.detach(), keep.sum().to(local.dtype)])
        both = grid.comm.all_reduce(both, "z")                       # [sum over all sequences, kept labels]
        total = local + (both[0] - local.detach())                   # the sum; gradient: this rank's own part
        if num_items_in_batch is None:
            return total / both[1]
        if isinstance(num_items_in_batch, torch.Tensor):
            return total / num_items_in_batch.to(device=local.device, dtype=local.dtype)
        return total / float(num_items_in_batch)          # a number: no tensor made on the host and copied over
