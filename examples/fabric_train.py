"""A Lightning Fabric training loop on axgrid's grid: the loop as Fabric users write it, with
``strategy=AxgridStrategy(...)`` the one change. A tiny random Llama (built-in plan) learns the shipped text's bytes.

    python examples/fabric_train.py --grid 2x1x1x2                    # Fabric's launcher starts the 4 processes
    torchrun --nproc-per-node 4 examples/fabric_train.py --grid 2x1x1x2                  # torchrun
    srun -N 1 --ntasks-per-node 4 python examples/fabric_train.py --grid 2x1x1x2     # Slurm (Fabric wants
                                                                      # --ntasks-per-node; more nodes: --num-nodes)
    python examples/fabric_train.py --grid 2x1x1x2 --precision bf16-mixed            # or bf16-true
    python examples/fabric_train.py --grid 1x1x2x2 --accum 2 --save runs/fabric --save-at 3
    python examples/fabric_train.py --grid 2x1x1x2 --resume runs/fabric          # resumes step 3 on another grid

Needs ``lightning-fabric`` (``pip install axgrid[lightning]``). See docs/training.md#lightning-fabric.
"""
from __future__ import annotations

import argparse
from typing import Any, Optional, Sequence

import torch
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

import axgrid
from axgrid.data import DEFAULT_TEXT
from axgrid.integrations.lightning import AxgridStrategy


def make_model(seed: int = 0) -> torch.nn.Module:
    """A random tiny Llama with a 256-entry vocabulary (bytes), the same on every rank."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                        tie_word_embeddings=False))


def byte_windows(count: int, seq: int) -> torch.Tensor:
    """The first ``count`` windows of ``seq + 1`` bytes of the shipped text, ``[count, seq + 1]``."""
    data = DEFAULT_TEXT.read_bytes()[: count * (seq + 1)]
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long().view(count, seq + 1)


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", default="2x1x1x2")
    ap.add_argument("--zero", type=int, default=1)
    ap.add_argument("--overlap", default="all")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8, help="global batch in sequences (every micro-batch together)")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per step (gradient accumulation)")
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--precision", default="32-true", help="Fabric's precision: 32-true, bf16-mixed or bf16-true")
    ap.add_argument("--devices", type=int, default=None, help="processes per node (default: the grid's ranks)")
    ap.add_argument("--num-nodes", type=int, default=1)
    ap.add_argument("--save", metavar="DIR", help="checkpoint root: fabric.save writes DIR/step-N there")
    ap.add_argument("--save-at", type=int, default=None, help="the step after which to save (default: the last)")
    ap.add_argument("--resume", metavar="DIR", help="fabric.load the checkpoint (a root or a step-N folder)")
    args = ap.parse_args(argv)
    devices = args.devices or axgrid.GridShape.parse(args.grid).size // args.num_nodes   # the one grid grammar

    strategy = AxgridStrategy(args.grid, zero=args.zero, overlap=args.overlap,
                              config=axgrid.RuntimeConfig(timeout_s=120, seed=0))
    fabric = Fabric(accelerator="cpu", devices=devices, num_nodes=args.num_nodes, strategy=strategy,
                    precision=args.precision)
    fabric.launch()
    env = strategy.cluster_environment
    fabric.print(f"fabric_train: {fabric.world_size} ranks ({type(env).__name__}), grid {strategy.grid.shape}, "
                 f"precision {args.precision}")
    gd = strategy.grid.size("d")
    if args.batch % (gd * args.accum):
        raise SystemExit(f"--batch {args.batch} does not split into Gd={gd} x --accum {args.accum} micro-batches")

    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, opt = fabric.setup(model, opt)                   # parallelized; AdamW's state sharded over d (zero=1)
    ids = torch.arange(args.steps * args.batch)             # which window each row is (returned for the tests)
    data = TensorDataset(ids, byte_windows(args.steps * args.batch, args.seq))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=args.batch // (gd * args.accum)))   # over d only

    start = 0
    if args.resume:
        start = fabric.load(args.resume, {"model": model, "optimizer": opt})["step"]
        fabric.print(f"resumed from {args.resume} at step {start}")
    batches = iter(loader)
    for _ in range(start * args.accum):                     # the data the run before consumed
        next(batches)
    losses, seen = [], []
    for step in range(start, args.steps):
        total = torch.zeros(())
        rows = []
        for i in range(args.accum):
            index, window = next(batches)
            x, y = window[:, :-1], window[:, 1:].contiguous()
            with fabric.no_backward_sync(model, enabled=i < args.accum - 1):
                loss = model(input_ids=x, labels=y, shift_labels=y).loss     # this d-rank's rows, mean
                fabric.backward(loss / args.accum)
            total += loss.detach() / args.accum
            rows += index.tolist()
        fabric.clip_gradients(model, opt, max_norm=args.clip)
        opt.step()
        opt.zero_grad()
        losses.append(float(fabric.all_reduce(total, reduce_op="mean")))    # the mean over d (equal in a block)
        seen.append(rows)
        fabric.print(f"step {step}: loss {losses[-1]:.6f}")
        if args.save and step + 1 == (args.save_at or args.steps):
            fabric.save(args.save, {"model": model, "optimizer": opt, "step": step + 1})
    coord = strategy.grid.coord
    # every rank's grid coordinate and the windows it read: the sampler splits over d only, so the ranks of one
    # d-group read the same ones
    mine = torch.tensor([coord.x, coord.y, coord.z, coord.d] + [r for rows in seen for r in rows])
    every = fabric.all_gather(mine).tolist()
    fabric.print("read by rank (x,y,z,d): " + "; ".join(f"{r} {tuple(v[:4])}: {v[4:]}" for r, v in enumerate(every)))
    strategy.teardown()
    return {"losses": losses, "rows": seen, "start": start, "coord": (coord.x, coord.y, coord.z, coord.d)}


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "fabric_train")     # errors said once, as one line (axgrid.launch.errors)
