"""Store the residuals of the validation suites that make the machines' error bands (``perfmodel.band``): price
vTrain's single-node runs, the Korthikanti points and the llama-public rows, and write each machine's
``axgrid/perfmodel/machines/NAME.suite-residuals.json``.

    python experiments/perfmodel/write_suite_residuals.py

vTrain's multi-node runs (the held-out test) are not read. Run it again after any change to the model or to a
machine file that moves a suite's figures (``validate-public`` shows them).
"""
from __future__ import annotations

from typing import Optional, Sequence

from axgrid.perfmodel.suites import BAND_SUITES, run_suites, summary_line, write_suite_residuals


def main(argv: Optional[Sequence[str]] = None) -> None:
    if argv:
        raise SystemExit(f"no arguments expected, got {list(argv)}")
    results = run_suites(BAND_SUITES)
    for res in results:
        print(summary_line(res).splitlines()[0])
    for path in write_suite_residuals(results):
        print(f"wrote {path}")


if __name__ == "__main__":
    from axgrid.launch.errors import run
    run(main, "write_suite_residuals")     # errors said once, as one line (axgrid.launch.errors)
