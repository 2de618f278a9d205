"""experiments/checks/gpu_check.sh on a CPU-only machine, as far as the point where a GPU is needed: its arguments are
checked first; what it needs is checked without importing torch, and either installed into its own venv (--install)
or named with the one command that installs it; then it fails fast with a one-line reason and exit status 2, both at
the device-node probe and (when a GPU tool is on PATH but torch sees no GPU) at torch's check. Its grids for N GPUs,
its table, and its memory and load checks (experiments/checks/memory_check.py, load_check.py) run here on the CPU.
It has not run on a GPU (docs/results.md#not-measured-yet)."""
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from conftest import PRELOAD
from helpers import ROOT
from helpers.python_process import run_python

SCRIPT = os.path.join(ROOT, "experiments", "checks", "gpu_check.sh")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: run the script itself")


def run(env_path: str, *args: str, python: str = sys.executable) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PATH=env_path, PYTHON=python) if python else \
        {k: v for k, v in dict(os.environ, PATH=env_path).items() if k != "PYTHON"}
    t0 = time.perf_counter()
    p = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)
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
    assert p.stderr.strip() == (f"gpu_check: FAIL: torch {torch.__version__} (a CPU build) sees no GPU; this check "
                                f"needs one or more (install the torch for this node: bash "
                                f"experiments/checks/gpu_check.sh --install)")


def test_arguments_are_checked_before_anything_else():
    p, dt = run(os.environ["PATH"], "--gpus", "0")
    assert p.returncode == 2 and p.stderr.strip() == "gpu_check: --gpus 0: use 1 to 8 (the GPUs of one node)"
    p, _ = run(os.environ["PATH"], "--peak-tflops", "-3")
    assert p.returncode == 2 and "--peak-tflops -3" in p.stderr
    p, _ = run(os.environ["PATH"], "--help")
    assert p.returncode == 0 and "--install" in p.stdout and "MI250X" in p.stdout


def test_the_install_step_makes_its_own_venv(tmp_path):
    """--install: a venv that sees the packages of the Python it is made from (here everything the check needs is
    there already, as with a site's PyTorch module), then the probe: no GPU here."""
    venv = tmp_path / "venv"
    p, _ = run(os.environ["PATH"], "--install", "--venv", str(venv))
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stdout.strip() == f"gpu_check: venv {venv} ready (torch {torch.__version__})"
    assert p.stderr.startswith("gpu_check: FAIL: no GPU on this machine")
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys, importlib.util as u; "
                            "print(sys.prefix, all(u.find_spec(m) for m in ('torch', 'transformers', 'numpy')))"],
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0 and probe.stdout.split() == [str(venv), "True"], probe.stderr
    p, _ = run(os.environ["PATH"], "--venv", str(venv), python="")          # later runs use the venv
    assert p.stderr.startswith("gpu_check: FAIL: no GPU on this machine")


def test_what_is_missing_is_named_with_the_command_that_installs_it(tmp_path):
    """A Python without torch (the system's, here): one line naming what it lacks and the command."""
    bare = shutil.which("python3", path="/usr/bin:/bin")
    if bare is None or subprocess.run([bare, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("no Python without torch on this machine")
    p, _ = run(os.environ["PATH"], python=bare)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert p.stderr.startswith(f"gpu_check: FAIL: {bare} lacks torch") and \
        "install them with: bash experiments/checks/gpu_check.sh --install" in p.stderr
    assert f'"{bare}" -m pip install torch' in p.stderr


def test_grids_for_n_gpus_cover_every_dimension_and_the_table():
    from helpers import load_script
    check = load_script("checks/gpu_check.py")
    for n in (2, 4, 6, 8):
        grids = check.grids_for(n)
        shapes = [tuple(int(v) for v in g.split("x")) for g in grids]
        assert 2 <= len(grids) <= 4 and all(x * y * z * d == n for x, y, z, d in shapes), grids
        assert all(any(s[i] > 1 for s in shapes) for i in range(4)), (n, grids)     # x, y, z and d each > 1 once
    report = check.Report()
    report.add("device", True, "NVIDIA H100 80GB HBM3")
    report.add("flight", False, "a | b")
    assert report.table().splitlines() == ["| check | result | figures |", "|---|---|---|",
                                           "| device | PASS | NVIDIA H100 80GB HBM3 |", "| flight | FAIL | a / b |"]
    assert not report.passed


MEMORY_CHECK = os.path.join(ROOT, "experiments", "checks", "memory_check.py")


def test_memory_check_passes_on_cpu():
    """The check gpu_check.sh runs as its step 6, on the CPU: the step's peak of live tensor bytes is within 10% of
    perfmodel.memory's prediction for the CPU (gloo) device, and the line says so."""
    p = run_python([MEMORY_CHECK, "--device", "cpu", "--layers", "2", "--hidden", "64", "--seq", "64",
                    "--batch", "4", "--vocab", "256", "--dtype", "bf16"], timeout_s=120,
                   preload=tuple(PRELOAD))
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
    p = run_python([LOAD_CHECK, "--device", "cpu", "--hidden", "128", "--layers", "2", "--vocab", "512",
                    "--shard", "200KB"], timeout_s=180, preload=tuple(PRELOAD))
    assert p.returncode == 0, p.stdout + p.stderr
    line = p.stdout.strip().splitlines()[-1]
    assert line.startswith("load_check:") and line.endswith("PASS") and " = own" in line, line
    assert "files) on cpu" in line and not line.split("(fp32, ")[1].startswith("1 files"), line   # sharded
