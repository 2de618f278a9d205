"""axgrid.metrics: the per-step record on real gloo ranks (times, FLOPs = axgrid.spec's formula, the ledger's
bytes, the RSS peak), the device peak table, energy detection on this machine (none, with the reason), the RAPL
reader on a powercap tree, the one-reader-per-device rule, and TensorBoard files read back with tensorboard's
own reader."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest
import torch

from axgrid.metrics import PeakMemory, detect_energy, energy_readers, lookup_device, resolve_peak
from axgrid.device import CpuDevice
from axgrid.metrics.energy import amdsmi_energy, key_hash, nvml_energy, rapl_energy
from axgrid.spec import gpt_flops_per_iteration

SIZES = dict(layers=2, hidden=32, heads=4, seq=16, vocab=64)
BATCH = 4


def rank_record(tmp: str) -> dict:
    """Three steps of a GPT on 1x2x1x1 with a timed ledger, metered; the rows and what the ledger counted."""
    import axgrid
    from axgrid.metrics import Metrics
    from axgrid.models.gpt import GPT, GPTConfig
    from axgrid.spec import TransformerShape
    from axgrid.train import train_step
    grid = axgrid.init("1x2x1x1", config=axgrid.RuntimeConfig(timeout_s=60, record_timing=True, seed=0))
    try:
        cfg = GPTConfig(TransformerShape("tiny", **SIZES), recompute=True)
        model = GPT(cfg, grid)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        metrics = Metrics(grid, flops_per_step=cfg.flops_per_iteration(BATCH), tokens_per_step=BATCH * cfg.shape.seq,
                          dtype="fp32", jsonl=os.path.join(tmp, "run.jsonl"), tensorboard=os.path.join(tmp, "tb"),
                          config={"model": "tiny", "batch": BATCH})
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, cfg.shape.vocab, (BATCH, cfg.shape.seq + 1), generator=gen)
        ledgers, rows = [], []
        for step in range(3):
            big = bytearray(64 * 2**20) if step == 1 else None        # touched: 64 MiB more RSS in step 1 only
            grid.ledger.reset()
            metrics.begin()
            if big is not None:
                big[:: 4096] = b"\1" * len(big[:: 4096])
            out = train_step(model, opt, lambda _: model(ids[:, :-1], ids[:, 1:]), grid)
            ledgers.append({d: b for d, b in grid.ledger.bytes_by_dim().items() if b})
            rows.append(metrics.end(step, loss=out.loss, lr=1e-3))
            del big
        summary = metrics.close()
        return {"rows": rows, "ledgers": ledgers, "summary": summary, "rank": grid.rank,
                "local_loss": float(out.loss)}
    finally:
        grid.destroy()


def test_the_record_holds_real_figures(ranks, tmp_path):
    out = ranks(2, rank_record, str(tmp_path))
    flops = gpt_flops_per_iteration(BATCH, SIZES["seq"], SIZES["layers"], SIZES["hidden"], SIZES["vocab"], True)
    for res in out:
        for row, ledger in zip(res["rows"], res["ledgers"]):
            assert row["flops"] == flops and row["tokens"] == BATCH * SIZES["seq"]
            assert row["step_s"] > 0 and row["tokens_per_s"] * row["step_s"] == pytest.approx(row["tokens"])
            assert row["tflops"] == pytest.approx(flops / row["step_s"] / 2 / 1e12)
            assert row["comm_bytes"] == ledger and set(ledger) == {"y"}      # this rank's ledger, the step's only
            assert set(row["comm_s"]) == set(row["comm_exposed_s"]) == {"y"}
            assert 0 < row["comm_exposed_s"]["y"] <= row["comm_s"]["y"] + 1e-9 < row["step_s"]
            assert row["mfu"] is None and row["energy_j"] is None and row["tokens_per_j"] is None
            assert row["energy_source"].startswith("none:") and "\n" not in row["energy_source"]
        steps = res["rows"]
        assert [r["step_s"] for r in steps] == [r["step_s"] for r in out[0]["rows"]]   # the slowest rank's, on all
        assert steps[1]["peak_mem_bytes"] >= steps[2]["peak_mem_bytes"] + 48 * 2**20      # reset every step
        assert 2**20 < steps[2]["peak_mem_bytes"] < 16 * 2**30
    assert out[0]["local_loss"] == pytest.approx(out[0]["rows"][-1]["loss"])            # Gd = 1: its own loss
    rows = [json.loads(line) for line in open(tmp_path / "run.jsonl")]
    assert [r["event"] for r in rows] == ["config", "step", "step", "step", "summary"]
    assert rows[0]["grid"] == "1x2x1x1" and rows[0]["model"] == "tiny" and rows[0]["peak_flops"] is None
    assert rows[0]["energy_readers"] == 1                                   # both ranks share this host's packages
    assert rows[1:4] == json.loads(json.dumps(out[0]["rows"]))
    summary = rows[-1]
    assert summary["step_s"] == pytest.approx(sum(r["step_s"] for r in rows[2:4]) / 2)   # warm-up step left out
    assert summary["peak_mem_bytes"] == max(r["peak_mem_bytes"] for r in rows[1:4])

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"throughput/tokens_per_s", "throughput/tflops", "time/step_s", "memory/peak_mem_bytes",
            "comm/bytes/y", "comm/s/y", "comm/exposed_s/y", "train/loss", "train/lr"} <= tags
    assert "energy/energy_j" not in tags                                   # null here: left out
    got = [(e.step, e.value) for e in acc.Scalars("throughput/tokens_per_s")]
    assert got == [(r["step"], pytest.approx(r["tokens_per_s"], rel=1e-6)) for r in rows[1:4]]   # float32 in TB
    assert [e.value for e in acc.Scalars("comm/bytes/y")] == [float(r["comm_bytes"]["y"]) for r in rows[1:4]]


@pytest.mark.parametrize("name,row", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
    ("NVIDIA H200", "H200"), ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100"), ("AMD Instinct MI250X", "MI250X GCD"), ("AMD Instinct MI250X/MI250", "MI250X GCD"),
    ("AMD Instinct MI300X", "MI300X")])
def test_device_table_by_name(name, row):
    assert lookup_device(name).name == row


def test_device_table_figures_and_misses():
    assert lookup_device("NVIDIA H100 80GB HBM3").flops("bf16") == 989e12
    assert lookup_device("AMD Instinct MI250X").flops("bf16") == 191.5e12                  # per GCD
    assert lookup_device("AMD Instinct MI250X").flops("fp32") == 23.9e12
    assert lookup_device("NVIDIA A100-SXM4-40GB").flops("fp16") == 312e12
    assert lookup_device("NVIDIA H100 NVL") is None and lookup_device("Tesla V100-SXM2-16GB") is None
    gpu = resolve_peak("NVIDIA H100 PCIe", "bf16", is_cpu=False)
    assert gpu.flops == 756e12 and "datasheet" in gpu.source
    assert resolve_peak("NVIDIA H100 NVL", "bf16", is_cpu=False).flops is None
    cpu = resolve_peak("Intel(R) Xeon(R)", "fp32", is_cpu=True)
    assert cpu.flops is None and "--peak-machine" in cpu.source
    from axgrid.perfmodel.machines import load_machine
    calibrated = resolve_peak("Intel(R) Xeon(R)", "fp32", is_cpu=True, machine="local-4")
    assert calibrated.flops == load_machine("local-4").peak_flops_fp32 and "calibrated" in calibrated.source
    assert resolve_peak("x", "bf16", is_cpu=True, peak_flops=5e11).flops == 5e11
    with pytest.raises(ValueError, match="must be > 0"):
        resolve_peak("x", "bf16", is_cpu=True, peak_flops=0)


def test_energy_detection_here_is_null_with_a_reason():
    here = detect_energy(CpuDevice())
    assert here.read() is None and not here.available and here.source.startswith("none:")
    assert "/sys/class/powercap" in here.source and "\n" not in here.source
    nv = nvml_energy(0)                       # nvidia-ml-py imports without a GPU; NVML itself is missing
    assert nv.read() is None and nv.source.startswith("none: NVML unavailable"), nv.source
    amd = amdsmi_energy(None, 0)
    assert amd.read() is None and amd.source.startswith("none: amdsmi"), amd.source


def _zone(root, name, label, uj, max_uj):
    z = root / name
    z.mkdir(parents=True)
    (z / "name").write_text(label + "\n")
    (z / "energy_uj").write_text(f"{uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return z


def test_rapl_sums_packages_only_and_unwraps(tmp_path):
    p0 = _zone(tmp_path, "intel-rapl:0", "package-0", 900, 1000)
    p1 = _zone(tmp_path, "intel-rapl:1", "package-1", 100, 1000)
    _zone(tmp_path, "intel-rapl:0:0", "core", 500, 1000)             # inside package 0: not counted again
    _zone(tmp_path, "intel-rapl:2", "psys", 100, 1000)               # the platform: contains the packages
    meter = rapl_energy(str(tmp_path))
    assert meter.available and "2 package(s)" in meter.source
    e0 = meter.read()
    (p0 / "energy_uj").write_text("50\n")                            # wrapped: 900 -> 1000 -> 50 = 150 µJ
    (p1 / "energy_uj").write_text("350\n")                           # 250 µJ
    assert meter.read() - e0 == pytest.approx(400e-6)
    (p1 / "energy_uj").chmod(0)
    if os.geteuid() != 0:                                            # root reads a 0000 file anyway
        assert rapl_energy(str(tmp_path)).source.startswith("none: RAPL counters")
    assert rapl_energy(str(tmp_path / "absent")).source.startswith("none: no ")


def test_one_energy_reader_per_device():
    def readers(keys):                   # keys[r]: the device rank r reads from
        pairs = [(key_hash(k), r) for r, k in enumerate(keys)]
        return [energy_readers(pairs, r)[0] for r in range(len(keys))], energy_readers(pairs, 0)[1]
    assert readers(["a"] * 4 + ["b"] * 4) == ([True, False, False, False] * 2, 2)     # CPU: one per node
    assert readers([f"{h}/{g}" for h in "ab" for g in (0, 1, 0, 1)]) == ([True, True, False, False] * 2, 4)
    assert readers([f"{h}/{g}" for h in "ab" for g in range(4)]) == ([True] * 8, 8)   # a GPU each
    assert CpuDevice().energy_key() == socket.gethostname()


def test_host_peak_is_reset_per_step():
    mem = PeakMemory(torch.device("cpu"))
    assert mem.per_step and "clear_refs" in mem.source
    mem.reset()
    big = bytearray(128 * 2**20)
    big[:: 4096] = b"\1" * len(big[:: 4096])
    with_big = mem.read()
    del big
    mem.reset()
    assert with_big >= mem.read() + 100 * 2**20


def test_power_sampling_integrates_watts():
    from axgrid.metrics.energy import PowerIntegrator
    meter = PowerIntegrator(lambda: 100.0, interval_s=0.01)      # a constant 100 W
    try:
        t0, e0 = time.perf_counter(), meter.joules()
        time.sleep(0.2)
        joules, dt = meter.joules() - e0, time.perf_counter() - t0
    finally:
        meter.close()
    assert joules == pytest.approx(100.0 * dt, rel=0.05)


def _bar_output(stream, master=None) -> bytes:
    """What a MetricsLog with a bar writes to ``stream`` (as sys.stderr) for three step rows."""
    import sys
    from axgrid.metrics import MetricsLog
    old, sys.stderr = sys.stderr, stream
    try:
        log = MetricsLog(0, progress=3)
        for s in range(3):
            log.write({"event": "step", "step": s, "loss": 1.5})
        log.close()
    finally:
        sys.stderr = old
    stream.flush()
    if master is None:
        return b""
    import select
    out = b""
    while select.select([master], [], [], 0.5)[0]:     # tqdm's writes arrive as separate reads on a pty
        chunk = os.read(master, 65536)
        if not chunk:
            break
        out += chunk
    return out


def test_progress_bar_only_on_a_terminal(tmp_path):
    import fcntl
    import struct
    import termios
    with open(tmp_path / "batch.log", "w") as f:                       # a batch job's log: no bar
        _bar_output(f)
    assert (tmp_path / "batch.log").read_text() == ""
    master, slave = os.openpty()                                       # a real terminal, 100 columns
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with os.fdopen(slave, "w") as tty:
        out = _bar_output(tty, master)
    os.close(master)
    assert b"3/3" in out and b"loss=1.5" in out, out
