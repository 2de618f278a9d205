"""The one place that talks to the device (axgrid/device/), and what it decides: which GPU a rank takes, what a
backend runs on, the GEMM tuner's timing and cache keys per GPU model, AMD energy by PCI address, the peak table.
The GPU answers are checked with torch's CUDA functions replaced by stand-ins (this machine has no GPU); the code
under test is the real one."""
from __future__ import annotations

import re
import sys
import types

import pytest
import torch

from helpers import ROOT

import axgrid.device as device
from axgrid.device import Device, Event, HostEvent, backend_device_type, choose_device, gpu_index
from axgrid.launch.env import LaunchEnv, LaunchError

CUDA_CALL = re.compile(r"torch\.cuda\.")


def test_torch_cuda_is_called_only_in_the_device_module():
    """Every ``torch.cuda.`` of the library (the tuner and perfmodel included) and of the
    scripts is in axgrid/device/: CPU, CUDA and ROCm differ there and nowhere else."""
    files = [p for top in ("axgrid", "experiments")
             for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".sh") and "results" not in p.parts]
    offenders = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
                 if not p.relative_to(ROOT).as_posix().startswith("axgrid/device/")
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if CUDA_CALL.search(line)]
    assert len(files) > 100
    assert not offenders, "torch.cuda outside axgrid/device/:\n" + "\n".join(offenders)


def test_backend_says_what_it_runs_on():
    assert backend_device_type("nccl") == "cuda"
    assert backend_device_type("cuda:nccl,cpu:gloo") == "cuda"       # what get_backend says for a mixed group
    assert backend_device_type("gloo") == "cpu"
    assert backend_device_type("undefined") is None and backend_device_type("fake") is None


def test_a_rank_never_wraps_onto_another_ranks_gpu():
    assert gpu_index(3, 4, 4) == 3
    assert gpu_index(5, 8, 1) == 0                 # --gpus-per-task=1 / --gpu-bind=closest: the one it sees
    with pytest.raises(LaunchError, match=r"local rank 5 of 8 ranks on this node, but this process sees 4 GPUs"):
        gpu_index(5, 8, 4)                         # was cuda:1, shared silently with local rank 1
    with pytest.raises(LaunchError, match="local rank 1 of 8 ranks on this node"):
        gpu_index(1, 8, 4)                         # every rank refuses, not only those past the end
    with pytest.raises(LaunchError, match="sees none"):
        gpu_index(0, 1, 0)


@pytest.fixture
def four_gpus(monkeypatch):
    """torch's CUDA functions as a node of 4 GPUs would answer (current device 0), recording set_device."""
    state = {"current": 0, "set": []}
    monkeypatch.setattr(device.cuda, "count", lambda: 4)
    monkeypatch.setattr(device.cuda, "current_index", lambda: state["current"])

    def set_current(i):
        state["set"].append(i)
        state["current"] = i
    monkeypatch.setattr(device.cuda, "set_current", set_current)
    return state


def _launch(local_rank: int, local_world: int) -> LaunchEnv:
    return LaunchEnv(local_rank, local_world, local_rank, local_world, "127.0.0.1", 1, "torchrun")


def test_each_rank_takes_its_local_gpu(four_gpus):
    assert choose_device(_launch(2, 4), "nccl") == torch.device("cuda", 2) and four_gpus["set"] == [2]
    with pytest.raises(LaunchError, match="sees 4 GPUs"):
        choose_device(_launch(2, 8), "nccl")


def test_a_world_the_program_made_still_gets_the_local_rank_gpu(four_gpus):
    """A process group the program created (torchrun + init_process_group) never set the device: every rank was
    on cuda:0. Now the local rank's GPU is made current, unless the program chose one itself."""
    assert choose_device(_launch(3, 4), "cuda:nccl,cpu:gloo", joining=True) == torch.device("cuda", 3)
    four_gpus["current"] = 1                       # the program called torch.cuda.set_device(1) itself
    assert choose_device(_launch(3, 4), "nccl", joining=True) == torch.device("cuda", 1)
    assert choose_device(_launch(3, 4), "undefined", joining=True) == torch.device("cuda", 1)
    assert choose_device(_launch(3, 4), "gloo", joining=True) == torch.device("cpu")


def test_the_process_group_is_bound_to_the_rank_gpu(monkeypatch):
    """init_process_group gets device_id= (eager NCCL start, communicators split for the subgroups)."""
    from axgrid.launch import env
    seen = {}
    monkeypatch.setattr("torch.distributed.init_process_group", lambda **kw: seen.update(kw))
    env.init_distributed(_launch(1, 2), "nccl", 10.0, torch.device("cuda", 1))
    assert seen["device_id"] == torch.device("cuda", 1) and seen["backend"] == "nccl"
    seen.clear()
    env.init_distributed(_launch(1, 2), "gloo", 10.0, None)
    assert "device_id" not in seen


def test_default_timeout_is_ncclS_own():
    import axgrid
    cfg = axgrid.RuntimeConfig()
    assert cfg.timeout_s == 600.0 and cfg.io_timeout_s >= 1800.0 and cfg.hang_seconds() == 480.0


def test_h200_nvl_is_not_an_h200_sxm():
    from axgrid.metrics.peaks import lookup_device
    assert lookup_device("NVIDIA H200 NVL").flops("bf16") == 835e12
    assert lookup_device("NVIDIA H200").flops("bf16") == 989e12


# ---- the GEMM tuner: timing on the device tuned, cache entries per GPU model --------------------------------------

class _StreamEvent(Event):
    def __init__(self, dev: "_RecordingGpu") -> None:
        self.dev, self.t = dev, None

    def record(self) -> "_StreamEvent":
        self.dev.recorded.append(self.dev.torch.index)
        self.t = self.dev.clock
        self.dev.clock += 1.0
        return self

    def done(self) -> bool:
        return True

    def seconds_to(self, later: Event) -> float:
        return later.t - self.t


class _RecordingGpu(Device):
    """A GPU that says on which device its events were recorded (a stand-in for ``cuda:1``)."""
    kind, is_gpu = "cuda", True

    def __init__(self, index: int) -> None:
        super().__init__(torch.device("cuda", index))
        self.recorded: list[int] = []
        self.syncs, self.clock = 0, 0.0

    def synchronize(self) -> None:
        self.syncs += 1

    def event(self) -> Event:
        return _StreamEvent(self)


def test_tuner_times_on_the_stream_of_the_device_it_tunes():
    """Events for a GEMM on cuda:1 are recorded on cuda:1's stream (they were recorded on the current device's,
    cuda:0, where the GEMM takes no time), and the time is read from them."""
    from axgrid.kernels.timing import measure
    gpu = _RecordingGpu(1)
    got = measure({"a": lambda: None, "b": lambda: None}, gpu, warmup=1, repeats=3)
    assert gpu.recorded and set(gpu.recorded) == {1}
    assert got.median_s == {"a": 1.0, "b": 1.0}          # end - start of its own two events


def test_gemm_cache_keeps_one_entry_per_gpu_model(tmp_path):
    from axgrid.kernels import GemmSignature
    from axgrid.kernels.cache import GemmCache
    a100 = GemmSignature.make(64, 64, 64, "bf16", "cuda", "forward", model="NVIDIA A100-SXM4-80GB")
    h100 = GemmSignature.make(64, 64, 64, "bf16", "cuda", "forward", model="NVIDIA H100 80GB HBM3")
    assert a100.key != h100.key and "H100" in h100.key
    cache = GemmCache(tmp_path / "gemm.json")
    cache.put(a100, {"winner": "default", "validators": {"device_name": "NVIDIA A100-SXM4-80GB"}})
    cache.put(h100, {"winner": "torch:NT:AB", "validators": {"device_name": "NVIDIA H100 80GB HBM3"}})
    entries = cache.load()
    assert entries[a100.key]["winner"] == "default" and entries[h100.key]["winner"] == "torch:NT:AB"
    assert GemmSignature.make(64, 64, 64, "fp32", "cpu", "forward").key.startswith("cpu|")   # unchanged on CPUs


# ---- AMD energy: by PCI address, one reader per MI250X package ------------------------------------------------------

def _frontier_amdsmi(counters: dict[str, float]) -> types.ModuleType:
    """amdsmi as a Frontier node answers: 8 GCDs, two per MI250X package (one serial), energy read per package on
    the package's first GCD (the second reads 0)."""
    gcds = [f"0000:{b}:00.0" for b in ("c1", "c6", "c9", "ce", "d1", "d6", "d9", "de")]
    amd = types.ModuleType("amdsmi")
    amd.amdsmi_init = lambda: None
    amd.amdsmi_get_processor_handles = lambda: list(range(8))
    amd.amdsmi_get_gpu_device_bdf = lambda h: gcds[h]
    amd.amdsmi_get_gpu_asic_info = lambda h: {"asic_serial": f"PKG{h // 2}"}
    amd.amdsmi_get_energy_count = lambda h: {"energy_accumulator": counters.get(gcds[h], 0.0),
                                             "counter_resolution": 15.3}
    return amd


def test_amd_energy_reads_the_ranks_own_gcd_not_hip_device_0(monkeypatch):
    from axgrid.metrics.energy import amdsmi_energy, amdsmi_package, energy_readers, key_hash
    counters = {"0000:c1:00.0": 1e6, "0000:d1:00.0": 5e6}          # packages 0 and 2 (their first GCDs)
    monkeypatch.setitem(sys.modules, "amdsmi", _frontier_amdsmi(counters))
    # a task bound to GCD 5 (0000:d6) sees it as HIP device 0: the reading must be its package's (d1), not GCD 0's
    e = amdsmi_energy("0000:d6:00.0", 0)
    assert e.available and "package PKG2 (2 GCDs" in e.source, e.source
    assert e.read() == pytest.approx(5e6 * 15.3 / 1e6)
    assert amdsmi_package("0000:d6:00.0") == amdsmi_package("0000:d1:00.0") == "package:PKG2"
    keys = [key_hash(f"nid1/{amdsmi_package(b)}") for b in
            ("0000:c1:00.0", "0000:c6:00.0", "0000:c9:00.0", "0000:ce:00.0", "0000:d1:00.0", "0000:d6:00.0",
             "0000:d9:00.0", "0000:de:00.0")]
    readers = [energy_readers(list(zip(keys, range(8))), r) for r in range(8)]
    assert [r for r, (reads, _) in enumerate(readers) if reads] == [0, 2, 4, 6] and readers[0][1] == 4
    assert amdsmi_energy("0000:ff:00.0", 0).source.startswith("none: amdsmi sees no GPU at 0000:ff:00.0")


def test_host_events_measure_host_time():
    a = HostEvent().record()
    b = HostEvent().record()
    assert a.done() and 0 <= a.seconds_to(b) < 1
