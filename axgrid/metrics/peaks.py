"""Dense peak FLOP/s of the accelerators axgrid targets, looked up by the name the driver reports.

MFU is the achieved model FLOP/s of a device divided by its dense (no sparsity) peak for the run's dtype. The
figures are the vendors' specification sheets (each row names its sheet); bf16 and fp16 run at the same
tensor-core rate on every device listed, and ``fp32`` is the non-tensor (vector) rate, which is what
``torch.matmul`` reaches on fp32 tensors unless TF32 is switched on. A device that is not in the table gets no
peak (MFU null) unless the caller passes one; on a CPU the peak is the calibrated GEMM rate of a perfmodel machine
file (``perfmodel calibrate`` writes the fastest measured GEMM per rank), when one is named.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

TFLOP = 1e12


@dataclass(frozen=True)
class DevicePeak:
    """One device: dense peak FLOP/s per device (a GCD for MI250X: what torch sees as one device)."""

    name: str
    bf16: float
    fp32: float
    memory_bytes: int
    source: str

    def flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` ("bf16", "fp16" or "fp32")."""
        if dtype not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"dtype {dtype!r}: the peak table knows bf16, fp16 and fp32")
        return self.fp32 if dtype == "fp32" else self.bf16


GB = 10**9
#: The devices, most specific first (a name is matched against the first row whose ``needles`` it contains).
DEVICE_PEAKS: tuple[tuple[tuple[str, ...], DevicePeak], ...] = (
    (("GH200",), DevicePeak("GH200", 989 * TFLOP, 67 * TFLOP, 96 * GB,
                            "NVIDIA GH200 Grace Hopper Superchip datasheet (its H100: 989 TFLOP/s bf16 dense, 67 fp32)")),
    (("H200", "NVL"), DevicePeak("H200 NVL", 835 * TFLOP, 60 * TFLOP, 141 * GB,
                                 "NVIDIA H200 Tensor Core GPU datasheet, NVL (1671 TFLOP/s bf16 with sparsity = 835 "
                                 "dense, 60 fp32)")),
    (("H200",), DevicePeak("H200", 989 * TFLOP, 67 * TFLOP, 141 * GB,
                           "NVIDIA H200 Tensor Core GPU datasheet, SXM (989 TFLOP/s bf16 dense, 67 fp32)")),
    (("H100", "PCIE"), DevicePeak("H100 PCIe", 756 * TFLOP, 51 * TFLOP, 80 * GB,
                                  "NVIDIA H100 Tensor Core GPU datasheet, PCIe (756 TFLOP/s bf16 dense, 51 fp32)")),
    (("H100", "HBM3"), DevicePeak("H100 SXM", 989 * TFLOP, 67 * TFLOP, 80 * GB,
                                  "NVIDIA H100 Tensor Core GPU datasheet, SXM (989 TFLOP/s bf16 dense, 67 fp32)")),
    (("H100", "SXM"), DevicePeak("H100 SXM", 989 * TFLOP, 67 * TFLOP, 80 * GB,
                                 "NVIDIA H100 Tensor Core GPU datasheet, SXM (989 TFLOP/s bf16 dense, 67 fp32)")),
    (("A100",), DevicePeak("A100", 312 * TFLOP, 19.5 * TFLOP, 80 * GB,
                           "NVIDIA A100 Tensor Core GPU datasheet (312 TFLOP/s bf16 dense, 19.5 fp32; 40 or 80 GB)")),
    (("MI250X",), DevicePeak("MI250X GCD", 191.5 * TFLOP, 23.9 * TFLOP, 64 * GB,
                            "AMD Instinct MI250X datasheet (383 TFLOP/s bf16 per package = 191.5 per GCD; "
                            "fp32 vector 47.9 per package = 23.9 per GCD)")),
    (("MI300X",), DevicePeak("MI300X", 1307.4 * TFLOP, 163.4 * TFLOP, 192 * GB,
                             "AMD Instinct MI300X datasheet (1307.4 TFLOP/s bf16 dense, 163.4 fp32 vector)")),
)


def lookup_device(name: str) -> Optional[DevicePeak]:
    """The table row of a device name as torch/NVML/amdsmi report it, e.g. ``"NVIDIA H100 80GB HBM3"`` ->
    H100 SXM, ``"AMD Instinct MI250X"`` -> MI250X GCD; None when the device is not in the table (an H100 NVL,
    say, whose name says neither PCIe nor SXM/HBM3, is not guessed)."""
    key = name.upper().replace("-", " ")
    for needles, peak in DEVICE_PEAKS:
        if all(n in key for n in needles):
            return peak
    return None


@dataclass(frozen=True)
class Peak:
    """The peak one run's MFU is taken against: FLOP/s per device (None: no MFU) and where it came from."""

    flops: Optional[float]
    source: str


def resolve_peak(device_name: str, dtype: str, *, is_cpu: bool, peak_flops: Optional[float] = None,
                 machine: Optional[str] = None) -> Peak:
    """The peak for a run of ``dtype`` on ``device_name``: ``peak_flops`` when given, else the peak of the perfmodel
    ``machine`` file when named (on a CPU: its calibrated GEMM rate per rank), else the device table on a GPU;
    otherwise none (``Peak(None, why)``)."""
    if peak_flops is not None:
        if not peak_flops > 0:
            raise ValueError(f"peak FLOP/s {peak_flops!r} must be > 0, e.g. --peak-tflops 989")
        return Peak(float(peak_flops), "given on the command line")
    if machine is not None:
        from ..perfmodel.machines import load_machine       # torch-free, as this module
        m = load_machine(machine)
        what = "calibrated GEMM rate per rank" if is_cpu else "peak per GPU"
        return Peak(m.peak_flops(dtype), f"machine file {m.name} ({what}, {dtype})")
    if is_cpu:
        return Peak(None, "CPU: no peak (pass --peak-machine with a calibrated machine file, e.g. local-4, "
                          "or --peak-tflops)")
    row = lookup_device(device_name)
    if row is None:
        return Peak(None, f"device {device_name!r} is not in axgrid.metrics.peaks (pass --peak-tflops)")
    return Peak(row.flops(dtype), f"{row.name} {dtype} dense: {row.source}")
