"""A training driver's checkpoints: resume from ``--resume``, save under ``--save`` every ``--save-every`` steps, at
the last step, and at the step boundary after SIGTERM / SIGUSR1 (Slurm's ``--signal=USR1@N``).

    ckpt = RunCheckpoints(args, grid, config=run_config, name="train_gpt")
    start = ckpt.resume(model, opt)                  # steps already done (0 without --resume); ckpt.extra: its extra
    for step in range(start, steps):
        ...
        if ckpt.step_done(step + 1, model, opt, last=step + 1 == steps, extra={"data": ...}):
            break                                    # a stop signal: saved, leave the loop
    ckpt.close()

Saving goes through :class:`axgrid.checkpoint.CheckpointManager`. After each save rank 0 deletes all but the newest
``--keep N`` checkpoints under ``--save`` (default 2; 0 keeps all), never the one ``--resume`` loaded, which may be
the only copy of the run's start. ``config`` (the run's settings: model, seed, data, schedule) is saved with each
checkpoint; a resume with other settings is refused, naming them, unless ``--allow-config-change`` lists the
fields.
"""
from __future__ import annotations

import argparse
import os
import shutil
from typing import Any, Mapping, Optional

import torch

from ..checkpoint import (CheckpointError, CheckpointManager, ConfigMismatch, SaveOnSignal, list_checkpoints,
                          load_checkpoint)
from ..core.grid import Grid


class RunCheckpoints:
    """The checkpoints of one driver run (see the module docstring). Collective: every rank makes the same calls."""

    def __init__(self, args: argparse.Namespace, grid: Grid, config: Mapping[str, Any], name: str) -> None:
        self.grid, self.config, self.name = grid, dict(config), name
        self.resume_dir: Optional[str] = args.resume
        self.save_dir: Optional[str] = args.save
        self.every: int = args.save_every
        self.allow = [f for f in (getattr(args, "allow_config_change", None) or "").split(",") if f]
        self.keep: int = getattr(args, "keep", 2)
        self.resumed_from: Optional[str] = None          # the checkpoint --resume loaded: never deleted
        self.manager = CheckpointManager(args.save, grid, keep=None, config=self.config) if args.save else None
        self.stop = SaveOnSignal(grid).install() if args.save else None
        #: the ``extra`` of the checkpoint resumed from (e.g. the data position), ``{}`` without one
        self.extra: dict[str, Any] = {}

    @property
    def stopped(self) -> bool:
        """A stop signal ended the run early (after its checkpoint was saved)."""
        return self.stop is not None and self.stop.stopped

    def resume(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer]) -> int:
        """Load model + optimizer from ``--resume`` (resharding if the grid differs); the number of steps done."""
        if not self.resume_dir:
            return 0
        try:
            info = load_checkpoint(self.resume_dir, model, optimizer, self.grid, config=self.config,
                                   allow_changes=self.allow)
        except ConfigMismatch as e:           # raised on every rank alike: a clean exit, not a traceback per rank
            msg = str(e).split("; resume with")[0]
            raise SystemExit(f"--resume {self.resume_dir}: {msg}; resume with the checkpoint's settings, or pass "
                             f"--allow-config-change {','.join(e.fields)} to change them deliberately") from None
        except CheckpointError as e:
            raise SystemExit(f"--resume {self.resume_dir}: {e}") from None
        self.extra = dict(info.extra)
        self.resumed_from = os.path.realpath(info.path)
        if self.grid.rank == 0:
            print(f"{self.name}: resumed from {info.path} at step {info.step} (saved on grid {info.saved_grid}"
                  f"{', resharded to ' + str(self.grid.shape) if info.resharded else ''})", flush=True)
        return info.step

    def step_done(self, steps_done: int, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer],
                  last: bool, extra: Optional[Mapping[str, Any]] = None) -> bool:
        """After each optimizer step: save when due (every ``--save-every`` steps, at the ``last`` step, on a stop
        signal), with ``extra`` (JSON: e.g. the data position); True when a stop signal ends the run here.
        Collective (the stop request is agreed on)."""
        if self.manager is None:
            return False
        halt = self.stop.should_stop()
        if halt or last or (self.every and steps_done % self.every == 0):
            self.manager.save(steps_done, model, optimizer, extra=extra)
            self.prune()
        if halt and self.grid.rank == 0:
            print(f"{self.name}: {self.stop.signal_name or 'a stop signal'} received; saved step {steps_done} to "
                  f"{self.save_dir}; exiting (resume with --resume {self.save_dir})", flush=True)
        return halt

    def prune(self) -> list[str]:
        """Delete (rank 0) the complete checkpoints under ``--save`` older than the newest ``--keep``, except the one
        ``--resume`` loaded; returns what was deleted."""
        if self.grid.rank != 0 or not self.keep or self.save_dir is None:
            return []
        old = [p for p in list_checkpoints(self.save_dir)[:-self.keep] if os.path.realpath(p) != self.resumed_from]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
        return old

    def close(self) -> None:
        """Put the previous signal handlers back."""
        if self.stop is not None:
            self.stop.uninstall()
