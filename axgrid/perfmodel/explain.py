"""Text breakdown of one priced configuration (``rank --explain N``, ``rank --grid``, ``rank --tp/--pp/--dp``)."""
from __future__ import annotations

import numpy as np

from .comm import DIMS, dim_strides, ring_alpha_beta
from .machines import Machine
from .row import Row
from .problem import Problem

#: what each grid dimension means in a TP×PP×DP row (its stage is priced on the grid (1, TP, 1, DP))
_TPPPDP_NAMES = {"x": "-", "y": "TP", "z": "-", "d": "DP"}


def explain(prob: Problem, machine: Machine, row: Row, position: int | None = None) -> str:
    """Where the time and memory of ``row`` go: compute, per-dimension communication (raw and exposed after
    overlap), bytes per step, ring placement (group size, stride, intra/inter node, β), memory parts; for a
    TP×PP×DP row also the pipeline bubble and the stage-to-stage sends. ``position``: its place in the
    combined ranking, if any."""
    m, p = machine, prob
    gx, gy, gz, gd = row.grid
    order = p.options.order if row.layout == "4D" else "xyzd"
    geo = dim_strides(gx, gy, gz, gd, order)
    where = f"rank {position}" if position else ("rank " + str(row.rank) if row.rank else "not ranked")
    kind = "Gx x Gy x Gz x Gd, order " + order if row.layout == "4D" else \
        "Megatron-style TP x PP x DP, distributed optimizer"
    lines = [f"{row.layout} {row.grid_str} ({kind}) — {where}",
             f"  model {p.model.name}: L={p.model.layers} h={p.model.hidden} heads={p.model.heads} "
             f"seq={p.model.seq} vocab={p.model.vocab}; batch {p.batch} in {row.microbatches} micro-batch(es); "
             f"{p.dtype}; overlap {p.options.overlap_spec()}; recompute {row.recompute or p.options.recompute}"]
    if not row.feasible:
        lines.append(f"  infeasible: {row.reason}")
    else:
        lines.append(f"  predicted {row.time_s:.4g} s/batch, {row.tflops_per_gpu:.1f} TFLOP/s/GPU = "
                     f"{row.pct_peak:.1f}% of peak on {m.name}")
        if row.time_high > 0:
            lines.append(f"  model error band {row.time_low:.4g}–{row.time_high:.4g} s (perfmodel.band)"
                         + (f"; outside the validated range: {row.out_of_range}" if row.out_of_range else ""))
    if row.layout != "4D":
        stage = -(-p.model.layers // row.pp)
        lines.append(f"  pipeline: {row.pp} stage(s) of <= {stage} blocks, {row.vpp} chunk(s) per stage, "
                     f"sequence parallel {'on' if row.sp else 'off'}; bubble {row.bubble_s:.4g} s "
                     f"((PP-1)/VPP of {row.microbatches} + (PP-1)/VPP micro-batch slots), stage sends "
                     f"{row.p2p_s:.4g} s; one stage (the one with the LM head) below")
    lines += [f"  compute {row.compute_s:.4g} s (element-wise {row.elementwise_s:.4g} s of it; "
              f"{m.elementwise_note()})",
              "  dim  size stride placement  beta(GB/s)  bytes/step/GPU   raw comm s  exposed s"]
    for d in DIMS:
        size, stride = geo[d]
        a, b, intra = ring_alpha_beta(np.array([size]), np.array([stride]), m)
        name = d if row.layout == "4D" else f"{_TPPPDP_NAMES[d]:>3}"
        lines.append(f"  {name:>3} {int(size):5d} {int(stride):6d} {'intra' if intra[0] else 'inter':>9} "
                     f"{b[0] / 1e9:11.1f} {row.step_bytes[d] / 1e9:13.3f} GB {row.raw_comm_s[d]:12.4g} "
                     f"{row.exposed_s[d]:10.4g}")
    if row.step_bytes.get("xyz"):
        lines.append(f"  xyz {gx * gy * gz:5d}      - clip norm {'':11} {int(row.step_bytes['xyz']):13d} B  "
                     f"{row.raw_comm_s['xyz']:12.4g} {row.exposed_s['xyz']:10.4g}")
    if row.dp_buckets:
        odp = p.options.overlap_dp
        size = f"{row.dp_buckets} gradient bucket(s) of >= {p.options.bucket_bytes / 2**20:g} MiB"
        if row.zero == 0:
            lines.append(f"  AR_d: {size} per step (one all-reduce each"
                         f"{', posted during the backward (ODP)' if odp else ''})")
        else:
            lines.append(f"  zero={row.zero}: {size}, each reduce-scattered over d ("
                         f"{'in every micro-batch' if row.zero == 2 else 'once per step'}"
                         f"{', during the backward (ODP)' if odp else ''}), AdamW on this rank's 1/Gd share, the "
                         f"parameters all-gathered over d after the step"
                         f"{' under the next forward (ODP)' if odp else ''}")
    mp = row.memory_parts
    if prob.model.is_moe and row.layout == "4D":
        moe = prob.model
        lines.append(f"  experts: {moe.experts}, {moe.top_k} per token, over ep={row.ep} (each rank holds "
                     f"{moe.experts // row.ep}, "
                     f"gradients over Gd/ep={row.grid[3] // row.ep} replicas); dispatch/combine all-to-alls "
                     f"{row.all_to_all_s:.4g} s, {row.all_to_all_bytes / 1e9:.3f} GB sent per GPU per batch "
                     f"(in d; uniform routing, perfmodel.moe)")
    lines.append(f"  memory/GPU {row.memory_bytes / 2**30:.2f} GiB = static {mp['static'] / 2**30:.2f} + buffers "
                 f"{mp['buffers'] / 2**30:.2f} + activations {mp['activations'] / 2**30:.2f} (limit "
                 f"{p.options.memory_usable * m.memory_bytes / 2**30:.1f} GiB)")
    return "\n".join(lines)
