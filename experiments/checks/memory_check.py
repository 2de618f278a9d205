"""A training step's peak memory against perfmodel's prediction: the GPT on a 1x1x1x1 grid, one warm-up
step (AdamW's state exists from then on), then one measured step of two micro-batches (the second starts with
gradients live, as ``perfmodel.memory`` prices the peak). On CUDA the measure is
the CUDA allocator's ``max_memory_allocated`` (its peak, reset before the step); on the CPU, the peak of live
tensor bytes (``axgrid.metrics.memtrack.LiveBytes``). The prediction is ``perfmodel.memory.memory_per_gpu`` for the same
model, grid and micro-batch, on the device it ran on (``memory.GPU`` or ``memory.CPU_GLOO``). One line:

    memory_check: bf16 GPT layers 2 hidden 64 seq 64 micro-batch 2: peak 3.2 MiB, predicted 3.2 MiB
    (perfmodel.memory, device CPU_GLOO), measured/predicted 1.000: PASS (within 10%)

``experiments/checks/gpu_check.sh`` runs :func:`check` on the GPU; ``python experiments/checks/memory_check.py --device cpu``
runs it here (tests/test_gpu_check.py), with small sizes.
"""
from __future__ import annotations

import argparse
import sys

import torch

from axgrid.device import cuda as gpu

TOLERANCE = 0.10


def check(grid, layers: int, hidden: int, seq: int, batch: int, vocab: int = 51200, heads: int | None = None,
          dtype: str = "bf16", fused: bool | None = None) -> tuple[int, float, bool, str]:
    """Train the GPT one warm-up step and one measured step (``batch`` sequences as 2 micro-batches) on ``grid``
    (1x1x1x1); returns (measured peak bytes, predicted bytes, within 10%, the report line)."""
    from axgrid.metrics import memtrack
    from axgrid.models.gpt import GPT, GPTConfig
    from axgrid.perfmodel import Options, TransformerSpec
    from axgrid.perfmodel.memory import CPU_GLOO, GPU, memory_per_gpu
    from axgrid.train import train_step
    if grid.world_size != 1 or batch % 2:
        raise ValueError(f"memory check: a 1x1x1x1 grid and an even batch (2 micro-batches), got grid {grid.shape} "
                         f"and batch {batch}")
    dev = grid.device
    heads = heads or max(1, hidden // 128)
    cfg = GPTConfig(layers, hidden, heads, seq, vocab, name="memory-check")
    model = GPT(cfg, grid)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda" if fused is None else fused)
    gen = torch.Generator().manual_seed(0)
    data = [torch.randint(0, vocab, (batch // 2, seq + 1), generator=gen).to(dev) for _ in range(2)]

    def loss_of(i: int) -> torch.Tensor:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            return model(data[i][:, :-1], data[i][:, 1:], normalizer=float(batch * seq))

    train_step(model, opt, loss_of, grid, microbatches=2)          # AdamW's state exists from here on
    acc = grid.accelerator
    if acc.is_gpu:
        acc.synchronize()
        acc.reset_peak_memory()
        train_step(model, opt, loss_of, grid, microbatches=2)
        acc.synchronize()
        measured, where = acc.peak_memory(), "GPU"
    else:
        live = memtrack.LiveBytes(memtrack.optimizer_tensors(opt))
        live.track(model.parameters())
        live.track(p.grad for p in model.parameters())
        with live:
            train_step(model, opt, loss_of, grid, microbatches=2)
        measured, where = live.peak, "CPU_GLOO"
    spec = TransformerSpec("memory-check", layers, hidden, heads, seq=seq, vocab=vocab)
    b = 2 if dtype == "bf16" else 4
    mem = memory_per_gpu(spec, 1, 1, 1, 1, batch // 2 * seq, b, dtype == "fp32",
                         Options(recompute=False, keep_gathered=False), device=GPU if where == "GPU" else CPU_GLOO)
    predicted = float(mem.total)
    ratio = measured / predicted
    ok = abs(ratio - 1) <= TOLERANCE
    line = (f"memory_check: {dtype} GPT layers {layers} hidden {hidden} seq {seq} micro-batch {batch // 2}: peak "
            f"{measured / 2**20:.1f} MiB, predicted {predicted / 2**20:.1f} MiB (perfmodel.memory, device {where}), "
            f"measured/predicted {ratio:.3f}: {'PASS' if ok else 'FAIL'} (within {TOLERANCE:.0%})")
    return measured, predicted, ok, line


def one_rank_grid(check_name: str, device: str):
    """A 1x1x1x1 grid for a check run as a plain process (``axgrid.init`` needs no launcher for one rank), one
    thread; None, after a one-line FAIL naming ``check_name``, when ``device`` is cuda and torch sees no GPU."""
    if device == "cuda" and gpu.count() == 0:
        print(f"{check_name}: FAIL: --device cuda but torch {torch.__version__} sees no CUDA GPU", file=sys.stderr)
        return None
    torch.set_num_threads(1)
    import axgrid
    return axgrid.init("1x1x1x1", config=axgrid.RuntimeConfig(timeout_s=120, seed=0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if gpu.count() > 0 else "cpu")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4, help="sequences per step (two micro-batches)")
    ap.add_argument("--vocab", type=int, default=51200)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    a = ap.parse_args(argv)
    grid = one_rank_grid("memory_check", a.device)
    if grid is None:
        return 2
    try:
        _, _, ok, line = check(grid, a.layers, a.hidden, a.seq, a.batch, a.vocab, dtype=a.dtype)
    finally:
        grid.destroy()
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
