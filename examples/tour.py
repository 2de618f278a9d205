"""The README's tour, runnable: one layer, a model, this rank's share of a batch, a step by hand, the same step in
micro-batches, and the communication ledger.

    axgrid launch -n 8 -- python examples/tour.py                    # grid 2x2x2x1
    axgrid launch -n 4 -- python examples/tour.py --grid 1x2x1x2     # any grid of as many ranks as you start

Every rank runs this file; the grid's sizes must multiply to the number of ranks.
"""
from __future__ import annotations

import argparse
from typing import Any, Optional, Sequence

import torch
from torch import nn

import axgrid


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", default="2x2x2x1", help="GXxGYxGZxGD (default 2x2x2x1: 8 ranks)")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args(argv)

    grid = axgrid.init(args.grid)                    # every rank calls it with the same grid
    say = print if grid.rank == 0 else (lambda *a, **k: None)
    say(grid.describe())                             # which ranks form each group, which groups stay in a node

    # One layer: a drop-in for nn.Linear. It takes and returns what nn.Linear would, on every rank.
    torch.manual_seed(0)                             # the same seed everywhere: the same input and weights
    layer = axgrid.nn.Linear(64, 256)
    y = layer(torch.randn(16, 64))                   # [16, 64] -> [16, 256]
    say(f"axgrid.nn.Linear(64, 256): {tuple(y.shape)}")

    # A model: any nn.Module. parallelize swaps its nn.Linear layers for parallel ones in place, weights kept
    # (here the two layers of the Sequential are paired: no redistribution between them).
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    axgrid.parallelize(model, grid)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)

    # Data: the same global batch on every rank; each data-parallel rank takes its share of the rows.
    gen = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(32, 64, generator=gen), torch.randn(32, 64, generator=gen)
    x, t = axgrid.local_batch(inputs, grid), axgrid.local_batch(targets, grid)     # [32, 64] -> [32/Gd, 64]

    # One step by hand.
    loss = nn.functional.mse_loss(model(x), t)       # the mean over this rank's rows
    loss.backward()
    axgrid.sync_gradients(model, grid)               # the mean over d: the gradient of the whole batch's mean
    axgrid.clip_grad_norm_(model, 1.0, grid)         # the global norm, every shard counted once
    opt.step()
    opt.zero_grad()

    # The same step, in 2 micro-batches: train_step averages them (all but the last run under grid.no_sync()),
    # so it trains with the whole batch's mean gradient too.
    xs, ts = x.chunk(2), t.chunk(2)
    losses = []
    for step in range(args.steps):
        out = axgrid.train_step(model, opt, lambda i: nn.functional.mse_loss(model(xs[i]), ts[i]), grid,
                                microbatches=2, clip=1.0)
        loss = float(grid.comm.all_reduce(out.loss.reshape(1), "d", average=True)[0])   # the whole batch's
        losses.append(loss)
        say(f"step {step}: loss {loss:.4f}")
    say(grid.ledger.table())                         # calls and bytes per grid dimension and collective
    weights = axgrid.dense_state_dict(model, grid)   # the dense model, on every rank (small models only)
    grid.destroy()
    return {"losses": losses, "layer_out": tuple(y.shape), "weights": weights}


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "tour")     # errors said once, as one line (axgrid.launch.errors)
