"""Print the ``[[collective_table]]`` blocks of a machine file from the measured collectives of "The Big Send-off"
(arXiv 2504.18658; ../shared/data/pccl/collectives.csv, parsed from github axonn-ai/sc2025-pccl-reproducer).

    python experiments/perfmodel/collective_tables.py --machine frontier [--method nccl] [--csv PATH]

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


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", required=True, choices=("frontier", "perlmutter"))
    ap.add_argument("--method", default="nccl")
    ap.add_argument("--csv", default="../shared/data/pccl/collectives.csv")
    a = ap.parse_args(argv)
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
