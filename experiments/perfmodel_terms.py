"""Where the performance model's TP×PP×DP predictions go wrong: each published point's predicted time split by
term, the gap to the published time, and (Korthikanti et al. 2022's points, priced at their published
configurations) an estimate of the per-token memory-bound work the model does not price; then the 80B GPT on
1,024 Perlmutter GPUs, 4D against TP×PP×DP, term by term and with the error bands.

    python experiments/perfmodel_terms.py

The memory-bound estimate counts the bytes each kernel Megatron-LM ran in 2022 moves through HBM (A100 80 GB:
2.039 TB/s, NVIDIA A100 datasheet), per layer and micro-batch, and prices them at that bandwidth:
attention without a fused kernel: 13 bytes per score [mbs, heads/TP, S, S] in the forward (QKᵀ writes 2, the
fused scale-mask-softmax reads 2 and writes 2, dropout reads 2, writes 2 and a 1-byte mask, ·V reads 2), twice
that in the backward, once more in the recompute (full or selective); the h-sized element-wise kernels per token
(two layer norms: read + write; two dropout + residual adds: 3.5 each; bias + GELU: read + write of 4h/TP) in
fp16, the h-sized ones divided by TP under sequence parallelism, times 4 (forward, backward twice, recompute).
It is an estimate of an unmodelled term for this report, not part of the model.
"""
from __future__ import annotations

from axgrid import perfmodel as pm
from axgrid.perfmodel.band import band_for
from axgrid.perfmodel.pipeline import stage_layers
from axgrid.perfmodel.published import POINTS, check, check_all
from axgrid.perfmodel.spec import model_flops

A100_HBM = 2.039e12


def memory_bound_seconds(point, row) -> tuple[float, float]:
    """(attention S×S, h-sized element-wise) seconds per iteration on the slowest stage (module docstring)."""
    s = point.spec
    tp, pp, dp = point.config
    m = point.batch // (dp * point.mbs)
    slots = (m + (pp - 1) / point.vpp) * stage_layers(s.layers, pp)
    tokens = point.mbs * s.seq
    scores = point.mbs * (s.heads // tp) * s.seq ** 2
    h_elems = 11 * s.hidden / (tp if point.sp else 1) + 8 * s.hidden / tp
    return 52 * scores * slots / A100_HBM, h_elems * 2 * 4 * tokens * slots / A100_HBM


def terms(r) -> str:
    t = r.time_s
    parts = {"compute": r.compute_s, "TP/x,y,z": sum(r.exposed_s[d] for d in "xyz"), "DP": r.exposed_s["d"],
             "bubble": r.bubble_s, "p2p": r.p2p_s}
    return "  ".join(f"{k} {v / t:4.0%}" for k, v in parts.items())


def main() -> None:
    print("TP×PP×DP published points: predicted time by term (share of the predicted time), published − predicted")
    for c in check_all():
        if c.point.layout != "TPxPPxDP":
            continue
        r, p = c.predicted, c.point
        pub = r.time_s * c.ratio
        gap = pub - r.time_s
        line = (f"{p.name:24} h={p.spec.hidden:5d} {r.grid_str:28} pred {r.time_s:7.2f} s  pub {pub:7.2f} s  "
                f"{terms(r)}  gap {gap / r.compute_s:4.0%} of compute")
        if p.seconds is not None:
            att, elem = memory_bound_seconds(p, r)
            line += f"; memory-bound estimate {att + elem:5.2f} s = {(att + elem) / gap:3.0%} of the gap"
        print(line)

    print("\n80B GPT, 1,024 Perlmutter A100, batch 1024 (arXiv 2305.13525: AxoNN 4D 26% faster than Megatron-LM)")
    prob = pm.Problem(pm.get_model("gpt-80b"), 1024, 1024)
    perl = pm.load_machine("perlmutter")
    rk = pm.rank(prob, perl)
    best4, bestm = rk.feasible[0], next(r for r in rk.megatron if r.feasible)
    axonn = check(next(p for p in POINTS if p.name == "4D paper Perlmutter 80B"))
    t_axonn = model_flops(prob.model, prob.batch, True) / (axonn.point.tflops_per_gpu * 1e12 * prob.gpus)
    for r, pub, who in ((best4, t_axonn, "AxoNN (57% of peak)"), (bestm, 1.26 * t_axonn, "Megatron-LM (1.26×)")):
        print(f"  {r.grid_str:14} pred {r.time_s:6.2f} s (band {r.time_low:.2f}–{r.time_high:.2f})  published "
              f"{who} {pub:6.2f} s  ratio {pub / r.time_s:4.2f}  {terms(r)}  exposed x {r.exposed_s['x']:.2f} "
              f"y {r.exposed_s['y']:.2f} z {r.exposed_s['z']:.2f} d {r.exposed_s['d']:.2f}")
    a100 = band_for(pm.load_machine("dgx-a100"))
    lo, hi = bestm.time_s * a100.lo, bestm.time_s * a100.hi
    print(f"  {rk.band.describe()}")
    print(f"  what-if: {bestm.grid_str} with the TP×PP×DP error seen on the same GPU (dgx-a100, ×{a100.lo:.2f}–"
          f"×{a100.hi:.2f}): {lo:.2f}–{hi:.2f} s, against 4D {best4.time_low:.2f}–{best4.time_high:.2f} s")


if __name__ == "__main__":
    main()
