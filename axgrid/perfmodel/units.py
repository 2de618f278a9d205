"""Numbers as a reader of the ranking table wants them: a unit chosen for the size of the values, so that a CPU
rank's figures are not printed as 0.0 (GFLOP/s and MiB there, TFLOP/s and GiB on a GPU), and "rank" for a machine
of CPU ranks where a GPU machine says "GPU"."""
from __future__ import annotations

from collections.abc import Iterable

from .machines import CPU_RANK, Machine


def device_word(machine: Machine) -> str:
    """What one rank of ``machine`` is called: "rank" for CPU ranks (``perfmodel calibrate``'s machines), "GPU"."""
    return "rank" if machine.gpu == CPU_RANK else "GPU"


def count(n: float) -> str:
    """A parameter count: 77.4B, 6.3M, 12.0K, 950."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return f"{n:.0f}"


def flops_unit(tflops: Iterable[float]) -> tuple[str, float]:
    """(unit, factor from TFLOP/s) for a column of TFLOP/s values: TFLOP/s from 1 up, GFLOP/s below, MFLOP/s below
    1 GFLOP/s."""
    top = max((v for v in tflops if v > 0), default=1.0)
    if top >= 1:
        return "TFLOP/s", 1.0
    return ("GFLOP/s", 1e3) if top >= 1e-3 else ("MFLOP/s", 1e6)


def flops(tflops: float, per: str = "GPU") -> str:
    """One throughput in its own unit: ``138.3 TFLOP/s/GPU``, ``4.38 GFLOP/s/rank``."""
    unit, f = flops_unit([tflops])
    return f"{tflops * f:.3g} {unit}/{per}" if f > 1 else f"{tflops:.1f} {unit}/{per}"


def memory_unit(nbytes: Iterable[float]) -> tuple[str, float]:
    """(unit, bytes per unit) for a column of byte counts: GiB from 1 GiB up, MiB below."""
    top = max(nbytes, default=0.0)
    return ("GiB", 2.0**30) if top >= 2**30 else ("MiB", 2.0**20)


def time_unit(seconds: Iterable[float]) -> tuple[str, float]:
    """(unit, factor from seconds) for a column of times: s from 1 s up, ms below."""
    top = max((v for v in seconds if v == v and v != float("inf")), default=1.0)
    return ("s", 1.0) if top >= 1 else ("ms", 1e3)
