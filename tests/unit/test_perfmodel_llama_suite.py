"""The llama-public suite (perfmodel/llama_suite.py, data/llama_public.csv): every published row names its source and
every excluded row its reason; the measured seconds are the published throughput's; the machine takes the
conditions a row states; a selective-recompute row is half-way between none and full; a malformed table is named."""
import csv
import math
from dataclasses import replace

import pytest

from axgrid import perfmodel as pm
from axgrid.perfmodel.llama_suite import (DATASHEET_HBM, llama_csv, measured_seconds, price_row, read_rows,
                                          row_machine, row_problem)
from axgrid.perfmodel.space import Grids


def test_every_row_cites_its_source_and_every_exclusion_its_reason():
    rows = read_rows()
    assert len(rows) >= 30 and len({r.row for r in rows}) == len(rows)
    priced = [r for r in rows if r.priced]
    assert len(priced) >= 12
    for r in rows:
        assert r.source.strip() and (r.priced or r.note.strip())
        if r.fp8 or r.compile or r.cp > 1:            # conditions perfmodel does not model are never priced
            assert not r.priced, r.row
    assert {r.model for r in priced} >= {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-2-7b",
                                         "llama-2-70b"}
    # the torchtitan rows already in ../shared/data/h100 are here unchanged
    tt = {r.row: r for r in rows}
    assert [tt[k].value for k in ("tt-h100-8b-fsdp8", "tt-h100-8b-fsdp8-compile", "tt-h100-8b-fsdp128",
                                  "tt-h100-8b-fsdp128-compile")] == [5762, 6667, 5605, 6514]


def test_measured_seconds_are_the_published_throughputs():
    r = next(x for x in read_rows() if x.row == "tt-h100-8b-fsdp8")
    assert measured_seconds(r, 1.0, 1.0) == pytest.approx(16 * 8192 / (5762 * 8))
    meta = next(x for x in read_rows() if x.row == "meta-405b-8k")
    assert meta.metric == "tflops_per_gpu" and measured_seconds(meta, 10.0, 500.0) == pytest.approx(10.0 * 500 / 430)


def test_row_machine_takes_the_stated_network_and_hbm():
    r = next(x for x in read_rows() if x.row == "tt-h100-8b-fsdp8")
    base = pm.load_machine("dgx-h100")
    m = row_machine(r, base)
    assert m.hbm_bandwidth == pytest.approx(base.hbm_bandwidth * 2.4e12 / DATASHEET_HBM["dgx-h100"])
    assert m.placement_of("inter").beta == pytest.approx(400e9 / 8 * 8)        # 400 Gb/s per GPU, 8 per node
    # the 500 W power limit: every compute rate at the stated peak (NVIDIA's datasheets, interpolated in power)
    assert r.peak_tflops_bf16 == pytest.approx(835.5 + (989.4 - 835.5) * (500 - 400) / (700 - 400), abs=0.05)
    assert m.peak_flops_bf16 == pytest.approx(886.8e12)
    assert [g.flops_per_s for g in m.gemm_table] == pytest.approx(
        [g.flops_per_s * 886.8e12 / base.peak_flops_bf16 for g in base.gemm_table])
    ibm = next(x for x in read_rows() if x.row == "ibm-a100-l2-7b")
    a = row_machine(ibm, pm.load_machine("dgx-a100"))
    assert a.placement_of("inter").beta == pytest.approx(50e9 / 8 * 8) and a.memory_bytes > 1e12
    assert ibm.peak_tflops_bf16 == 0 and a.peak_flops_bf16 == pm.load_machine("dgx-a100").peak_flops_bf16


def test_excluded_rows_and_malformed_tables_raise(tmp_path):
    bad = next(x for x in read_rows() if not x.priced)
    with pytest.raises(pm.PerfModelError, match=f"row '{bad.row}' is excluded"):
        price_row(bad)
    text = llama_csv().read_text().splitlines()
    f = tmp_path / "t.csv"
    f.write_text("\n".join([text[0], text[1].replace(",selective-op,", ",sometimes,")]) + "\n")
    with pytest.raises(pm.PerfModelError, match="row 'tt-h100-8b-fsdp8' has recompute 'sometimes'"):
        read_rows(f)


def test_a_selective_row_is_half_way_between_none_and_full(tmp_path):
    """An FSDP row is the 4D grid (1, TP, FSDP, replicas); selective recompute the mean of none and full (priced
    here on a GPT shape, which perfmodel prices whatever the Llama structure's state)."""
    rows = list(csv.DictReader(llama_csv().open()))
    one = dict(next(r for r in rows if r["row"] == "tt-h100-8b-fsdp8"), model="gpt-5b", seq="2048")
    f = tmp_path / "g.csv"
    with f.open("w", newline="") as out:
        w = csv.DictWriter(out, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerow(one)
    row = read_rows(f)[0]
    m = row_machine(row)
    t, tflops, _ = price_row(row)
    times = []
    for recompute in (False, True):
        prob = pm.Problem(replace(pm.get_model("gpt-5b"), seq=2048), 16, 8, "bf16",
                          pm.Options(recompute=recompute, zero=0))
        times.append(float(pm.evaluate(prob, m, Grids.of([(1, 1, 8, 1)])).time[0]))
    assert times[0] < times[1] and t == pytest.approx(sum(times) / 2)
    assert math.isfinite(tflops) and tflops > 0


def test_a_tp_row_runs_its_token_wise_kernels_sequence_parallel():
    """torchtitan's TP (its parallelize_llama: SequenceParallel on the norms) shards the residual stream's
    element-wise kernels over the TP ranks: the 405B row (TP 8) is priced with seq_split = 8, which moves less
    element-wise time than the same grid without it."""
    r = next(x for x in read_rows() if x.row == "tt-h100-405b-2d")
    assert r.tp == 8 and r.recompute == "full"
    m, prob = row_machine(r), row_problem(r, True)
    grid = Grids.of([(1, 8, 16, 1)])
    sp, whole = (pm.evaluate(prob, m, grid, seq_split=k) for k in (8, 1))
    assert price_row(r)[0] == pytest.approx(float(sp.time[0]))
    assert float(sp.extra["elementwise"][0]) < 0.5 * float(whole.extra["elementwise"][0])
