"""Replicated parameters stay replicas: find the ones that drifted apart, and make them one again.

A parameter replicated over tensor-parallel letters (a normal layer's bias over x, a norm's weight and an embedding
table over the other letter and z, a dense leftover over x, y and z) gets, on every replica, a gradient computed
from the same values -- in exact arithmetic. On a GPU some backward kernels are not deterministic (atomics in flash
attention's backward: the QKV bias sees a dy that differs in its last bits between x replicas), so replicas receive
slightly different updates and drift apart, silently; a checkpoint then keeps one replica and a resume changes the
others. (The embeddings' own backward accumulates deterministically: :mod:`axgrid.tensor_parallel.embedding`.)

:func:`check_replicas` compares, over the tensor-parallel block, a 64-bit fingerprint of every replicated parameter's
bits (one all-gather of one number per parameter), and repairs the ones whose replicas differ by broadcasting the
first replica's values along each replicated letter (collectives only for the parameters that drifted), with one
line on rank 0 naming them. ``axgrid.checkpoint.save_checkpoint`` calls it before writing, and the training driver
every ``StepSettings.replica_check_every`` steps. Data-parallel replicas (d) are left alone: their gradients are
all-reduced, so they receive identical updates.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from .gradients import finish_gradients, replicated_over
from ..device import host_read

if TYPE_CHECKING:
    from ..core.grid import Grid

TP_LETTERS = "xyz"
_INT_OF = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class ReplicaWarning(UserWarning):
    """Replicas of a parameter had drifted apart (and were made one again)."""


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """A 0-d int64 that differs when any bit of ``t`` differs (almost surely): its elements' bits, weighted by their
    position, summed with wrap-around."""
    bits = t.detach().reshape(-1).view(_INT_OF[t.element_size()]).to(torch.int64)
    weights = torch.arange(1, bits.numel() + 1, dtype=torch.int64, device=bits.device) * 0x9E3779B1
    return (bits * weights).sum()


def _tp_letters(p: torch.Tensor, grid: "Grid") -> str:
    return "".join(c for c in replicated_over(p) if c in TP_LETTERS and grid.size(c) > 1)


def check_replicas(model: torch.nn.Module, grid: "Grid", repair: bool = True) -> list[str]:
    """Names of the parameters of ``model`` whose tensor-parallel replicas differ on this grid (the same list on
    every rank); with ``repair`` they are made equal to their first replica's values. Collective over the grid.
    Every collective still writing into parameters or gradients completes first (ODP's all-gathers over d of
    ``zero`` >= 1, the ORS pipeline): a replica is read, and repaired, only when nothing else writes into it."""
    finish_gradients(grid)
    named = [(n, p) for n, p in model.named_parameters() if _tp_letters(p, grid)]
    if not named or grid.size("xyz") == 1:
        return []
    mine = torch.stack([fingerprint(p) for _, p in named])                      # [P]
    every = host_read(grid.comm.all_gather(mine, "xyz"))                        # [G_xyz * P], members' order
    members = sorted(grid.layout.group_of(grid.rank, "xyz"))                    # the all-gather's order
    coords = [grid.layout.coord(r) for r in members]
    own = members.index(grid.rank)
    P = len(named)
    drifted = []
    for j, (_, p) in enumerate(named):
        fixed = [c for c in TP_LETTERS if c not in _tp_letters(p, grid)]       # the replicas share these
        peers = [i for i, c in enumerate(coords) if all(c[f] == grid.coord[f] for f in fixed)]
        drifted.append(int(any(every[i * P + j] != every[own * P + j] for i in peers)))
    flags = grid.comm.all_reduce(torch.tensor(drifted, dtype=torch.int64, device=mine.device), "xyz")
    bad = [n for (n, _), flag in zip(named, host_read(flags)) if flag]      # one verdict for the whole block
    if bad and repair:
        with torch.no_grad():
            for name, p in named:
                if name in bad:
                    for letter in _tp_letters(p, grid):                          # replica 0 along each letter
                        p.copy_(grid.comm.broadcast(p.detach().clone(), letter, 0))
    if bad and grid.rank == 0:
        warnings.warn(f"axgrid: tensor-parallel replicas of {len(bad)} parameter(s) had drifted apart ("
                      f"{', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''}: a non-deterministic backward kernel)"
                      f"{'; made equal to their first replica' if repair else ''}", ReplicaWarning, stacklevel=2)
    return bad


__all__ = ["ReplicaWarning", "check_replicas", "fingerprint"]
