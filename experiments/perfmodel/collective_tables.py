"""Print the ``[[collective_table]]`` blocks of a machine file from the measured collectives of "The Big Send-off"
(arXiv 2504.18658; ../shared/data/pccl/collectives.csv, parsed from github axonn-ai/sc2025-pccl-reproducer), or for
``dgx-a100`` from vTrain's measured NCCL all-reduce look-up tables (github VIA-Research/vTrain, MIT licence,
``trace/a100/AR_GPU{p}_1M_1024M_LUT``: nccl-tests' all_reduce_perf on 2 to 8 A100s of one node, 1 MiB to 1 GiB).

    python experiments/perfmodel/collective_tables.py --machine frontier [--method nccl] [--csv PATH]
    python experiments/perfmodel/collective_tables.py --machine dgx-a100 --vtrain-trace VTRAIN/trace/a100

One table per (collective, GPU count) of the vendor library (``nccl``: RCCL on Frontier, NCCL on Perlmutter), the
median over the jobs that measured a size. Sizes in the ledger's convention: the benchmark prints the all-gather's
gathered buffer and the reduce-scatter's per-rank output, so a reduce-scatter's input is GPUs × that (checked against
the logged time: busbw = (p−1)/p · input / time).
"""
from __future__ import annotations

import argparse
import csv
import statistics
from typing import Optional, Sequence

SOURCE = ("The Big Send-off (arXiv 2504.18658), github axonn-ai/sc2025-pccl-reproducer data/ (commit cfad79d), "
          "{method} {coll} on {gpus} {unit}, median bus bandwidth over the jobs that measured each size")
VTRAIN_SOURCE = ("vTrain (MICRO'24), github VIA-Research/vTrain (commit f8dda84, MIT licence) "
                 "trace/a100/AR_GPU{gpus}_1M_1024M_LUT: nccl-tests all_reduce_perf on {gpus} A100 SXM4 of one node, "
                 "out-of-place bus bandwidth at the power-of-two sizes")
#: the GPU counts of vTrain's look-up tables that a machine file carries (the TP and DP groups of one DGX A100 node)
VTRAIN_GROUPS = (2, 4, 8)


def vtrain_tables(trace_dir: str) -> None:
    """Print one all-reduce ``[[collective_table]]`` per GPU count from vTrain's look-up tables (columns: size in
    bytes, count, type, time (ns), busbw (GB/s) out-of-place, then in-place), at the power-of-two sizes."""
    for p in VTRAIN_GROUPS:
        with open(f"{trace_dir}/AR_GPU{p}_1M_1024M_LUT", newline="") as f:
            rows = [r for r in csv.reader(f)][1:]
        pts = [(int(r[0]), float(r[4]) * 1e9) for r in rows if r and int(r[0]) & (int(r[0]) - 1) == 0]
        print("[[collective_table]]")
        print('collective = "all_reduce"')
        print(f"group = {p}")
        print(f'source = "{VTRAIN_SOURCE.format(gpus=p)}"')
        print(f"bytes = [{', '.join(f'{x:.6g}' for x, _ in pts)}]")
        print(f"bus_bandwidth = [{', '.join(f'{b:.4g}' for _, b in pts)}]")
        print()


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", required=True, choices=("frontier", "perlmutter", "dgx-a100"))
    ap.add_argument("--method", default="nccl")
    ap.add_argument("--csv", default="../shared/data/pccl/collectives.csv")
    ap.add_argument("--vtrain-trace", metavar="DIR", help="dgx-a100: vTrain's trace/a100 folder")
    a = ap.parse_args(argv)
    if a.machine == "dgx-a100":
        if not a.vtrain_trace:
            ap.error("--machine dgx-a100 needs --vtrain-trace DIR (vTrain's trace/a100 folder)")
        vtrain_tables(a.vtrain_trace)
        return
    with open(a.csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["machine"] == a.machine and r["method"] == a.method]
    by: dict[tuple[str, int], dict[float, list[float]]] = {}
    for r in rows:
        p = int(r["gpus"])
        size = float(r["size_MB"]) * 1e6 * (p if r["coll"] == "reduce_scatter" else 1)
        by.setdefault((r["coll"], p), {}).setdefault(size, []).append(float(r["busbw_GBps"]) * 1e9)
    unit = "GCDs" if a.machine == "frontier" else "GPUs"
    for (coll, p), sizes in sorted(by.items()):
        xs = sorted(sizes)
        print("[[collective_table]]")
        print(f'collective = "{coll}"')
        print(f"group = {p}")
        print(f'source = "{SOURCE.format(method=a.method, coll=coll, gpus=p, unit=unit)}"')
        print(f"bytes = [{', '.join(f'{x:.6g}' for x in xs)}]")
        print(f"bus_bandwidth = [{', '.join(f'{statistics.median(sizes[x]):.4g}' for x in xs)}]")
        print()


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "collective_tables")     # errors said once, as one line (axgrid.launch.errors)
