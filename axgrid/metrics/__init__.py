"""Per-step metrics of a training run: throughput, MFU, memory, communication and energy, in one record.

==================  =================================================================================
:mod:`.record`      :class:`StepMeter` (one row per step), :func:`summarize`
:mod:`.run`         :class:`Metrics` (meter + sinks, what a driver holds), :func:`add_arguments`
:mod:`.peaks`       dense peak FLOP/s by device name, with sources: :func:`lookup_device`, :func:`resolve_peak`
:mod:`.memory`      :class:`PeakMemory` (allocator peak on a GPU, host RSS peak on a CPU)
:mod:`.energy`      :func:`detect_energy` (NVML, amdsmi, RAPL; one reader per device)
:mod:`.sinks`       :class:`MetricsLog` (JSON lines, TensorBoard, progress bar)
==================  =================================================================================
"""
from .energy import Energy, detect_energy, energy_readers
from .memory import PeakMemory
from .peaks import DEVICE_PEAKS, DevicePeak, Peak, lookup_device, resolve_peak
from .record import StepMeter, summarize
from .run import Metrics, add_arguments
from .sinks import MetricsLog

__all__ = ["Energy", "detect_energy", "energy_readers", "PeakMemory", "DEVICE_PEAKS", "DevicePeak", "Peak",
           "lookup_device", "resolve_peak", "StepMeter", "summarize", "Metrics", "add_arguments", "MetricsLog"]
