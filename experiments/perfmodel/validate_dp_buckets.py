"""What-if on a finished validation run: the data-parallel all-reduce priced per tensor (one all-reduce per weight
shard and bias, each paying 2(Gd-1)·α: what perfmodel did before it priced buckets) against per bucket (what
``perfmodel.model.evaluate`` does now, as ``axgrid.sync_gradients`` / ODP post it: one all-reduce per
``bucket_bytes`` bucket), recomputing the validation metrics against the same measured times.

    python experiments/perfmodel/validate_dp_buckets.py runs/validate-8/validation.csv --model gpt-tiny --gpus 8 \
        --machine local --batch 8 --dtype fp32 --no-ors
"""
from __future__ import annotations

import argparse
import csv

from axgrid import perfmodel as pm
from axgrid.perfmodel.comm import dim_strides, ring_alpha_beta
from axgrid.perfmodel.validate import metrics


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--model", required=True)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--dtype", default="fp32")
    for name in ("oar", "ors", "oag", "odp", "recompute"):
        ap.add_argument(f"--no-{name}", action="store_true")
    ap.add_argument("--keep-gathered", action="store_true")
    a = ap.parse_args(argv)
    opt = pm.Options(overlap_ar=not a.no_oar, overlap_rs=not a.no_ors, overlap_ag=not a.no_oag,
                     overlap_dp=not a.no_odp, recompute=not a.no_recompute, keep_gathered=a.keep_gathered)
    spec = pm.get_model(a.model)
    m = pm.load_machine(a.machine)
    rk = pm.rank(pm.Problem(spec, a.batch, a.gpus, a.dtype, opt), m)
    by = {r.grid_str: r for r in rk.feasible}
    with open(a.csv, newline="") as f:
        meas = {row["grid"]: float(row["measured_s"]) for row in csv.DictReader(f)}
    from axgrid.perfmodel.parameters import trainable_parameters
    n_tensors = len(trainable_parameters(spec, (1, 1, 1, 1)))   # every trainable tensor: embeddings, norms, FC, head
    pred_b, pred_t, ms = [], [], []
    for g, t in meas.items():
        r = by[g]
        gd = r.grid[3]
        extra = 0.0
        if gd > 1:
            _, stride = dim_strides(*r.grid, opt.order)["d"]
            al, _, _ = ring_alpha_beta(gd, stride, m)
            extra = 2 * (gd - 1) * float(al) * (n_tensors - r.dp_buckets)
        pred_b.append(r.time_s)
        pred_t.append(r.time_s + extra)      # upper bound of the old pricing (with ODP it hid some of it)
        ms.append(t)
    for name, p in (("per-tensor AR_d (perfmodel before)", pred_t), ("per-bucket AR_d (perfmodel now)", pred_b)):
        res = metrics(p, ms)
        print(f"{name:40s} n={res['n']} rho={res['spearman']:.3f} tau={res['kendall']:.3f} "
              f"regret={res['top1_regret']:.3f} MAPE={res['mape']:.1f}%")


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "validate_dp_buckets")     # errors said once, as one line (axgrid.launch.errors)
