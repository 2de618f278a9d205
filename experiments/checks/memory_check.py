"""A training step's peak memory against perfmodel's prediction: the GPT on a grid (1x1x1x1 by default), one
warm-up step (AdamW's state exists from then on), then one measured step of two micro-batches (the second starts
with gradients live, as ``perfmodel.memory`` prices the peak). On a GPU the measure is the allocator's
``max_memory_allocated`` (its peak, reset before the step); on the CPU, the peak of live tensor bytes
(``axgrid.metrics.memtrack.LiveBytes``); on several ranks, the largest rank's. The prediction is
``perfmodel.memory.memory_per_gpu`` for the same model, grid, ``--zero`` mode and micro-batch, on the device it ran
on (``memory.GPU`` or ``memory.CPU_GLOO``). One line:

    memory_check: bf16 GPT layers 2 hidden 64 seq 64 micro-batch 2: peak 3.2 MiB, predicted 3.2 MiB
    (perfmodel.memory, device CPU_GLOO), measured/predicted 1.000: PASS (within 10%)

``experiments/checks/gpu_check.sh`` runs :func:`check` on the GPU; ``python experiments/checks/memory_check.py --device cpu``
runs it here (tests/test_gpu_check.py), with small sizes. On a grid of several ranks, under a launcher, e.g. the
memory of each ``zero`` mode (docs/results.md):

    axgrid launch -n 4 -- python experiments/checks/memory_check.py --device cpu --grid 1x2x1x2 --zero 2 \
        --hidden 256 --seq 128 --vocab 8192 --batch 8 --dtype fp32
"""
from __future__ import annotations

import argparse
import sys

import torch

from axgrid.device import cuda as gpu

TOLERANCE = 0.10


def check(grid, layers: int, hidden: int, seq: int, batch: int, vocab: int = 51200, heads: int | None = None,
          dtype: str = "bf16", fused: bool | None = None) -> tuple[int, float, bool, str]:
    """Train the GPT one warm-up step and one measured step (``batch`` sequences as 2 micro-batches, split over d
    and z) on ``grid`` with its ``RuntimeConfig.zero``; returns (measured peak bytes of the largest rank,
    predicted bytes, within 10%, the report line)."""
    import axgrid
    from axgrid.metrics import memtrack
    from axgrid.models.gpt import GPT, GPTConfig
    from axgrid.perfmodel import Options
    from axgrid.perfmodel.memory import CPU_GLOO, GPU, memory_per_gpu
    from axgrid.spec import TransformerShape
    from axgrid.train import train_step
    gd, gz = grid.size("d"), grid.size("z")
    if batch % (2 * gd * gz):
        raise ValueError(f"memory check: batch {batch} does not split into 2 micro-batches of whole sequences over "
                         f"Gd*Gz = {gd * gz} (grid {grid.shape})")
    dev = grid.device
    config = grid.runtime.config
    heads = heads or max(1, hidden // 128)
    spec = TransformerShape("memory-check", layers, hidden, heads, seq=seq, vocab=vocab)
    model = GPT(GPTConfig(spec), grid)
    grid.watch(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda" if fused is None else fused)
    opt = axgrid.shard_optimizer(opt, model, grid)
    gen = torch.Generator().manual_seed(0)
    per = batch // 2 // gd                           # this data-parallel rank's sequences per micro-batch
    d = grid.index("d")
    data = [torch.randint(0, vocab, (batch // 2, seq + 1), generator=gen)[d * per:(d + 1) * per].to(dev)
            for _ in range(2)]

    def loss_of(i: int) -> torch.Tensor:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            return model(data[i][:, :-1], data[i][:, 1:], normalizer=float(batch * seq / gd))

    train_step(model, opt, loss_of, grid, microbatches=2)          # AdamW's state exists from here on
    acc = grid.accelerator
    if acc.is_gpu:
        acc.synchronize()
        acc.reset_peak_memory()
        train_step(model, opt, loss_of, grid, microbatches=2)
        acc.synchronize()
        measured, where = acc.peak_memory(), "GPU"
    else:
        lay = getattr(next(model.parameters()), "axgrid_buckets", None)
        live = memtrack.LiveBytes(memtrack.optimizer_tensors(opt))
        live.track(model.parameters())
        live.track(p.grad for p in model.parameters())
        live.track(lay.buffers()["grads"] if lay is not None else ())
        with live:
            train_step(model, opt, loss_of, grid, microbatches=2)
        measured, where = live.peak, "CPU_GLOO"
    if grid.world_size > 1:                          # the largest rank's
        peak = torch.tensor([float(measured)], device=dev)
        peak = grid.comm.all_gather(peak, "xyz").max().reshape(1)
        measured = int(grid.comm.all_gather(peak, "d").max())
    b = 2 if dtype == "bf16" else 4
    ov = config.overlap
    opts = Options(recompute=False, keep_gathered=ov.keep_gathered_weights, overlap_ar=ov.oar, overlap_rs=ov.ors,
                   overlap_ag=ov.oag, overlap_dp=ov.odp, zero=config.zero, bucket_bytes=config.bucket_bytes)
    gx, gy = grid.size("x"), grid.size("y")
    mem = memory_per_gpu(spec, gx, gy, gz, gd, batch // 2 // gd // gz * seq, b, dtype == "fp32", opts,
                         device=GPU if where == "GPU" else CPU_GLOO)
    predicted = float(mem.total)
    ratio = measured / predicted
    ok = abs(ratio - 1) <= TOLERANCE
    on = f" on {grid.shape} zero={config.zero}" if grid.world_size > 1 else ""
    line = (f"memory_check: {dtype} GPT layers {layers} hidden {hidden} seq {seq} micro-batch {batch // 2}{on}: peak "
            f"{measured / 2**20:.1f} MiB, predicted {predicted / 2**20:.1f} MiB (perfmodel.memory, device {where}), "
            f"measured/predicted {ratio:.3f}: {'PASS' if ok else 'FAIL'} (within {TOLERANCE:.0%})")
    return measured, predicted, ok, line


def one_rank_grid(check_name: str, device: str, spec: str = "1x1x1x1", zero: int = 0,
                  bucket_bytes: int | None = None, overlap: str = "none"):
    """A grid for a check run as a plain process (``axgrid.init`` needs no launcher for one rank; more ranks come
    from ``axgrid launch``), one thread; None, after a one-line FAIL naming ``check_name``, when ``device`` is cuda
    and torch sees no GPU."""
    if device == "cuda" and gpu.count() == 0:
        print(f"{check_name}: FAIL: --device cuda but torch {torch.__version__} sees no CUDA GPU", file=sys.stderr)
        return None
    torch.set_num_threads(1)
    import axgrid
    kw = {"bucket_bytes": bucket_bytes} if bucket_bytes else {}
    return axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=120, seed=0, zero=zero,
                                                         overlap=axgrid.OverlapConfig.parse(overlap), **kw))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if gpu.count() > 0 else "cpu")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4, help="sequences per step (two micro-batches)")
    ap.add_argument("--vocab", type=int, default=51200)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--grid", default="1x1x1x1", help="GXxGYxGZxGD (more than one rank: under axgrid launch -n N)")
    ap.add_argument("--zero", type=int, choices=(0, 1, 2), default=0, help="RuntimeConfig.zero (Gd > 1)")
    ap.add_argument("--overlap", default="none", help="oar,ors,oag,odp | all | none")
    ap.add_argument("--bucket-mib", type=float, default=None, help="data-parallel bucket size (default 25 MiB)")
    a = ap.parse_args(argv)
    bucket = int(a.bucket_mib * 2**20) if a.bucket_mib else None
    grid = one_rank_grid("memory_check", a.device, a.grid, a.zero, bucket, a.overlap)
    if grid is None:
        return 2
    try:
        _, _, ok, line = check(grid, a.layers, a.hidden, a.seq, a.batch, a.vocab, dtype=a.dtype)
        if grid.rank == 0:
            print(line, flush=True)
    finally:
        grid.destroy()
    return 0 if ok else 1


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "memory_check")     # errors said once, as one line (axgrid.launch.errors)
