#!/usr/bin/env bash
# Single-GPU acceptance check for axgrid. Run from the repository root on a machine with one CUDA GPU:
#
#     bash experiments/checks/gpu_check.sh                  # PYTHON=... to pick the interpreter
#     PEAK_TFLOPS=989 bash experiments/checks/gpu_check.sh  # the GPU's dense bf16 peak, when axgrid.metrics.peaks lacks it
#
# Checks, in order (each prints one line; the first failure ends the script with a non-zero status):
#   1. a CUDA GPU is visible to torch (on a CPU-only machine: a one-line error and exit 2, in seconds);
#   2. NCCL initialises with world size 1 through axgrid.init("1x1x1x1") and an all-reduce gives the right sum;
#   3. the GEMM tuner's GPU path (kernels.GemmTuner, cupy/cuBLAS candidates when cupy is installed) tunes the
#      three GEMMs of a layer and its answers match torch.matmul;
#   4. a bf16 GPT (2 blocks, hidden 4096 by default) trains a few steps on the 1x1x1x1 grid, each step measured by
#      axgrid.metrics.StepMeter (the record train_gpt logs): per step the time, TFLOP/s, MFU against the device's
#      dense bf16 peak (axgrid.metrics.peaks, by device name), the allocator's peak memory and the energy
#      (NVML's total-energy counter through nvidia-ml-py, amdsmi on ROCm; the source, or why none, is printed);
#   5. memory: peak allocated / reserved in the last step (StepMeter resets the peak at each step's start), and
#      free / total on the device;
#   6. memory against the model: torch.cuda.max_memory_allocated of a training step (two micro-batches) against
#      perfmodel.memory's prediction, printing the ratio and PASS within 10% (experiments/checks/memory_check.py, which
#      also runs on the CPU: python experiments/checks/memory_check.py --device cpu);
#   7. axgrid.from_pretrained(device="cuda") of a sharded ~100M LLaMA written by save_pretrained: logits equal
#      transformers', bytes read equal the parameters', GPU memory grows by exactly the parameters and the host's
#      peak RSS by at most one tensor + 80 MiB (experiments/checks/load_check.py; also --device cpu).
# Sizes: GPU_CHECK_HIDDEN, GPU_CHECK_LAYERS, GPU_CHECK_SEQ, GPU_CHECK_BATCH, GPU_CHECK_STEPS.
set -euo pipefail
cd "$(dirname "$0")/../.."
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
from axgrid.metrics import resolve_peak
peak = resolve_peak(props.name, "bf16", is_cpu=False,
                    peak_flops=float(os.environ["PEAK_TFLOPS"]) * 1e12 if os.environ.get("PEAK_TFLOPS") else None)
print(f"gpu_check: device {props.name}, {props.total_memory / 2**30:.1f} GiB, compute capability "
      f"{props.major}.{props.minor}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"bf16 peak {peak.flops / 1e12 if peak.flops else 'unknown (set PEAK_TFLOPS)'} TFLOP/s ({peak.source})",
      flush=True)

# 2. NCCL, world size 1, through axgrid's own launch path
for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
    os.environ.setdefault(k, v)
if "MASTER_PORT" not in os.environ:
    from axgrid.launch.env import free_port
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
from axgrid.metrics import StepMeter
meter = StepMeter(grid, flops_per_step=model.flops_per_iteration(batch), tokens_per_step=batch * seq, dtype="bf16",
                  peak_flops=peak.flops)
print(f"gpu_check: energy source: {meter.energy_source}", flush=True)
rows, losses = [], []


def bf16_loss(x, y):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return model(x, y)


for s in range(steps + 2):                     # the first two steps warm up (tuning, allocator), not kept
    meter.begin()
    loss = train_step(model, opt, lambda _: bf16_loss(x, y), grid).loss
    row = meter.end(s, loss=loss)
    losses.append(row["loss"])
    if s >= 2:
        rows.append(row)
meter.close()
if not all(map(lambda v: v == v and v < 1e4, losses)):
    fail(f"GPT losses are not finite: {losses}")
for r in rows:
    mfu = f", MFU {r['mfu']:.1%}" if r["mfu"] is not None else ""
    energy = (f", {r['energy_j']:.1f} J, {r['power_w']:.0f} W, {r['tokens_per_j']:.0f} tokens/J"
              if r["energy_j"] is not None else ", energy n/a")
    print(f"gpu_check: step {r['step']}: {r['step_s'] * 1e3:.1f} ms, {r['tflops']:.1f} TFLOP/s{mfu}, peak "
          f"allocated {r['peak_mem_bytes'] / 2**30:.2f} GiB{energy}", flush=True)
mid = sorted(rows, key=lambda r: r["step_s"])[len(rows) // 2]
share = f", MFU {mid['mfu']:.1%} of the {peak.flops / 1e12:.0f} TFLOP/s bf16 peak" if mid["mfu"] is not None else ""
print(f"gpu_check: bf16 GPT layers {layers} hidden {hidden} seq {seq} batch {batch}: {mid['step_s'] * 1e3:.1f} ms/step "
      f"(median of {steps}), {mid['tflops']:.1f} TFLOP/s{share}; loss {losses[0]:.3f} -> {losses[-1]:.3f}",
      flush=True)
if meter.energy.available and not any((r["energy_j"] or 0) > 0 for r in rows):
    fail(f"energy source {meter.energy_source!r} gave no positive energy in any step: "
         f"{[r['energy_j'] for r in rows]}")

# 5. memory
free, total = torch.cuda.mem_get_info(dev)
print(f"gpu_check: memory (last step) peak allocated {torch.cuda.max_memory_allocated(dev) / 2**30:.2f} GiB, peak reserved "
      f"{torch.cuda.max_memory_reserved(dev) / 2**30:.2f} GiB, free {free / 2**30:.1f} / {total / 2**30:.1f} GiB",
      flush=True)

# 6. memory against perfmodel's prediction, 7. from_pretrained straight onto the GPU, host memory bounded: each its
# own script (experiments/checks/), run on this GPU once this process has let go of it
del model, opt
grid.destroy()
torch.cuda.empty_cache()
import subprocess
checks = (("memory_check.py", ["--layers", str(layers), "--hidden", str(hidden), "--seq", str(seq), "--batch",
                               str(batch)], "training-step memory is not within 10% of perfmodel's prediction"),
          ("load_check.py", [], "from_pretrained(device='cuda') did not pass"))
for script, args, what in checks:
    res = subprocess.run([sys.executable, os.path.join("experiments", "checks", script), "--device", "cuda", *args],
                         capture_output=True, text=True)
    line = (res.stdout.strip().splitlines() or [res.stderr.strip()])[-1]
    print(f"gpu_check: {line}", flush=True)
    if res.returncode != 0:
        fail(f"{what}: {line}")
print("gpu_check: PASS")
EOF
