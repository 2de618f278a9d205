"""``perfmodel rank --verify``'s table prints memory in ``perfmodel.units.memory_unit``'s unit for the peaks it shows
(as the ranking table's memory column): GiB once a peak reaches 1 GiB, MiB below, whatever the machine's memory."""
from __future__ import annotations

from axgrid.perfmodel.row import Row
from axgrid.perfmodel.verify import Verified, verify_table


def _verified(predicted: float, measured: int) -> Verified:
    row = Row(rank=1, grid=(1, 1, 1, 2), feasible=True, reason="", time_s=1.0, tflops_per_gpu=1.0, pct_peak=1.0,
              memory_bytes=predicted, microbatches=1, compute_s=1.0)
    return Verified(row, measured, fits=True, bytes_equal=True, disagreements=[], seconds=1.0)


def test_verify_table_memory_unit_follows_the_peaks():
    small = verify_table([_verified(300 * 2**20, 310 * 2**20)], 64 * 2**30).splitlines()[1].split()
    assert small[2:8] == ["300.00", "MiB", "310.00", "MiB", "65536.0", "MiB"], small
    big = verify_table([_verified(1.5 * 2**30, 2**29)], 64 * 2**30).splitlines()[1].split()
    assert big[2:8] == ["1.50", "GiB", "0.50", "GiB", "64.0", "GiB"], big
