"""Parallelize your own model: a small byte-level language model written in plain torch, made parallel with
``axgrid.parallelize`` (and a plan for the layers it cannot pair by itself), trained on the shipped text.

    axgrid launch -n 4 -- python examples/own_model.py --grid 2x2x1x1
    axgrid launch -n 4 -- python examples/own_model.py --grid 1x2x1x2 --steps 50

What becomes parallel, and what stays dense and why, is printed (``summary=True``). See docs/models.md.
"""
from __future__ import annotations

import argparse
from typing import Any, Optional, Sequence

import torch
from torch import nn

import axgrid
from axgrid.data import DEFAULT_TEXT, TextBatches


class Block(nn.Module):
    """A residual MLP block: ``x + down(gelu(up(norm(x))))``. Every op between ``up`` and ``down`` works per token,
    so the two can be paired: ``up`` keeps its output features split over the grid, ``down`` takes them split."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """Bytes in, next-byte logits out: ``[B, S]`` ids -> ``[B, S, 256]``. (It sees one byte at a time: a model
    of your own would add attention; see docs/models.md for pairing q, k, v with the output projection.)"""

    def __init__(self, hidden: int = 64, depth: int = 2, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)                     # the same weights on every rank before parallelize
        self.embed = nn.Embedding(256, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(depth))
        self.head = nn.Linear(hidden, 256)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def plan_for(model: TinyLM) -> dict:
    """Pair each block's up with its down; the head is left to parallelize (drop-in: replicated in and out)."""
    plan: dict = {}
    for i in range(len(model.blocks)):
        plan.update(axgrid.pair(f"blocks.{i}.up", f"blocks.{i}.down"))
    return plan


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", default="2x2x1x1")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8, help="global batch in sequences")
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args(argv)

    grid = axgrid.init(args.grid)
    model = TinyLM()
    axgrid.parallelize(model, grid, plan=plan_for(model), summary=True)    # in place; prints on rank 0
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = TextBatches(DEFAULT_TEXT, args.seq, seed=0)        # the same batch of step s on every rank

    def loss_of(ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = model(ids)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())   # mean over this rank's

    losses = []
    for step in range(args.steps):
        inputs, targets = data.batch(step, args.batch)              # [B, S], the global batch
        ids, tgt = axgrid.local_batch(inputs, grid), axgrid.local_batch(targets, grid)   # [B/Gd, S]
        out = axgrid.train_step(model, opt, lambda _: loss_of(ids, tgt), grid, clip=1.0)
        losses.append(float(grid.comm.all_reduce(out.loss.reshape(1), "d", average=True)[0]))
        if grid.rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step}: loss {losses[-1]:.4f} (ln 256 = 5.545 is a uniform guess)")
    grid.destroy()
    return {"losses": losses}


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "own_model")     # errors said once, as one line (axgrid.launch.errors)
