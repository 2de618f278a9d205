"""GEMM time: a roofline (peak × efficiency). Efficiency comes from a measured table (nearest measured shape in
log space, as written by ``python -m axgrid.kernels export-efficiency``) or from a saturating curve of the smallest GEMM
dimension, eff = eff_max · d / (d + dim_half): per dtype from the machine file's ``gemm_efficiency`` (measured
large-GEMM rates of that GPU), else the two parameters calibration fits (default 0.75, 96).
Operand layouts are not modelled: the runtime's layout tuner picks the best layout per shape, and no per-layout
table is held for any shipped GPU."""
from __future__ import annotations

import numpy as np

from .machines import Machine


def curve_efficiency(m, n, k, eff_max: float, dim_half: float) -> np.ndarray:
    """Default efficiency curve in (0, eff_max]: small dimensions starve the GPU."""
    d = np.minimum(np.minimum(np.asarray(m, float), np.asarray(n, float)), np.asarray(k, float))
    return eff_max * d / (d + dim_half)


def _table_rate(m, n, k, machine: Machine, dtype: str) -> np.ndarray | None:
    rows = [g for g in machine.gemm_table if g.dtype == dtype]
    if not rows:
        return None
    t = np.log(np.array([[g.m, g.n, g.k] for g in rows], dtype=float))
    rate = np.array([g.flops_per_s for g in rows], dtype=float)
    m, n, k = np.broadcast_arrays(np.asarray(m, float), np.asarray(n, float), np.asarray(k, float))
    q = np.log(np.maximum(np.stack([m.ravel(), n.ravel(), k.ravel()], axis=1), 1.0))
    # nearest measured shape; chunk to bound memory for big queries
    best = np.empty(q.shape[0], dtype=np.int64)
    for s in range(0, q.shape[0], 4096):
        d = ((q[s:s + 4096, None, :] - t[None, :, :]) ** 2).sum(-1)
        best[s:s + 4096] = d.argmin(1)
    return rate[best].reshape(m.shape)


def gemm_rate(m, n, k, machine: Machine, dtype: str) -> np.ndarray:
    """Achieved FLOP/s of an [m,k]·[k,n] GEMM (never above the machine's peak)."""
    peak = machine.peak_flops(dtype)
    rate = _table_rate(m, n, k, machine, dtype)
    if rate is None:
        c = machine.gemm_curve(dtype)
        return peak * curve_efficiency(m, n, k, c.eff_max, c.dim_half)
    return np.minimum(rate, peak)


def gemm_time(m, n, k, machine: Machine, dtype: str) -> np.ndarray:
    """Seconds for 2·m·n·k FLOPs at the achieved rate; 0 when any dimension is 0."""
    m, n, k = (np.asarray(a, float) for a in (m, n, k))
    flops = 2.0 * m * n * k
    return np.where(flops > 0, flops / gemm_rate(np.maximum(m, 1), np.maximum(n, 1), np.maximum(k, 1),
                                                  machine, dtype), 0.0)
