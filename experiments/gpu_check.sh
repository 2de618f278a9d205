#!/usr/bin/env bash
# Single-GPU acceptance check for axgrid. Run from the repository root on a machine with one CUDA GPU:
#
#     bash experiments/gpu_check.sh                  # PYTHON=... to pick the interpreter
#     PEAK_TFLOPS=989 bash experiments/gpu_check.sh  # the GPU's dense bf16 peak, when its name is not known below
#
# Checks, in order (each prints one line; the first failure ends the script with a non-zero status):
#   1. a CUDA GPU is visible to torch (on a CPU-only machine: a one-line error and exit 2, in seconds);
#   2. NCCL initialises with world size 1 through axgrid.init("1x1x1x1") and an all-reduce gives the right sum;
#   3. the GEMM tuner's GPU path (kernels.GemmTuner, cupy/cuBLAS candidates when cupy is installed) tunes the
#      three GEMMs of a layer and its answers match torch.matmul;
#   4. a bf16 GPT (2 blocks, hidden 4096 by default) trains a few steps on the 1x1x1x1 grid, timed with CUDA
#      events: TFLOP/s per step and its share of the GPU's bf16 peak;
#   5. memory: peak allocated / reserved by the training step, and free / total on the device;
#   6. memory against the model: torch.cuda.max_memory_allocated of a training step (two micro-batches) against
#      perfmodel.memory's prediction, printing the ratio and PASS within 10% (experiments/memory_check.py, which
#      also runs on the CPU: python experiments/memory_check.py --device cpu).
# Sizes: GPU_CHECK_HIDDEN, GPU_CHECK_LAYERS, GPU_CHECK_SEQ, GPU_CHECK_BATCH, GPU_CHECK_STEPS.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# Fail fast without importing torch when there is plainly no NVIDIA/AMD device node.
if ! ls /dev/nvidia0 /dev/kfd >/dev/null 2>&1 && ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: FAIL: no GPU on this machine (no /dev/nvidia0 or /dev/kfd, no nvidia-smi); this check needs one CUDA GPU" >&2
    exit 2
fi

exec "$PY" - "$@" <<'EOF'
import os
import sys
import tempfile
import time

import torch

def fail(msg: str) -> None:
    print(f"gpu_check: FAIL: {msg}", file=sys.stderr)
    sys.exit(2)

if not torch.cuda.is_available():
    fail(f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False); this check needs one")

import axgrid
from axgrid import kernels
from axgrid.models.gpt import GPT, GPTConfig
from axgrid.train import train_step

dev = torch.device("cuda", 0)
props = torch.cuda.get_device_properties(dev)
PEAKS = {"H200": 989.0, "H100 SXM": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.0, "GH200": 989.0,
         "A100": 312.0, "A800": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0, "A10": 125.0, "V100": 125.0,
         "MI300X": 1307.0, "MI250X": 383.0, "MI250": 362.0}
peak = float(os.environ["PEAK_TFLOPS"]) if os.environ.get("PEAK_TFLOPS") else \
    next((v for k, v in PEAKS.items() if k in props.name), None)
print(f"gpu_check: device {props.name}, {props.total_memory / 2**30:.1f} GiB, compute capability "
      f"{props.major}.{props.minor}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"bf16 peak {peak if peak else 'unknown (set PEAK_TFLOPS)'} TFLOP/s", flush=True)

# 2. NCCL, world size 1, through axgrid's own launch path
for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
    os.environ.setdefault(k, v)
if "MASTER_PORT" not in os.environ:
    from axgrid.launch import free_port
    os.environ["MASTER_PORT"] = str(free_port())
t0 = time.perf_counter()
cache = os.path.join(tempfile.mkdtemp(prefix="gpu_check-"), "gemm.json")
grid = axgrid.init("1x1x1x1", config=axgrid.RuntimeConfig(timeout_s=120, gemm_tuning="on-first-use",
                                                          gemm_cache=cache))
import torch.distributed as dist
if grid.backend != "nccl":
    fail(f"axgrid chose backend {grid.backend!r} on a GPU machine; expected 'nccl'")
one = torch.ones(1024, device=dev)
dist.all_reduce(one)
torch.cuda.synchronize()
if float(one.sum()) != 1024.0:
    fail(f"NCCL all-reduce over 1 rank gave sum {float(one.sum())}, expected 1024")
print(f"gpu_check: NCCL world size 1 ok ({time.perf_counter() - t0:.2f} s to init and all-reduce)", flush=True)

# 3. the GEMM tuner's GPU path (cupy/cuBLAS candidates when cupy is installed)
from axgrid.kernels.candidates import cupy_version
tuner = grid.runtime.gemm_fn
m, n, k = 4096, 4096, 4096
for role in ("forward", "input_grad", "weight_grad"):
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    got, want = tuner(a, b, role).float(), (a @ b).float()
    err = float((got - want).abs().max() / want.abs().max())
    if err > 2e-2:
        fail(f"GEMM tuner ({role}) differs from torch.matmul by {err:.3g} (relative)")
choices = {sig: e.get("choice", e) for sig, e in tuner.entries().items()} if hasattr(tuner, "entries") else {}
print(f"gpu_check: GEMM tuner ok, cupy {cupy_version() or 'not installed (torch candidates only)'}; "
      f"decisions: {choices}", flush=True)

# 4. bf16 GPT training steps, CUDA-event timing
hidden = int(os.environ.get("GPU_CHECK_HIDDEN", "4096"))
layers = int(os.environ.get("GPU_CHECK_LAYERS", "2"))
seq = int(os.environ.get("GPU_CHECK_SEQ", "2048"))
batch = int(os.environ.get("GPU_CHECK_BATCH", "4"))
steps = int(os.environ.get("GPU_CHECK_STEPS", "5"))
cfg = GPTConfig(layers, hidden, max(1, hidden // 128), seq, 51200, name="gpu-check")
model = GPT(cfg, grid)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
x = torch.randint(0, cfg.vocab, (batch, seq), device=dev)
y = torch.randint(0, cfg.vocab, (batch, seq), device=dev)
torch.cuda.reset_peak_memory_stats(dev)
times, losses = [], []


def bf16_loss(x, y):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return model(x, y)


for s in range(steps + 2):                     # the first two steps warm up (tuning, allocator), not timed
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    loss = train_step(model, opt, lambda _: bf16_loss(x, y), grid).loss
    end.record()
    end.synchronize()
    losses.append(float(loss))
    if s >= 2:
        times.append(start.elapsed_time(end) / 1e3)
if not all(map(lambda v: v == v and v < 1e4, losses)):
    fail(f"GPT losses are not finite: {losses}")
times.sort()
t = times[len(times) // 2]
flops = model.flops_per_iteration(batch)
tf = flops / t / 1e12
share = f", {tf / peak:.1%} of the {peak:.0f} TFLOP/s bf16 peak" if peak else ""
print(f"gpu_check: bf16 GPT layers {layers} hidden {hidden} seq {seq} batch {batch}: {t * 1e3:.1f} ms/step "
      f"(median of {steps}, CUDA events), {tf:.1f} TFLOP/s{share}; loss {losses[0]:.3f} -> {losses[-1]:.3f}",
      flush=True)

# 5. memory
free, total = torch.cuda.mem_get_info(dev)
print(f"gpu_check: memory peak allocated {torch.cuda.max_memory_allocated(dev) / 2**30:.2f} GiB, peak reserved "
      f"{torch.cuda.max_memory_reserved(dev) / 2**30:.2f} GiB, free {free / 2**30:.1f} / {total / 2**30:.1f} GiB",
      flush=True)

# 6. memory against perfmodel's prediction
sys.path.insert(0, os.path.join(os.getcwd(), "experiments"))
from memory_check import check as memory_check
del model, opt
torch.cuda.empty_cache()
_, _, mem_ok, mem_line = memory_check(grid, layers, hidden, seq, batch)
print(f"gpu_check: {mem_line}", flush=True)
if not mem_ok:
    fail(f"training-step memory is not within 10% of perfmodel's prediction: {mem_line}")
grid.destroy()
print("gpu_check: PASS")
EOF
