"""Energy of the devices a job runs on: one reader per device, chosen at start, its name logged with every step.

Sources, tried for the run's device:

- NVIDIA GPU: NVML through ``nvidia-ml-py`` (``import pynvml``; the ``metrics`` extra): the total-energy counter
  ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded, Volta and later); where the counter is not
  supported, the board power ``nvmlDeviceGetPowerUsage`` sampled by a thread and integrated (trapezoids).
- AMD GPU: ``amdsmi`` (ships with ROCm, matching its driver: not a pip extra): ``amdsmi_get_energy_count``
  (accumulator x counter resolution, µJ), else the socket power from ``amdsmi_get_power_info`` integrated. The
  GPU is found by its PCI address (a task bound with ``--gpu-bind=closest`` sees its GCD as HIP device 0, which
  is amdsmi's first GPU, not its own). An MI250X reports energy per package of two GCDs: the GCDs of a package
  (one serial number) are one device here, read once -- the sum of its GCDs' counters, or one of them when they
  report the same package counter.
- CPU: Linux RAPL under ``/sys/class/powercap`` (``intel-rapl:N`` package zones, also on AMD CPUs;
  ``energy_uj`` wraps at ``max_energy_range_uj``), where readable (root only on most kernels since 5.10).

Without one, :class:`Energy` reads None and its ``source`` says why, in one line.

One reader per device, so ranks sharing a node do not count it twice: the lowest rank of each device (on a GPU the
host and the GPU's PCI address -- an MI250X package's serial number --, on a CPU the host: RAPL counts the node's
packages, shared by all its ranks), found once at start by gathering every rank's device key
(:meth:`axgrid.device.Device.energy_key`, :func:`energy_readers`). Every other rank
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
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional, Sequence

if TYPE_CHECKING:
    from ..device import Device

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


def _bdf(text: object) -> str:
    """A PCI address in one spelling: ``dddd:bb:dd.f``, lower case, 4-digit domain (NVML writes 8, amdsmi 4)."""
    t = str(text).strip().lower()
    parts = t.split(":")
    if len(parts) == 3:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    return t


def _amdsmi_handles(amdsmi) -> list[tuple[str, object]]:
    """(PCI address, handle) of every AMD GPU amdsmi sees."""
    return [(_bdf(amdsmi.amdsmi_get_gpu_device_bdf(h)), h) for h in amdsmi.amdsmi_get_processor_handles()]


def _amdsmi_serial(amdsmi, handle) -> Optional[str]:
    try:
        serial = amdsmi.amdsmi_get_gpu_asic_info(handle).get("asic_serial")
    except Exception:
        return None
    return str(serial) if serial not in (None, "", "N/A", 0) else None


def amdsmi_package(pci_bus_id: str) -> Optional[str]:
    """The energy key of the GPU at ``pci_bus_id``: its package's serial number when the package holds several
    GPUs (MI250X: two GCDs), so that the ranks on both share one reader; None when amdsmi is missing or the GPU is
    a package of its own (the PCI address is then the key)."""
    try:
        import amdsmi  # type: ignore[import-not-found]
        amdsmi.amdsmi_init()
        handles = _amdsmi_handles(amdsmi)
    except Exception:
        return None
    want = _bdf(pci_bus_id)
    mine = next((h for b, h in handles if b == want), None)
    serial = _amdsmi_serial(amdsmi, mine) if mine is not None else None
    if serial is None or sum(_amdsmi_serial(amdsmi, h) == serial for _, h in handles) < 2:
        return None
    return f"package:{serial}"


def amdsmi_energy(pci_bus_id: Optional[str], index: int) -> Energy:
    """amdsmi energy of the GPU at ``pci_bus_id`` (its whole package when the package holds several GPUs); the HIP
    ``index`` only where torch reports no PCI address."""
    try:
        import amdsmi  # type: ignore[import-not-found]
    except ImportError:
        return Energy(None, "none: amdsmi is not installed (it ships with ROCm: /opt/rocm/share/amd_smi)")
    try:
        amdsmi.amdsmi_init()
        handles = _amdsmi_handles(amdsmi)
        if pci_bus_id is not None:
            want = _bdf(pci_bus_id)
            found = [h for b, h in handles if b == want]
            if not found:
                return Energy(None, f"none: amdsmi sees no GPU at {want} (it sees {[b for b, _ in handles]})")
            handle, where = found[0], want
        else:
            handle, where = handles[index][1], f"HIP index {index} (no PCI address from torch)"
    except Exception as e:
        return Energy(None, f"none: amdsmi unavailable ({type(e).__name__}: {e})")
    serial = _amdsmi_serial(amdsmi, handle)
    package = [h for _, h in handles if serial is not None and _amdsmi_serial(amdsmi, h) == serial] or [handle]

    def one(h) -> float:
        got = amdsmi.amdsmi_get_energy_count(h)
        acc = got.get("energy_accumulator", got.get("power"))      # the key was "power" before ROCm 6.1
        return float(acc) * float(got["counter_resolution"]) / 1e6
    try:
        first = [one(h) for h in package]
        if len(package) > 1 and len(set(first)) == 1:
            package = package[:1]                 # every GCD reports the package's one counter: read it once
        what = (f"GPU {where}" if len(package) == 1 else
                f"package {serial} ({len(package)} GCDs, from GPU {where})")
        return Energy(lambda: sum(one(h) for h in package), f"amdsmi energy accumulator ({what})")
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
        return Energy(None, f"none: amdsmi has neither an energy counter nor power readings for GPU {where} ({e})")
    return Energy(meter.joules, f"amdsmi socket power sampled every 50 ms and integrated (GPU {where})",
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


def detect_energy(device: "Device") -> Energy:
    """The energy source of ``device`` (an :class:`axgrid.device.Device`; see the module docstring), or none with
    the reason. Every rank detects (so every rank names the same source); only the readers
    (:func:`energy_readers`) read it."""
    return device.energy()
