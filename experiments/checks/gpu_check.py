"""The GPU acceptance check: what ``experiments/checks/gpu_check.sh`` runs once it has a Python with torch and found a
GPU (run the .sh: it installs what is missing and refuses clearly where no GPU is).

    python experiments/checks/gpu_check.py [--gpus N] [--quick] [--out DIR] [--peak-tflops X]

On GPU 0 (every node):
  device    the GPU torch sees (name, memory, toolkit, the bf16 peak axgrid.metrics.peaks has for it);
  nccl      NCCL (RCCL on ROCm) over one rank through axgrid.init, an all-reduce checked;
  gemm      the GEMM layout tuner's GPU path: its three layer GEMMs agree with torch.matmul;
  step      a bf16 GPT (2 blocks, hidden 4096 by default) trained a few steps: time, TFLOP/s, MFU, peak memory and
            energy per step (axgrid.metrics.StepMeter: NVML on NVIDIA, amdsmi on AMD);
  memory    a training step's peak memory against perfmodel.memory (experiments/checks/memory_check.py, 10%);
  load      from_pretrained straight onto the GPU (experiments/checks/load_check.py).
With 2 to 8 GPUs on the node (``--gpus``, default: all torch sees), under ``axgrid launch``:
  grids     train_gpt.py with ``--overlap all`` on several grids of N ranks against the serial run (1 GPU, the same
            seed and data, fp32): every step's loss within 1e-4;
  flight    the NCCL timeout and the flight recorder: one rank skips a collective (axgrid.testing.fault_rank skip);
            the job must end with the launcher saying which ranks stopped at which collective;
  scale     train_gpt.py in bf16 on N GPUs: MFU, peak memory and energy of the job (its summary row).
AMD: MI250X (each GCD is a device: 8 per node; peaks per GCD; energy per package of 2 GCDs) and MI300X are in the
peak table; RCCL answers as "nccl"; amdsmi (from ROCm) gives energy.

Prints one line per check while it runs, then one Markdown table to paste into docs/results.md; exit status 0 when
every check passed, 1 otherwise, 2 when there is no GPU (or bad arguments). ``--parse-only`` checks the arguments
and exits (the .sh runs it before anything else).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_NODE_GPUS = 8


@dataclass
class Row:
    """One line of the table: which check, PASS/FAIL/skip, and its figures."""

    check: str
    result: str
    figures: str


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def add(self, check: str, ok: Optional[bool], figures: str) -> bool:
        result = "skip" if ok is None else ("PASS" if ok else "FAIL")
        self.rows.append(Row(check, result, figures))
        print(f"gpu_check: {check}: {result}: {figures}", flush=True)
        return bool(ok) or ok is None

    def table(self) -> str:
        lines = ["| check | result | figures |", "|---|---|---|"]
        lines += [f"| {r.check} | {r.result} | {r.figures.replace('|', '/')} |" for r in self.rows]
        return "\n".join(lines)

    @property
    def passed(self) -> bool:
        return all(r.result != "FAIL" for r in self.rows)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=None,
                    help=f"GPUs of this node to use (default: all torch sees, at most {MAX_NODE_GPUS})")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the check itself")
    ap.add_argument("--out", default=None, help="where runs write logs (default: a temporary folder)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the GPU's dense bf16 peak, where axgrid.metrics.peaks does not know the device")
    ap.add_argument("--timeout", type=float, default=20.0, help="collective timeout of the flight-recorder case")
    ap.add_argument("--parse-only", action="store_true", help="check the arguments and exit")
    a = ap.parse_args(argv)
    if a.gpus is not None and not 1 <= a.gpus <= MAX_NODE_GPUS:
        ap.exit(2, f"gpu_check: --gpus {a.gpus}: use 1 to {MAX_NODE_GPUS} (the GPUs of one node)\n")
    if a.peak_tflops is not None and not a.peak_tflops > 0:
        ap.exit(2, f"gpu_check: --peak-tflops {a.peak_tflops}: a positive number of TFLOP/s, e.g. 989\n")
    if not a.timeout > 0:
        ap.exit(2, f"gpu_check: --timeout {a.timeout}: seconds > 0\n")
    return a


def grids_for(n: int) -> list[str]:
    """Up to four grids of ``n`` ranks, each with its own set of dimensions larger than 1, mixed ones first, that
    together make every dimension (x, y, z, d) larger than 1 at least once."""
    from axgrid.spec.layout import all_shapes
    shapes = sorted(all_shapes(n), key=lambda s: (-sum(v > 1 for v in s.as_tuple()), s.as_tuple()))
    chosen, patterns = [], set()
    for s in shapes:
        pattern = tuple(v > 1 for v in s.as_tuple())
        if pattern not in patterns and len(chosen) < 4:
            chosen.append(s)
            patterns.add(pattern)
    for i in range(4):                     # a dimension no chosen grid splits: take one that does, last
        if n > 1 and not any(c.as_tuple()[i] > 1 for c in chosen):
            chosen[-1] = next(s for s in shapes if s.as_tuple()[i] > 1)
    return [str(s) for s in chosen]


def sizes(quick: bool) -> dict[str, int]:
    env = os.environ.get
    default = (2, 512, 512, 4, 3) if quick else (2, 4096, 2048, 4, 5)
    return {k: int(env(f"GPU_CHECK_{k.upper()}", str(v)))
            for k, v in zip(("layers", "hidden", "seq", "batch", "steps"), default)}


# ------------------------------------------------------------------------------------------------- one GPU

def device_row(report: Report, peak_tflops: Optional[float]) -> tuple[object, object]:
    import torch
    from axgrid.device import cuda, of
    from axgrid.metrics import resolve_peak
    dev = of(torch.device("cuda", 0))
    name, (free, total) = dev.name(), dev.memory_info()
    peak = resolve_peak(name, "bf16", is_cpu=False, peak_flops=peak_tflops * 1e12 if peak_tflops else None)
    p = dev.properties()
    arch = getattr(p, "gcnArchName", None) or f"compute capability {p.major}.{p.minor}"
    report.add("device", True, f"{name} ({dev.kind}, {arch}), {total / 2**30:.0f} GiB, {cuda.count()} visible, "
                               f"torch {torch.__version__} {cuda.toolkit()}, bf16 peak "
                               f"{peak.flops / 1e12 if peak.flops else 'unknown (--peak-tflops)'} TFLOP/s")
    return dev, peak


def single_gpu(report: Report, a: argparse.Namespace, out: str) -> None:
    import torch
    import axgrid
    from axgrid.models.gpt import GPT, GPTConfig
    from axgrid.spec import TransformerShape
    from axgrid.metrics import StepMeter
    from axgrid.train import train_step
    dev, peak = device_row(report, a.peak_tflops)
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    if "MASTER_PORT" not in os.environ:
        from axgrid.launch.env import free_port
        os.environ["MASTER_PORT"] = str(free_port())
    t0 = time.perf_counter()
    cache = os.path.join(out, "gemm.json")
    grid = axgrid.init("1x1x1x1", config=axgrid.RuntimeConfig(timeout_s=120, gemm_tuning="on-first-use",
                                                              gemm_cache=cache, seed=0))
    try:
        one = grid.comm.all_reduce(torch.ones(1024, device=grid.device), "d")      # a no-op over one rank...
        import torch.distributed as dist
        dist.all_reduce(one)                                                        # ... NCCL's own, then
        ok = grid.backend == "nccl" and float(one.sum()) == 1024.0
        report.add("nccl", ok, f"backend {grid.backend}, 1 rank, {time.perf_counter() - t0:.2f} s to start and "
                               f"all-reduce")
        s = sizes(a.quick)
        tuner = grid.runtime.gemm_fn
        worst = 0.0
        for role in ("forward", "input_grad", "weight_grad"):
            x = torch.randn(s["hidden"], s["hidden"], device=grid.device, dtype=torch.bfloat16)
            y = torch.randn(s["hidden"], s["hidden"], device=grid.device, dtype=torch.bfloat16)
            got, want = tuner(x, y, role).float(), (x @ y).float()
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
        report.add("gemm", worst <= 2e-2, f"tuned layer GEMMs agree with torch.matmul within {worst:.1e}")
        cfg = GPTConfig(TransformerShape("gpu-check", s["layers"], s["hidden"], max(1, s["hidden"] // 128), s["seq"], 51200))
        model = GPT(cfg, grid)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        data = torch.randint(0, cfg.shape.vocab, (s["batch"], s["seq"] + 1), device=grid.device)
        meter = StepMeter(grid, flops_per_step=model.flops_per_iteration(s["batch"]),
                          tokens_per_step=s["batch"] * s["seq"], dtype="bf16", peak_flops=peak.flops)

        def loss_of(_: int) -> torch.Tensor:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(data[:, :-1], data[:, 1:])
        rows = []
        for step in range(s["steps"] + 2):                  # two warm-up steps (tuning, the allocator)
            meter.begin()
            out_step = train_step(model, opt, loss_of, grid)
            row = meter.end(step, loss=out_step.loss)
            if step >= 2:
                rows.append(row)
        meter.close()
        mid = sorted(rows, key=lambda r: r["step_s"])[len(rows) // 2]
        energy = (f"{mid['energy_j']:.0f} J/step, {mid['power_w']:.0f} W" if mid["energy_j"] is not None
                  else f"energy n/a ({meter.energy_source})")
        mfu = f", MFU {mid['mfu']:.1%}" if mid["mfu"] is not None else ""
        ok = all(r["loss"] == r["loss"] for r in rows) and (mid["energy_j"] is None or mid["energy_j"] > 0)
        report.add("step", ok, f"bf16 GPT L{s['layers']} h{s['hidden']} S{s['seq']} B{s['batch']}: "
                               f"{mid['step_s'] * 1e3:.1f} ms, {mid['tflops']:.1f} TFLOP/s{mfu}, peak "
                               f"{mid['peak_mem_bytes'] / 2**30:.2f} GiB, {energy}")
        del model, opt
    finally:
        grid.destroy()
    dev.empty_cache()
    for script, args, name in (("memory_check.py", ["--layers", str(s["layers"]), "--hidden", str(s["hidden"]),
                                                    "--seq", str(s["seq"]), "--batch", str(s["batch"])], "memory"),
                               ("load_check.py", [], "load")):
        res = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "checks", script), "--device", "cuda",
                              *args], capture_output=True, text=True)
        line = (res.stdout.strip().splitlines() or [res.stderr.strip() or "no output"])[-1]
        report.add(name, res.returncode == 0, line.split(": ", 1)[-1])


# ------------------------------------------------------------------------------------------------- N GPUs

def _launch(n: int, args: list[str], run_dir: str, timeout_s: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "axgrid.cli", "launch", "-n", str(n), "--no-mpi", "--run-dir", run_dir, "--",
           sys.executable, *args]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)


def _losses(log: str) -> list[float]:
    if not os.path.exists(log):
        return []
    return [r["loss"] for r in map(json.loads, open(log).read().splitlines()) if r.get("event") == "step"]


def multi_gpu(report: Report, n: int, a: argparse.Namespace, out: str) -> None:
    train = os.path.join(ROOT, "experiments", "train", "train_gpt.py")
    small = ["--model", "gpt-tiny", "--data", "synthetic", "--steps", "4", "--batch", str(4 * n), "--seed", "1",
             "--dtype", "fp32", "--no-progress", "--clip", "1.0", "--lr", "1e-3"]
    serial = os.path.join(out, "serial.jsonl")
    _launch(1, [train, *small, "--grid", "1x1x1x1", "--log", serial], os.path.join(out, "serial"), 600)
    ref = _losses(serial)
    for g in grids_for(n):
        log = os.path.join(out, f"grid-{g}.jsonl")
        res = _launch(n, [train, *small, "--grid", g, "--overlap", "all", "--log", log], os.path.join(out, g), 900)
        got = _losses(log)
        diff = max((abs(x - y) for x, y in zip(got, ref)), default=float("inf"))
        ok = res.returncode == 0 and len(got) == len(ref) > 0 and diff <= 1e-4
        report.add(f"grid {g}", ok, f"train_gpt --overlap all, fp32, {len(got)} steps: max loss difference to serial "
                                    f"{diff:.1e}" + ("" if res.returncode == 0 else f" (exit {res.returncode})"))
    run_dir = os.path.join(out, "flight")
    t0 = time.monotonic()
    res = _launch(2, ["-m", "axgrid.testing.fault_rank", "skip", "1", str(a.timeout)], run_dir, 10 * a.timeout + 120)
    took = time.monotonic() - t0
    said = [line for line in res.stdout.splitlines() if "stopped in collective" in line]
    ok = res.returncode != 0 and len(said) >= 1 and os.path.isdir(os.path.join(run_dir, "flight"))
    report.add("flight", ok, f"one rank skips a collective (timeout {a.timeout:g} s): exit {res.returncode} after "
                             f"{took:.0f} s; " + ("; ".join(s.split("axgrid launch:")[-1].strip() for s in said)
                                                  or "the launcher named no collective"))
    s = sizes(a.quick)
    log = os.path.join(out, "scale.jsonl")
    big = ["--layers", str(s["layers"]), "--hidden", str(s["hidden"]), "--heads", str(max(1, s["hidden"] // 128)),
           "--seq", str(s["seq"]), "--vocab", "51200", "--batch", str(s["batch"]), "--steps", str(s["steps"] + 1),
           "--dtype", "bf16", "--data", "synthetic", "--no-progress", "--overlap", "all", "--comm-timing"]
    grid = f"{n}x1x1x1"
    peak = ["--peak-tflops", str(a.peak_tflops)] if a.peak_tflops else []
    res = _launch(n, [train, *big, "--grid", grid, "--log", log, *peak], os.path.join(out, "scale"), 1800)
    summary = next((r for r in map(json.loads, open(log).read().splitlines()) if r.get("event") == "summary"), None) \
        if os.path.exists(log) else None
    if summary is None:
        report.add(f"scale {grid}", False, f"train_gpt failed (exit {res.returncode}): "
                                           f"{(res.stdout + res.stderr).strip().splitlines()[-1:]}")
        return
    energy = (f", {summary['energy_j'] / max(1, summary['timed_steps']):.0f} J/step, {summary['power_w']:.0f} W"
              if summary.get("energy_j") else ", energy n/a")
    mfu = f", MFU {summary['mfu']:.1%}" if summary.get("mfu") is not None else ""
    report.add(f"scale {grid}", res.returncode == 0,
               f"bf16 GPT h{s['hidden']} on {n} GPUs: {summary['step_s'] * 1e3:.1f} ms/step, {summary['tflops']:.1f} "
               f"TFLOP/s per GPU{mfu}, peak {summary['peak_mem_bytes'] / 2**30:.2f} GiB{energy}")


# ------------------------------------------------------------------------------------------------- main

def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    if a.parse_only:
        return 0
    import torch
    from axgrid.device import cuda
    if cuda.count() == 0:
        build = "a CPU build" if not (torch.version.cuda or cuda.is_rocm()) else cuda.toolkit()
        print(f"gpu_check: FAIL: torch {torch.__version__} ({build}) sees no GPU; this check needs one or more "
              f"(install the torch for this node: bash experiments/checks/gpu_check.sh --install)", file=sys.stderr)
        return 2
    n = min(a.gpus or cuda.count(), cuda.count(), MAX_NODE_GPUS)
    out = a.out or tempfile.mkdtemp(prefix="gpu_check-")
    os.makedirs(out, exist_ok=True)
    report = Report()
    steps: list[tuple[str, Callable[[], None]]] = [("one GPU", lambda: single_gpu(report, a, out))]
    if n >= 2:
        steps.append((f"{n} GPUs", lambda: multi_gpu(report, n, a, out)))
    else:
        report.add("grids, flight, scale", None, "one GPU: the multi-GPU checks need 2 to 8")
    for what, run in steps:
        try:
            run()
        except Exception as e:              # one failing part is a row, not the end of the report
            report.add(what, False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    print(f"\ngpu_check: logs in {out}; the table for docs/results.md:\n\n{report.table()}\n", flush=True)
    print("gpu_check: PASS" if report.passed else "gpu_check: FAIL", flush=True)
    return 0 if report.passed else 1


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "gpu_check")     # errors said once, as one line (axgrid.launch.errors)
