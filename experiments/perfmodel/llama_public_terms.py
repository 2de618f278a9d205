"""Where the time of each priced llama-public row goes (``perfmodel.llama_suite``): per row, measured and predicted
seconds per step, the error, and the predicted terms of the FSDP grid (GEMMs forward and backward, attention,
element-wise kernels, cross entropy, optimizer, kernel launches, exposed communication per dimension), for the
recompute mode the row blends (none and full; a selective row is their mean).

    python experiments/perfmodel/llama_public_terms.py

It reads what ``validate-public --suite llama-public`` prices and fits nothing.
"""
from __future__ import annotations

from typing import Optional, Sequence

from axgrid.perfmodel.llama_suite import RECOMPUTE, price_row, read_rows, row_machine, row_problem, measured_seconds
from axgrid.perfmodel.model import evaluate
from axgrid.perfmodel.space import Grids

TERMS = ("compute_fwd", "compute_bwd", "attention", "elementwise", "loss", "optimizer", "kernels")


def main(argv: Optional[Sequence[str]] = None) -> None:
    if argv:
        raise SystemExit(f"no arguments expected, got {list(argv)}")
    for r in read_rows():
        if not r.priced:
            continue
        t, tf, _ = price_row(r)
        meas = measured_seconds(r, t, tf)
        print(f"{r.row}: {r.model} {r.gpus} GPUs {r.config} b{r.global_batch}x{r.seq} {r.recompute}: predicted "
              f"{t:.3f} s, measured {meas:.3f} s ({100 * (t - meas) / meas:+.1f}%), {tf:.0f} TFLOP/s/GPU predicted, "
              f"{tf * t / meas:.0f} measured")
        if r.layout != "fsdp":
            continue
        m = row_machine(r)
        share = RECOMPUTE[r.recompute]
        for recompute in ([False] if share == 0 else [True] if share == 1 else [False, True]):
            ev = evaluate(row_problem(r, recompute), m, Grids.of([(1, r.tp, r.fsdp, r.replicas)]), seq_split=r.tp)
            terms = " ".join(f"{k} {float(ev.extra[k][0]):.3f}" for k in TERMS if k in ev.extra)
            comm = " ".join(f"{d} {float(ev.exposed[d][0]):.3f}/{float(ev.raw[d][0]):.3f}" for d in ev.exposed)
            print(f"    recompute {'full' if recompute else 'none'}: step {float(ev.time[0]):.3f} s = compute "
                  f"{float(ev.compute[0]):.3f} ({terms}) + exposed/raw comm ({comm}); micro-batches "
                  f"{int(ev.microbatches[0])}")


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "llama_public_terms")     # errors said once, as one line (axgrid.launch.errors)
