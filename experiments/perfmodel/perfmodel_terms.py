"""Where the performance model's TP×PP×DP predictions go wrong: each published point's predicted time split by
term (compute = GEMMs + the element-wise kernels, shown apart), the gap to the published time; then the 80B GPT on
1,024 Perlmutter GPUs, 4D against TP×PP×DP, term by term and with the error bands.

    python experiments/perfmodel/perfmodel_terms.py

The element-wise term is the model's own (``perfmodel.compute.elementwise_bytes`` at the machine file's
``hbm_bandwidth``): the Korthikanti et al. 2022 points run Megatron-LM 2022's kernels (dropout, an unfused
attention softmax over [mbs, heads/TP, S, S]); the other points the defaults (no dropout, flash-style attention).
"""
from __future__ import annotations

import argparse

from axgrid import perfmodel as pm
from axgrid.perfmodel.band import band_for
from axgrid.perfmodel.published import POINTS, check, check_all
from axgrid.perfmodel.problem import model_flops


def terms(r) -> str:
    t = r.time_s
    parts = {"GEMM": r.compute_s - r.elementwise_s, "element-wise": r.elementwise_s, "TP/x,y,z": sum(r.exposed_s[d] for d in "xyz"), "DP": r.exposed_s["d"],
             "bubble": r.bubble_s, "p2p": r.p2p_s}
    return "  ".join(f"{k} {v / t:4.0%}" for k, v in parts.items())


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)     # no options: --help only
    print("TP×PP×DP published points: predicted time by term (share of the predicted time), published − predicted")
    for c in check_all():
        if c.point.layout != "TPxPPxDP":
            continue
        r, p = c.predicted, c.point
        pub = r.time_s * c.ratio
        gap = pub - r.time_s
        print(f"{p.name:24} h={p.spec.hidden:5d} {r.grid_str:28} pred {r.time_s:7.2f} s  pub {pub:7.2f} s  "
              f"{terms(r)}  gap {gap / (r.compute_s - r.elementwise_s):4.0%} of the GEMM time")

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
    from axgrid.launch.errors import run
    run(main, "perfmodel_terms")     # errors said once, as one line (axgrid.launch.errors)
