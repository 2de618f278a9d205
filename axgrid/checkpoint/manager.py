"""The checkpoints of one run under a root directory: save, resume, keep the newest few."""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from torch import nn

from ..io import agree
from .format import CheckpointError, LoadInfo, _rank_world
from .load import load_checkpoint
from .save import save_checkpoint
from .store import latest_checkpoint

class CheckpointManager:
    """Checkpoints of one run under ``root``: ``save(step, ...)``, ``resume(...)``, keeping the newest ``keep``.

    ``config``: the run's settings (model sizes, seed, data, schedule), saved with every checkpoint and compared
    on resume (``resume(..., allow_changes=["steps"])`` accepts a deliberate change)."""

    def __init__(self, root: str, grid=None, keep: Optional[int] = 2,
                 config: Optional[Mapping[str, Any]] = None) -> None:
        self.root, self.grid, self.keep, self.config = root, grid, keep, config

    def latest(self) -> Optional[str]:
        return latest_checkpoint(self.root)

    def save(self, step: int, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
             extra: Optional[Mapping[str, Any]] = None,
             generators: Optional[Mapping[str, torch.Generator]] = None) -> str:
        return save_checkpoint(self.root, model, optimizer, self.grid, step=step, extra=extra,
                               generators=generators, keep=self.keep, config=self.config)

    def resume(self, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, **kwargs: Any
               ) -> Optional[LoadInfo]:
        """Load the latest checkpoint if there is one (all ranks must agree it exists); None otherwise."""
        try:
            found = self.latest() is not None
        except CheckpointError:            # a damaged pointer: load_checkpoint below says why, on every rank
            found = True
        (n,) = agree(self.grid, [int(found)])
        world = _rank_world(self.grid)[1]
        if n == 0:
            return None
        if n != world:
            raise CheckpointError(f"only {n} of {world} ranks see a checkpoint under {self.root}: the checkpoint "
                                  f"directory must be on a file system shared by all ranks")
        kwargs.setdefault("config", self.config)
        return load_checkpoint(self.root, model, optimizer, self.grid, **kwargs)
