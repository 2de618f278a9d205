"""The main job: train an MLP stack 3D-parallel on the grid, check every step against serial training, and
print the communication ledger per grid dimension.

    axgrid launch -n 8 -- python -m axgrid.demo --grid 2x2x2x1
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.nn.functional import mse_loss

import axgrid
from axgrid.models import MLPStack
from axgrid.train import train_step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", default="2x2x2x1", help="GXxGYxGZxGD (product = number of ranks)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64, help="global batch in tokens")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--overlap", default="none", help="oar,ors,oag,odp | all | none")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a stuck collective fails")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    grid = axgrid.init(args.grid, config=axgrid.RuntimeConfig(timeout_s=args.timeout,
                                                              overlap=axgrid.OverlapConfig.parse(args.overlap)))
    rank0 = grid.rank == 0
    if rank0:
        print(grid.describe())
    gd, d = grid.size("d"), grid.coord.d
    if args.tokens % gd:
        raise SystemExit(f"--tokens {args.tokens} must be divisible by Gdata={gd}")
    par = MLPStack(args.hidden, args.depth, grid=grid, seed=1)
    ser = MLPStack(args.hidden, args.depth, grid=None, seed=1)
    opt_p = torch.optim.AdamW(par.parameters(), lr=args.lr)
    opt_s = torch.optim.AdamW(ser.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1234)
    per_d = args.tokens // gd
    worst = 0.0
    if rank0:
        print(f"\n{'step':>4} {'serial loss':>14} {'parallel loss':>14} {'|diff|':>10} {'time/step s':>12}")
    grid.ledger.reset()
    for step in range(args.steps):
        x = torch.randn(args.tokens, args.hidden, generator=gen)
        target = torch.randn(args.tokens, args.hidden, generator=gen)
        rows = slice(d * per_d, (d + 1) * per_d)
        t0 = time.perf_counter()
        loss_p = train_step(par, opt_p, lambda _: mse_loss(par(x[rows]), target[rows]), grid).loss
        dt = time.perf_counter() - t0
        loss_s = float(train_step(ser, opt_s, lambda _: mse_loss(ser(x), target), None).loss)
        mean_p = float(grid.comm.all_reduce(loss_p.reshape(1), "d", average=True)[0])
        diff = abs(mean_p - loss_s)
        worst = max(worst, diff)
        if rank0:
            print(f"{step:>4} {loss_s:>14.6f} {mean_p:>14.6f} {diff:>10.2e} {dt:>12.4f}")
    trained = grid.ledger.snapshot()
    # parameters after training: gather each parallel layer and compare with its serial twin
    pdiff = 0.0
    for p_layer, s_layer in zip(list(par.ups) + list(par.downs), list(ser.ups) + list(ser.downs)):
        dense = p_layer.to_dense().requires_grad_(False)
        s_layer.requires_grad_(False)
        pdiff = max(pdiff, float((dense.weight - s_layer.weight).abs().max()),
                    float((dense.bias - s_layer.bias).abs().max()))
    ok = worst < 1e-4 and pdiff < 1e-4
    if rank0:
        print(f"\nmax |loss diff| {worst:.2e}, max |parameter diff| after {args.steps} steps {pdiff:.2e}: "
              f"{'MATCH' if ok else 'MISMATCH'}")
        print(f"\ncommunication ledger of rank 0 over {args.steps} training steps (bytes = full buffer of each "
              f"collective, wire = ring bytes sent per rank; logging of the loss over d included):")
        ledger = axgrid.Ledger(trained)
        print(ledger.table())
        by_dim = ledger.bytes_by_dim()
        print("bytes per dimension: " + ", ".join(f"{k}={v:,}" for k, v in sorted(by_dim.items())))
    grid.destroy()
    return 0 if ok else 1


if __name__ == "__main__":
    from .launch.errors import run
    run(main, "axgrid.demo")
