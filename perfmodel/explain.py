"""Text breakdown of one ranked configuration (``rank --explain N``)."""
from __future__ import annotations

import numpy as np

from .comm import DIMS, dim_strides, ring_alpha_beta
from .rank import Ranking, Row


def explain(rk: Ranking, row: Row) -> str:
    """Where the time and memory of ``row`` go: compute, per-dimension communication (raw and exposed after
    overlap), bytes per step, ring placement (group size, stride, intra/inter node, β), memory parts."""
    m, p = rk.machine, rk.problem
    gx, gy, gz, gd = row.grid
    geo = dim_strides(gx, gy, gz, gd, p.options.order)
    lines = [f"grid {row.grid_str} (Gx x Gy x Gz x Gd, order {p.options.order}) — rank {row.rank}",
             f"  model {p.model.name}: L={p.model.layers} h={p.model.hidden} heads={p.model.heads} "
             f"seq={p.model.seq} vocab={p.model.vocab}; batch {p.batch} in {row.microbatches} micro-batch(es); "
             f"{p.dtype}; overlap {p.options.overlap_spec()}; recompute {p.options.recompute}",
             f"  predicted {row.time_s:.4g} s/batch, {row.tflops_per_gpu:.1f} TFLOP/s/GPU = {row.pct_peak:.1f}% of "
             f"peak on {m.name}",
             f"  compute {row.compute_s:.4g} s",
             "  dim  size stride placement  beta(GB/s)  bytes/step/GPU   raw comm s  exposed s"]
    for d in DIMS:
        size, stride = geo[d]
        a, b, intra = ring_alpha_beta(np.array([size]), np.array([stride]), m)
        lines.append(f"  {d:>3} {int(size):5d} {int(stride):6d} {'intra' if intra[0] else 'inter':>9} "
                     f"{b[0] / 1e9:11.1f} {row.step_bytes[d] / 1e9:13.3f} GB {row.raw_comm_s[d]:12.4g} "
                     f"{row.exposed_s[d]:10.4g}")
    if row.dp_buckets:
        lines.append(f"  AR_d: {row.dp_buckets} gradient bucket(s) of <= {p.options.bucket_bytes / 2**20:g} MiB per step "
                     f"(one all-reduce each{', posted during the backward (ODP)' if p.options.overlap_dp else ''})")
    mp = row.memory_parts
    lines.append(f"  memory/GPU {row.memory_bytes / 2**30:.2f} GiB = static {mp['static'] / 2**30:.2f} + buffers "
                 f"{mp['buffers'] / 2**30:.2f} + activations {mp['activations'] / 2**30:.2f} (limit "
                 f"{p.options.memory_usable * m.memory_bytes / 2**30:.1f} GiB)")
    if row.reason:
        lines.append(f"  rejected: {row.reason}")
    return "\n".join(lines)
