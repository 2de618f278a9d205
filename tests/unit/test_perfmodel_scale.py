"""perfmodel at scale: measured bandwidth tables, per-GPU GEMM curves, Megatron-style TP×PP×DP, named
configurations, the published-points check, and the CLI's one-line errors."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from axgrid import perfmodel as pm
from axgrid.perfmodel import pipeline as pl
from axgrid.perfmodel.cli import main
from axgrid.perfmodel.comm import ring_alpha_beta
from axgrid.perfmodel.compute import gemm_rate
from axgrid.perfmodel.machines import MACHINE_DIR, Placement
from axgrid.perfmodel.space import Grids

TINY = ["--model", "gpt-tiny", "--gpus", "8", "--machine", "perlmutter", "--batch", "16"]


def test_bandwidth_table_by_placement_stride_and_group():
    m = pm.load_machine("perlmutter")
    p = np.array([2, 4, 8, 64, 2, 4, 2, 32])
    s = np.array([1, 1, 1, 1, 2, 2, 4, 64])
    a, b, intra = ring_alpha_beta(p, s, m)
    assert (b / 1e9).tolist() == [76, 225, 80, 80, 76, 40, 20, 20]      # the AxoNN SC24 paper's Perlmutter table
    assert intra.tolist() == [True, True, False, False, True, False, False, False]
    f = pm.load_machine("frontier")
    _, b, _ = ring_alpha_beta(np.array([2, 4, 8, 16, 2, 4, 8, 2, 4, 2]), np.array([1, 1, 1, 1, 2, 2, 2, 4, 4, 8]), f)
    assert (b / 1e9).tolist() == [129, 52, 135, 40, 50, 72, 20, 36, 10, 5]
    # a calibrated (fitted) class keeps its α-β form; the table still serves the other class
    cal = replace(m, placement={"intra": Placement(1e-6, 1e9)})
    _, b, _ = ring_alpha_beta(np.array([4, 8]), np.array([1, 1]), cal)
    assert b.tolist() == [1e9, 80e9]


def test_gemm_efficiency_per_gpu_from_the_machine_file():
    for name, eff in (("perlmutter", 0.869), ("frontier", 0.663), ("alps", 0.838), ("dgx-h100", 0.803)):
        m = pm.load_machine(name)
        big = float(gemm_rate(8192, 8192, 8192, m, "fp16"))                   # fp16 uses the bf16 curve
        assert big == pytest.approx(m.peak_flops_bf16 * eff * 8192 / (8192 + 96.0))
        if not m.gemm_table:
            assert float(gemm_rate(8192, 8192, 8192, m, "bf16")) == big
    m = pm.load_machine("perlmutter")
    assert float(gemm_rate(64, 64, 64, m, "fp32")) == pytest.approx(m.peak_flops_fp32 * 0.75 * 64 / 160)  # default


def test_machine_tables_carry_sources_and_bad_tables_are_named(tmp_path):
    for f in MACHINE_DIR.glob("*.toml"):
        lines = f.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith(("bandwidth_table", "gemm_efficiency")):
                assert "# source:" in lines[i - 1] or "# source:" in lines[i - 2], (f.name, line)
    good = (MACHINE_DIR / "perlmutter.toml").read_text()
    bad = tmp_path / "m.toml"
    bad.write_text(good.replace('placement = "inter", stride = 4', 'placement = "attic", stride = 4'))
    with pytest.raises(pm.MachineFileError, match=r"m\.toml.*bandwidth_table.*entry 5.*placement"):
        pm.load_machine(bad)
    bad.write_text(good.replace("eff_max = 0.869", "eff_max = 1.5"))
    with pytest.raises(pm.MachineFileError, match=r"gemm_efficiency\.bf16\.eff_max"):
        pm.load_machine(bad)


def test_machine_tables_roundtrip(tmp_path):
    from axgrid.perfmodel.machines import machine_to_toml
    m = pm.load_machine("frontier")
    f = tmp_path / "f.toml"
    f.write_text(machine_to_toml(m))
    back = pm.load_machine(f)
    assert back.bandwidth_table == m.bandwidth_table and back.gemm_curves == m.gemm_curves
    assert back.collective_tables == m.collective_tables and len(m.collective_tables) == 16


def test_measured_collective_tables_interpolate_log_log_and_fall_back_to_alpha_beta(tmp_path):
    from axgrid.perfmodel.comm import collective_time, measured_time, ring_time
    m = pm.load_machine("frontier")
    ag = {t.group: t for t in m.collective_tables if t.collective == "all_gather"}
    # a measured point: "The Big Send-off", RCCL all-gather of 64 MB (67,108,864 B printed as 67.109 MB) on 16
    # GCDs: 66.22 GB/s (median of two jobs); on 256 the bandwidth collapses (0.151 and 0.799 GB/s: 0.475)
    t16, t256 = measured_time("all_gather", np.array([16, 256]), 67.109e6, m)
    assert t16 == pytest.approx(15 / 16 * 67.109e6 / 66.22e9, rel=1e-3)
    assert t256 == pytest.approx(255 / 256 * 67.109e6 / 0.475e9, rel=1e-3) and t256 > 50 * t16
    # log-log between two measured sizes and between two measured groups: the geometric mean at the midpoint
    t = ag[16]
    mid = float(np.sqrt(t.nbytes[6] * t.nbytes[7]))
    bw = 15 / 16 * mid / float(measured_time("all_gather", 16, mid, m))
    assert bw == pytest.approx(np.sqrt(t.bus_bandwidth[6] * t.bus_bandwidth[7]), rel=1e-9)
    p = float(np.sqrt(16 * 32))
    bw = (p - 1) / p * t.nbytes[8] / float(measured_time("all_gather", p, t.nbytes[8], m))
    assert bw == pytest.approx(np.sqrt(ag[16].bus_bandwidth[8] * ag[32].bus_bandwidth[8]), rel=1e-9)
    # an all-reduce without a table is a reduce-scatter and an all-gather; below the smallest group: α-β
    ar = measured_time("all_reduce", 64, 1e8, m)
    assert ar == pytest.approx(measured_time("reduce_scatter", 64, 1e8, m) + measured_time("all_gather", 64, 1e8, m))
    assert np.isnan(measured_time("all_gather", 4, 1e8, m)).all()
    a, b = 10e-6, 50e9
    assert collective_time("all_gather", 4, 1e8, a, b, m) == pytest.approx(ring_time("all_gather", 4, 1e8, a, b))
    # the larger of the two: the measured collapse wins, the α-β time where it is slower; calls split the bytes
    assert collective_time("all_gather", 256, 67.109e6, a, b, m) == pytest.approx(t256)
    assert collective_time("all_gather", 16, 67.109e6, a, 1e9, m) == pytest.approx(
        ring_time("all_gather", 16, 67.109e6, a, 1e9))
    assert collective_time("all_gather", 256, 2 * 67.109e6, a, b, m, calls=2) == pytest.approx(2 * t256)
    # perlmutter holds all-gathers only: its reduce-scatter and all-reduce stay α-β
    pm_ = pm.load_machine("perlmutter")
    assert np.isnan(measured_time("reduce_scatter", 64, 1e8, pm_)).all()
    assert not np.isnan(measured_time("all_gather", 64, 1e8, pm_)).any()


def test_a_bad_collective_table_is_named(tmp_path):
    good = (MACHINE_DIR / "frontier.toml").read_text()
    bad = tmp_path / "m.toml"
    bad.write_text(good.replace('collective = "all_gather"', 'collective = "all_to_all"', 1))
    with pytest.raises(pm.MachineFileError, match=r"m\.toml: collective_table 0: collective must be one of"):
        pm.load_machine(bad)
    bad.write_text(good.replace("bytes = [1.049e+06, 2.097e+06", "bytes = [2.097e+06, 1.049e+06", 1))
    with pytest.raises(pm.MachineFileError, match="bytes must be strictly ascending"):
        pm.load_machine(bad)


def test_the_tables_price_a_grid_slower_where_the_network_collapsed():
    # gpt-20b on 256 Frontier GCDs, pure data parallelism: the gradient all-reduce over 256 GCDs is a reduce-scatter
    # and an all-gather of the measured tables, far slower than the α-β ring
    m = pm.load_machine("frontier")
    prob = pm.Problem(pm.get_model("gpt-5b"), 256, 256, options=pm.Options(zero=1))
    with_t = pm.price_grid(prob, m, (1, 1, 1, 256))
    without = pm.price_grid(prob, replace(m, collective_tables=()), (1, 1, 1, 256))
    assert with_t.exposed_s["d"] > without.exposed_s["d"] and with_t.compute_s == without.compute_s


def test_pipeline_time_is_bubble_plus_stage_by_hand():
    spec = pm.get_model("gpt-5b")            # 24 layers
    prob = pm.Problem(spec, 64, 32)
    m = pm.load_machine("perlmutter")
    c = pl.TPPPDP(tp=4, pp=4, dp=2, mbs=2)
    row = pl.price(prob, m, [c])[0]
    assert row.feasible and row.microbatches == 16
    stage = pm.Problem(replace(spec, layers=6), 64, 32, options=pm.Options(microbatches=16, zero1_over_d=True))
    ev = pm.evaluate(stage, m, Grids.of([(1, 4, 1, 2)]), inflight=4.0, memory_layout="megatron")
    t_mb = (ev.compute[0] - ev.extra["optimizer"][0] + sum(ev.exposed[d][0] for d in "xyz")) / 16
    assert row.bubble_s == pytest.approx(3 * t_mb)                          # (p-1) · t_mb: (p-1)/(m+p-1) of 19 slots
    assert row.compute_s == pytest.approx(ev.compute[0])
    send = 2 * 2048 * spec.hidden * 2 / 4                                     # [mbs·S, h/t] bf16
    a, b, _ = ring_alpha_beta(np.array([2]), np.array([8]), m)
    assert row.p2p_s == pytest.approx(19 * 2 * (send / b[0] + a[0]))
    assert row.time_s == pytest.approx(row.compute_s + sum(row.exposed_s.values()) + row.bubble_s + row.p2p_s)
    # interleaving shrinks the bubble by VPP and sends VPP times as often
    r2 = pl.price(prob, m, [replace(c, vpp=2)])[0]
    assert r2.bubble_s == pytest.approx(row.bubble_s / 2)
    assert r2.p2p_s == pytest.approx(row.p2p_s * (16 + 1.5) / 19 * 2)


def test_pp1_is_the_4d_model_of_the_same_grid():
    prob = pm.Problem(pm.get_model("gpt-mini"), 16, 8)
    m = pm.load_machine("frontier")
    row = pl.price(prob, m, [pl.TPPPDP(2, 1, 4, mbs=2)])[0]
    ev = pm.evaluate(pm.Problem(prob.model, 16, 8, options=pm.Options(microbatches=2, zero1_over_d=True)), m,
                     Grids.of([(1, 2, 1, 4)]), memory_layout="megatron")     # Megatron's optimizer step too
    assert row.time_s == pytest.approx(float(ev.time[0])) and row.bubble_s == 0 and row.p2p_s == 0


def test_pipeline_memory_sequence_parallel_and_checks():
    prob = pm.Problem(pm.get_model("gpt-5b"), 64, 32, options=pm.Options(recompute=False))
    m = pm.load_machine("perlmutter")
    a, b, c = pl.price(prob, m, [pl.TPPPDP(4, 4, 2), pl.TPPPDP(4, 4, 2, sp=True), pl.TPPPDP(4, 2, 4)])
    assert b.memory_parts["activations"] < a.memory_parts["activations"]
    # SP splits the element-wise stream kernels over TP (32 micro-batches, 3 bubble slots); its collectives cost TP's
    assert a.time_s - b.time_s == pytest.approx((a.elementwise_s - b.elementwise_s) * (1 + 3 / 32))
    assert b.time_s < a.time_s
    bare = replace(m, hbm_bandwidth=0.0)
    a0, b0 = pl.price(prob, bare, [pl.TPPPDP(4, 4, 2), pl.TPPPDP(4, 4, 2, sp=True)])
    assert a0.time_s == b0.time_s
    assert a.memory_parts["static"] < c.memory_parts["static"]               # fewer layers per stage
    for bad, msg in ((pl.TPPPDP(4, 4, 4), "is not the 32 GPUs"), (pl.TPPPDP(1, 32, 1), "more than the 24 layers"),
                     (pl.TPPPDP(1, 4, 8, mbs=8, vpp=2), "micro-batches 1 divisible by PP 4"),
                     (pl.TPPPDP(1, 4, 8, sp=True), "needs TP > 1")):
        with pytest.raises(pm.PerfModelError, match=msg):
            pl.price(prob, m, [bad])


def test_rank_puts_4d_and_tp_pp_dp_in_one_table():
    rk = pm.rank(pm.Problem(pm.get_model("gpt-5b"), 64, 32), pm.load_machine("perlmutter"))
    both = rk.combined
    assert {r.layout for r in both} == {"4D", "TPxPPxDP"}
    assert all(both[i].time_s <= both[i + 1].time_s for i in range(len(both) - 1))
    assert len({r.grid_str for r in both}) == len(both)
    ranks = [r.rank for r in rk.megatron if r.feasible]
    assert ranks == list(range(1, len(ranks) + 1))


def test_cli_prices_one_named_configuration(capsys):
    args = ["rank", "--model", "gpt-5b", "--gpus", "32", "--machine", "perlmutter", "--batch", "64"]
    assert main([*args, "--grid", "2x2x2x4"]) == 0
    out = capsys.readouterr().out
    assert "4D 2x2x2x4" in out and "bytes/step/GPU" in out and "memory/GPU" in out
    assert main([*args, "--tp", "4", "--pp", "4"]) == 0
    out = capsys.readouterr().out
    assert "TP4xPP4xDP2" in out and "bubble" in out and "TFLOP/s/GPU" in out
    assert main([*args, "--tp", "4", "--pp", "4", "--dp", "4"]) == 2
    assert "is not --gpus 32" in capsys.readouterr().err
    assert main([*args, "--grid", "2x2x2"]) == 0                  # the one grid grammar: Gd = 32 / 8 inferred
    assert "4D 2x2x2x4" in capsys.readouterr().out
    assert main([*args, "--grid", "2x2xz"]) == 2
    assert "GXxGYxGZxGD" in capsys.readouterr().err
    assert main([*args, "--grid", "2x2x2x2"]) == 2
    assert "not --gpus 32" in capsys.readouterr().err


@pytest.mark.parametrize("extra,msg", [
    (["--grid", "2x2x2x4", "--csv", "OUT"], "--csv work(s) on the full ranking, not with --grid"),
    (["--tp", "4", "--pp", "4", "--json", "OUT"], "--json work(s) on the full ranking, not with --tp/--pp/--dp"),
    (["--grid", "2x2x2x4", "--explain", "1"], "--explain work(s) on the full ranking"),
    (["--vpp", "2"], "--vpp describe(s) one TP×PP×DP configuration: give --tp/--pp/--dp"),
    (["--sp", "--mbs", "2"], "--sp and --mbs describe(s) one TP×PP×DP configuration"),
    (["--show-infeasible", "-1"], "--show-infeasible -1: give the number of rejected grids to list (>= 0)"),
])
def test_cli_refuses_flags_it_would_ignore(extra, msg, tmp_path, capsys):
    """Review fix: these were silently skipped (no CSV written, the ranking printed without VPP 2), exit 0."""
    out = tmp_path / "out.csv"
    args = ["rank", "--model", "gpt-5b", "--gpus", "32", "--machine", "perlmutter", "--batch", "64"]
    assert main(args + [str(out) if a == "OUT" else a for a in extra]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--csv", "--json", "--emit-slurm"])
def test_cli_unwritable_output_is_one_line(flag, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["rank", *TINY, flag, str(blocker / "sub" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write") and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("flag", ["--seq", "--vocab", "--batch", "--gpus", "--microbatches", "--layers"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_cli_refuses_non_positive_sizes(flag, value, capsys):
    args = [a for a in TINY]
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    assert main(["rank", *args]) == 2
    assert f"{flag} must be a positive integer, got {value}" in capsys.readouterr().err


#: ratio predicted/published of the points the shipped machine files do not bring within ±15% (see docs/results.md):
#: kept here so a change that moves them is seen; a change that brings one within 15% moves it to WITHIN.
#: The Frontier study's points moved when priced without interleaving (Megatron-DeepSpeed's pipeline, issue 47):
#: 22B 1.17 -> 0.97 (now within), 175B 1.40 -> 1.21, 1T 1.66 -> 1.55.
KNOWN_MISSES = {"SC24 Frontier 320B": 1.48, "4D paper Perlmutter 80B": 0.79, "Frontier study 175B": 1.21,
                "Frontier study 1T": 1.55}


def test_check_published(capsys, monkeypatch, published_checks):
    from axgrid.perfmodel import published
    from axgrid.perfmodel.published import POINTS
    checks = list(published_checks)
    assert len(checks) == len(POINTS) == 15
    for c in checks:
        if c.point.name in KNOWN_MISSES:
            assert c.ratio == pytest.approx(KNOWN_MISSES[c.point.name], abs=0.02), c.point.name
        else:
            assert c.within, (c.point.name, c.ratio)
    monkeypatch.setattr(published, "check_all", lambda: checks)     # the CLI prints these (priced once)
    assert main(["check-published"]) == 0
    out = capsys.readouterr().out
    assert all(p.name in out for p in POINTS) and "batch = 1 sequence per GPU" in out
    assert "TP8xPP8xDP1v3+SP/selective (64 mb)" in out and "TP8xPP64xDP1/full (512 mb)" in out
    assert "memory model:" not in out          # every Korthikanti configuration fits (Megatron layout)


@settings(max_examples=6, deadline=None)
@given(machine=st.sampled_from(["perlmutter", "frontier", "alps"]), bw=st.floats(1.0, 50.0),
       fl=st.floats(1.0, 50.0), mem=st.floats(1e-3, 1.0))
def test_tp_pp_dp_monotone_and_memory_checked(machine, bw, fl, mem):
    prob = pm.Problem(pm.get_model("gpt-5b"), 64, 32)
    m = pm.load_machine(machine)
    cs = pl.enumerate_configs(prob, m)
    base = pl.price(prob, m, cs)
    for faster in (m.scaled(bandwidth=bw), m.scaled(flops=fl)):
        for a, b in zip(base, pl.price(prob, faster, cs)):
            assert a.feasible == b.feasible and (not a.feasible or b.time_s <= a.time_s * (1 + 1e-12))
    small = m.scaled(memory=mem)
    for r in pl.price(prob, small, cs):
        over = r.memory_bytes > small.memory_bytes * prob.options.memory_usable
        assert not (r.feasible and over) and (r.feasible or "memory" in r.reason)


def test_dgx_h100_bf16_gemms_run_at_openxlas_measured_rates():
    """dgx-h100's bf16 GEMMs: the measured H100 table (OpenXLA's sm_90 matmul table, subset in dgx-h100.gemm.json),
    the nearest measured shape in log space; the table's values are read back unchanged."""
    import json

    from axgrid.perfmodel.machines import MACHINE_DIR
    m = pm.load_machine("dgx-h100")
    rows = json.loads((MACHINE_DIR / "dgx-h100.gemm.json").read_text())
    assert len(rows) == 27 and {r["dtype"] for r in rows} == {"bf16"}
    for r in rows:
        assert float(gemm_rate(r["m"], r["n"], r["k"], m, "bf16")) == r["flops_per_s"]
    at = {(r["m"], r["n"], r["k"]): r["flops_per_s"] for r in rows}
    assert float(gemm_rate(16384, 14336, 4096, m, "bf16")) == at[4096, 4096, 4096]       # beyond the table: its corner
    assert float(gemm_rate(300, 900, 5000, m, "bf16")) == at[256, 1024, 4096]             # nearest in log space
    assert max(at.values()) < 0.8 * m.peak_flops_bf16 and min(at.values()) < 0.01 * m.peak_flops_bf16


def test_a_measured_gemm_table_is_given_once(tmp_path):
    import shutil

    from axgrid.perfmodel.machines import MACHINE_DIR
    for f in ("dgx-h100.toml", "dgx-h100.gemm.json"):
        shutil.copy(MACHINE_DIR / f, tmp_path / f)
    toml = tmp_path / "dgx-h100.toml"
    assert len(pm.load_machine(toml).gemm_table) == 27
    toml.write_text(toml.read_text() + '\n[fitted]\ngemm_table = "dgx-h100.gemm.json"\n')
    with pytest.raises(pm.MachineFileError, match="gemm_table at the top level .* or under \\[fitted\\], not both"):
        pm.load_machine(toml)
