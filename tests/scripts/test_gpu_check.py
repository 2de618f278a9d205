"""experiments/checks/gpu_check.sh on a CPU-only machine: it fails fast with a one-line reason and exit status 2, both
at the device-node probe and (when a GPU tool is on PATH but torch sees no GPU) at torch's check. Its memory check
(experiments/checks/memory_check.py: a training step's peak against perfmodel's prediction) runs here on the CPU."""
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from helpers import ROOT

SCRIPT = os.path.join(ROOT, "experiments", "checks", "gpu_check.sh")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: run the script itself")


def run(env_path: str) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PATH=env_path, PYTHON=sys.executable)
    t0 = time.perf_counter()
    p = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    return p, time.perf_counter() - t0


@pytest.mark.skipif(os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None,
                    reason="a GPU device node or nvidia-smi exists here")
def test_fails_at_once_without_a_device():
    p, dt = run(os.environ["PATH"])
    assert p.returncode == 2
    assert p.stderr.strip().startswith("gpu_check: FAIL: no GPU") and len(p.stderr.strip().splitlines()) == 1
    assert dt < 5


def test_fails_clearly_when_torch_sees_no_gpu(tmp_path):
    fake = tmp_path / "nvidia-smi"                    # a GPU tool on PATH gets past the probe to torch's check
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    p, _ = run(f"{tmp_path}:{os.environ['PATH']}")
    assert p.returncode == 2
    assert "gpu_check: FAIL: torch" in p.stderr and "sees no CUDA GPU" in p.stderr
    assert "Traceback" not in p.stderr


MEMORY_CHECK = os.path.join(ROOT, "experiments", "checks", "memory_check.py")


def test_memory_check_passes_on_cpu():
    """The check gpu_check.sh runs as its step 6, on the CPU: the step's peak of live tensor bytes is within 10% of
    perfmodel.memory's prediction for the CPU (gloo) device, and the line says so."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, MEMORY_CHECK, "--device", "cpu", "--layers", "2", "--hidden", "64", "--seq",
                        "64", "--batch", "4", "--vocab", "256", "--dtype", "bf16"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    line = p.stdout.strip().splitlines()[-1]
    assert line.startswith("memory_check:") and line.endswith("PASS (within 10%)") and "device CPU_GLOO" in line
    ratio = float(line.split("measured/predicted ")[1].split(":")[0])
    assert abs(ratio - 1) <= 0.10


LOAD_CHECK = os.path.join(ROOT, "experiments", "checks", "load_check.py")


def test_load_check_passes_on_cpu():
    """The check gpu_check.sh runs as its step 7 (from_pretrained onto the device, host memory bounded), on the
    CPU with a small LLaMA: logits equal transformers', the bytes read equal the model's own, and the line says
    PASS."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, LOAD_CHECK, "--device", "cpu", "--hidden", "128", "--layers", "2", "--vocab",
                        "512", "--shard", "200KB"], capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    line = p.stdout.strip().splitlines()[-1]
    assert line.startswith("load_check:") and line.endswith("PASS") and " = own" in line, line
    assert "files) on cpu" in line and not line.split("(fp32, ")[1].startswith("1 files"), line   # sharded
