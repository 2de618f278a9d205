"""Energy of the devices a job runs on: one reader per device, chosen at start, its name logged with every step.

Sources, tried for the run's device:

- NVIDIA GPU: NVML through ``nvidia-ml-py`` (``import pynvml``; the ``metrics`` extra): the total-energy counter
  ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded, Volta and later); where the counter is not
  supported, the board power ``nvmlDeviceGetPowerUsage`` sampled by a thread and integrated (trapezoids).
- AMD GPU: ``amdsmi`` (ships with ROCm, matching its driver: not a pip extra): ``amdsmi_get_energy_count``
  (accumulator x counter resolution, µJ), else the socket power from ``amdsmi_get_power_info`` integrated.
- CPU: Linux RAPL under ``/sys/class/powercap`` (``intel-rapl:N`` package zones, also on AMD CPUs;
  ``energy_uj`` wraps at ``max_energy_range_uj``), where readable (root only on most kernels since 5.10).

Without one, :class:`Energy` reads None and its ``source`` says why, in one line.

One reader per device, so ranks sharing a node do not count it twice: the lowest rank of each device (on a GPU the
host and the GPU's PCI address, on a CPU the host: RAPL counts the node's packages, shared by all its ranks), found
once at start by gathering every rank's device key (:func:`device_key`, :func:`energy_readers`). Every other rank
reads nothing. The job's energy per step is the
sum over the readers (:class:`axgrid.metrics.StepMeter` sums it in its per-step reduction); it is null when a
reader failed, so a partial sum is never shown as the total. GPU figures are the GPUs' own (board power), not
the host's; a CPU figure is the packages' (cores, caches, memory controller), not DRAM or the rest of the node.
"""
from __future__ import annotations

import glob
import hashlib
import os
import re
import socket
import threading
import time
from typing import Callable, Optional, Sequence

import torch

POWERCAP = "/sys/class/powercap"


class PowerIntegrator:
    """Joules from a power reading (W) sampled every ``interval_s`` by a daemon thread (trapezoid rule)."""

    def __init__(self, watts: Callable[[], float], interval_s: float = 0.05) -> None:
        self._watts, self._interval = watts, interval_s
        self._joules, self._last = 0.0, (time.perf_counter(), float(watts()))
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="axgrid-power", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        t, w = time.perf_counter(), float(self._watts())
        with self._lock:
            t0, w0 = self._last
            self._joules += 0.5 * (w + w0) * (t - t0)
            self._last = (t, w)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._sample()
            except Exception:
                return            # the device went away: the integral stops growing

    def joules(self) -> float:
        self._sample()
        with self._lock:
            return self._joules

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


class Energy:
    """A device's energy counter: ``read()`` is cumulative joules (None: no reading), ``source`` names it or
    says why there is none."""

    def __init__(self, read: Optional[Callable[[], float]], source: str,
                 close: Callable[[], None] = lambda: None) -> None:
        self._read, self.source, self._close = read, source, close

    @property
    def available(self) -> bool:
        return self._read is not None

    def read(self) -> Optional[float]:
        if self._read is None:
            return None
        try:
            return float(self._read())
        except Exception:
            return None

    def close(self) -> None:
        self._close()


def nvml_energy(index: int, pci_bus_id: Optional[str] = None) -> Energy:
    """NVML energy of GPU ``index`` (or the one at ``pci_bus_id``: the index torch sees is not NVML's under
    ``CUDA_VISIBLE_DEVICES``)."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return Energy(None, "none: nvidia-ml-py is not installed (pip install 'axgrid[metrics]')")
    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id) if pci_bus_id else None
        except Exception:
            handle = None
        handle = handle or pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
    except Exception as e:        # pynvml.NVMLError and its subclasses (library missing, no device, ...)
        return Energy(None, f"none: NVML unavailable ({type(e).__name__}: {e})")
    try:
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        return Energy(lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3,
                      f"nvml total-energy counter ({name})")
    except Exception:
        pass
    try:
        meter = PowerIntegrator(lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3)
    except Exception as e:
        return Energy(None, f"none: NVML has neither an energy counter nor power readings for {name} ({e})")
    return Energy(meter.joules, f"nvml power sampled every 50 ms and integrated ({name}: no energy counter)",
                  close=meter.close)


def amdsmi_energy(index: int) -> Energy:
    """amdsmi energy of GPU ``index`` (the HIP device order)."""
    try:
        import amdsmi  # type: ignore[import-not-found]
    except ImportError:
        return Energy(None, "none: amdsmi is not installed (it ships with ROCm: /opt/rocm/share/amd_smi)")
    try:
        amdsmi.amdsmi_init()
        handle = amdsmi.amdsmi_get_processor_handles()[index]
    except Exception as e:
        return Energy(None, f"none: amdsmi unavailable ({type(e).__name__}: {e})")

    def counter() -> float:
        got = amdsmi.amdsmi_get_energy_count(handle)
        acc = got.get("energy_accumulator", got.get("power"))      # the key was "power" before ROCm 6.1
        return float(acc) * float(got["counter_resolution"]) / 1e6
    try:
        counter()
        return Energy(counter, f"amdsmi energy accumulator (GPU {index})")
    except Exception:
        pass

    def watts() -> float:
        info = amdsmi.amdsmi_get_power_info(handle)
        w = info.get("current_socket_power", info.get("average_socket_power"))
        if not isinstance(w, (int, float)):
            raise RuntimeError(f"amdsmi power reading {w!r}")
        return float(w)
    try:
        meter = PowerIntegrator(watts)
    except Exception as e:
        return Energy(None, f"none: amdsmi has neither an energy counter nor power readings for GPU {index} ({e})")
    return Energy(meter.joules, f"amdsmi socket power sampled every 50 ms and integrated (GPU {index})",
                  close=meter.close)


def rapl_zones(root: str = POWERCAP) -> list[str]:
    """The RAPL package zones (top level, named ``package-N``: not ``psys``, which contains them)."""
    out = []
    for path in sorted(glob.glob(os.path.join(root, "intel-rapl:*"))):
        if not re.fullmatch(r"intel-rapl:\d+", os.path.basename(path)):
            continue                                    # sub-zones (core, uncore, dram) are inside a package
        try:
            with open(os.path.join(path, "name")) as f:
                if f.read().strip().startswith("package"):
                    out.append(path)
        except OSError:
            continue
    return out


def rapl_energy(root: str = POWERCAP) -> Energy:
    """Sum of the RAPL package counters of this node, unwrapped."""
    if not os.path.isdir(root):
        return Energy(None, f"none: no {root} on this machine (no RAPL powercap driver), and no GPU")
    zones = rapl_zones(root)
    if not zones:
        return Energy(None, f"none: {root} has no RAPL package zone, and no GPU")
    try:
        ranges = []
        for z in zones:
            with open(os.path.join(z, "max_energy_range_uj")) as f:
                ranges.append(int(f.read()))
            with open(os.path.join(z, "energy_uj")) as f:
                int(f.read())
    except (OSError, ValueError) as e:
        return Energy(None, f"none: RAPL counters under {root} are not readable ({e.__class__.__name__}: {e}; "
                            f"root only since Linux 5.10)")
    state = {"last": [None] * len(zones), "total": 0.0}

    def read() -> float:
        for i, z in enumerate(zones):
            with open(os.path.join(z, "energy_uj")) as f:
                now = int(f.read())
            last = state["last"][i]
            if last is not None:
                state["total"] += (now - last if now >= last else now + ranges[i] - last) / 1e6
            state["last"][i] = now
        return state["total"]
    read()
    return Energy(read, f"RAPL package counters ({len(zones)} package(s) of this node, /sys/class/powercap)")


def device_key(device: torch.device) -> str:
    """What names the device this rank's energy comes from, across the job: the host, and on a GPU its PCI
    address (or UUID), so ranks that see their GPU as ``cuda:0`` under ``CUDA_VISIBLE_DEVICES`` stay apart."""
    host = socket.gethostname()
    if device.type != "cuda":
        return host
    props = torch.cuda.get_device_properties(device.index if device.index is not None else torch.cuda.current_device())
    return f"{host}/{_pci_bus_id(props) or getattr(props, 'uuid', None) or device.index}"


def energy_readers(keys: Sequence[tuple[int, int]], rank: int) -> tuple[bool, int]:
    """From every rank's ``(device key hash, rank)``: whether ``rank`` reads its device (it is the lowest rank on
    that device) and how many readers the job has (one per distinct device)."""
    first: dict[int, int] = {}
    for key, r in keys:
        first[key] = min(r, first.get(key, r))
    mine = next(k for k, r in keys if r == rank)
    return first[mine] == rank, len(first)


def key_hash(key: str) -> int:
    """A device key as an int64 a collective can carry."""
    return int(hashlib.sha1(key.encode()).hexdigest()[:15], 16)


def detect_energy(device: torch.device) -> Energy:
    """The energy source of ``device`` (see the module docstring), or none with the reason. Every rank detects
    (so every rank names the same source); only the readers (:func:`energy_readers`) read it."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if torch.version.hip:
            return amdsmi_energy(index)
        return nvml_energy(index, _pci_bus_id(torch.cuda.get_device_properties(index)))
    return rapl_energy()


def _pci_bus_id(props: object) -> Optional[str]:
    """NVML's ``DDDDDDDD:BB:DD.0`` for a torch device (None when this torch does not report it)."""
    parts = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    if not all(isinstance(p, int) for p in parts):
        return None
    return "{:08X}:{:02X}:{:02X}.0".format(*parts)
