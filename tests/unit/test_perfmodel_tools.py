"""perfmodel CLI, calibration fitting (synthetic samples) and validation metrics."""
import json
import math

import numpy as np
import pytest

from axgrid import perfmodel as pm
from axgrid.perfmodel import calibrate as cal
from axgrid.perfmodel import validate as val
from axgrid.perfmodel.cli import main

TINY = ["--model", "gpt-tiny", "--gpus", "8", "--machine", "perlmutter", "--batch", "16"]


def test_cli_rank_outputs(tmp_path, capsys):
    assert main(["rank", *TINY, "--top", "12", "--csv", str(tmp_path / "r.csv"), "--json", str(tmp_path / "r.json"),
                 "--emit-slurm", str(tmp_path / "slurm")]) == 0
    out = capsys.readouterr().out
    assert "TP1xPP" in out and "best TP×PP×DP" in out          # 4D and TP×PP×DP ranked in one table
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["rows"][0]["rank"] == 1 and doc["machine"] == "perlmutter"
    assert (tmp_path / "r.csv").read_text().startswith("rank,grid,")
    scripts = sorted((tmp_path / "slurm").glob("*.sbatch"))       # one per 4D row of the 12 printed
    table = [line.split("│") for line in out.splitlines() if line.startswith("│")]
    printed = [(int(c[1]), c[2].strip()) for c in table if c[3].strip() == "yes"]   # (row, grid) axgrid runs
    assert [s.name for s in scripts] == [f"row{n:02d}_{g}.sbatch" for n, g in printed] and printed
    text = scripts[0].read_text()
    assert f'GRID="${{GRID:-{printed[0][1]}}}"' in text and 'MODEL="${MODEL:-gpt-tiny}"' in text
    assert "#SBATCH -N 2" in text and "#SBATCH --gpus-per-node=4" in text and "#SBATCH --signal=USR1@" in text
    assert "#SBATCH -A" not in text and "SBATCH_ACCOUNT=<account> SBATCH_CONSTRAINT=<constraint> sbatch" in text
    assert text.rstrip().endswith('source "$REPO/experiments/slurm/common.sh"')


def test_cli_explain_and_machines(capsys):
    assert main(["rank", *TINY, "--explain", "1"]) == 0
    out = capsys.readouterr().out
    assert "rank 1" in out and "bytes/step/GPU" in out and "memory/GPU" in out
    assert main(["machines"]) == 0
    assert "dgx-h100" in capsys.readouterr().out


def test_cli_bad_inputs(capsys):
    assert main(["rank", "--model", "nope", "--gpus", "8", "--machine", "perlmutter", "--batch", "8"]) == 2
    err = capsys.readouterr().err
    assert "choose a GPT size" in err and "llama-3.1-8b" in err and "--config" in err
    assert main(["rank", "--model", "gpt-tiny", "--gpus", "8", "--machine", "nowhere", "--batch", "8"]) == 2
    assert "known machines" in capsys.readouterr().err


def _synthetic_comm(alpha_i, beta_i, alpha_e, beta_e, gpn=4):
    out = []
    for p, s in [(2, 1), (4, 1), (2, 2), (2, 4), (4, 4), (8, 1), (4, 2)]:
        cls = cal.placement_class(p, s, gpn)
        a, b = (alpha_i, beta_i) if cls == "intra" else (alpha_e, beta_e)
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            for nbytes in (2**10, 2**16, 2**22):
                f = 2.0 if op == "all_reduce" else 1.0
                t = f * (p - 1) / p * nbytes / b + f * (p - 1) * a
                out.append(cal.CommSample(op, p, s, nbytes, t))
    return out


def test_fit_alpha_beta_recovers_synthetic():
    samples = _synthetic_comm(20e-6, 2e9, 80e-6, 0.5e9)
    fit = cal.fit_placements(samples, 4)
    assert fit["intra"].alpha == pytest.approx(20e-6, rel=1e-3)
    assert fit["intra"].beta == pytest.approx(2e9, rel=1e-3)
    assert fit["inter"].alpha == pytest.approx(80e-6, rel=1e-3)
    assert fit["inter"].beta == pytest.approx(0.5e9, rel=1e-3)
    # noisy samples still land close
    rng = np.random.default_rng(0)
    noisy = [cal.CommSample(s.op, s.group_size, s.stride, s.bytes, s.seconds * rng.uniform(0.95, 1.05))
             for s in samples]
    f2 = cal.fit_placements(noisy, 4)
    assert f2["intra"].beta == pytest.approx(2e9, rel=0.1)


def test_fit_gemm_curve_recovers_synthetic():
    peak = 1e11
    samples = []
    for m, n, k in [(32, 512, 512), (64, 64, 64), (128, 256, 512), (256, 256, 256), (1024, 512, 2048), (16, 16, 16)]:
        eff = 0.6 * min(m, n, k) / (min(m, n, k) + 100.0)
        samples.append(cal.GemmSample(m, n, k, 2.0 * m * n * k / (eff * peak)))
    e_max, half = cal.fit_gemm_curve(samples, peak)
    assert e_max == pytest.approx(0.6, rel=1e-3) and half == pytest.approx(100.0, rel=1e-3)


def test_calibrated_machine_roundtrips_and_ranks(tmp_path, capsys):
    comm = _synthetic_comm(20e-6, 2e9, 80e-6, 0.5e9, gpn=8)
    gemm = [cal.GemmSample(s, s, s, 2.0 * s**3 / (1e11 * 0.5 * s / (s + 64.0))) for s in (32, 64, 128, 256, 512)]
    path = tmp_path / "local.toml"
    cal.save_samples(tmp_path / "s.json", comm, gemm)
    assert main(["calibrate", "--samples", str(tmp_path / "s.json"), "--ranks", "8", "--peak", "1e11",
                 "--out", str(path)]) == 0
    m = pm.load_machine(path)
    assert m.placement["intra"].beta == pytest.approx(2e9, rel=1e-3)
    assert m.gemm_eff_max == pytest.approx(0.5, rel=1e-3) and len(m.gemm_table) == 5
    rk = pm.rank(pm.Problem(pm.get_model("gpt-tiny"), 8, 8, "fp32"), m)
    assert rk.best.time_s > 0
    # the GEMM table is used: time of a measured shape is exactly 2mnk / measured rate
    from axgrid.perfmodel.compute import gemm_time
    assert float(gemm_time(128, 128, 128, m, "fp32")) == pytest.approx(gemm[2].seconds, rel=1e-9)


def test_gemm_table_json(tmp_path):
    f = tmp_path / "eff.json"
    f.write_text(json.dumps([{"m": 64, "n": 64, "k": 64, "dtype": "bf16", "flops_per_s": 1e12},
                             {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "flops_per_s": 2e14}]))
    from axgrid.perfmodel.machines import load_gemm_table
    tab = load_gemm_table(f)
    m = pm.load_machine("perlmutter")
    from dataclasses import replace
    from axgrid.perfmodel.compute import gemm_rate
    r = gemm_rate(np.array([60, 5000]), np.array([70, 4000]), np.array([64, 3000]), replace(m, gemm_table=tab), "bf16")
    assert r.tolist() == [1e12, 2e14]
    f.write_text(json.dumps([{"m": 1, "n": 1, "k": 1, "dtype": "bf16"}]))
    with pytest.raises(pm.MachineFileError, match="flops_per_s"):
        load_gemm_table(f)


def test_calibrate_and_validate_read_measurements_from_a_file(capsys):
    assert main(["calibrate", "--out", "/tmp/never.toml"]) == 2
    assert "python -m axgrid.measure collectives" in capsys.readouterr().err
    assert main(["validate", *TINY]) == 2
    assert "python -m axgrid.measure steps" in capsys.readouterr().err


def test_metrics_on_synthetic_data():
    pred = [1.0, 2.0, 3.0, 4.0]
    r = val.metrics(pred, [1.1 * p for p in pred])
    assert r["spearman"] == pytest.approx(1) and r["kendall"] == pytest.approx(1)
    assert r["top1_regret"] == 1.0 and r["mape"] == pytest.approx(100 * (1 - 1 / 1.1))
    r = val.metrics([1.0, 2.0, 3.0], [3.0, 2.0, 1.0])
    assert r["spearman"] == pytest.approx(-1) and r["kendall"] == pytest.approx(-1) and r["top1_regret"] == 3.0
    with pytest.raises(pm.PerfModelError):
        val.metrics([1.0], [1.0])


def test_validate_from_measured_csv(tmp_path, capsys):
    rk = pm.rank(pm.Problem(pm.get_model("gpt-tiny"), 16, 8), pm.load_machine("perlmutter"))
    rows = rk.feasible[:5]
    f = tmp_path / "m.csv"
    f.write_text("grid,seconds\n" + "".join(f"{r.grid_str},{r.time_s * (1 + 0.1 * i)}\n" for i, r in enumerate(rows)))
    assert main(["validate", *TINY, "--measured", str(f), "--out-dir", str(tmp_path / "v")]) == 0
    out = capsys.readouterr().out
    assert "Spearman rho=1.000" in out and "top-1 regret=1.000" in out
    assert (tmp_path / "v" / "validation.csv").exists()
    sel = val.select_configs(rk, 2, 3, seed=1)
    assert sel[:2] == rk.feasible[:2] and len(sel) == min(5, len(rk.feasible))
    assert not math.isnan(val.metrics([r.time_s for r in rows], [r.time_s for r in rows])["spearman"])


def test_perfmodel_imports_no_torch_or_runtime():
    import subprocess
    import sys
    # only the package shell `axgrid`, the perf model itself and the torch-free spec (with the grid shape it
    # re-exports from axgrid.spec.layout) may load: no torch, no runtime
    code = ("import sys, axgrid.perfmodel, axgrid.perfmodel.cli, axgrid.perfmodel.calibrate, "
            "axgrid.perfmodel.validate, axgrid.perfmodel.explain, axgrid.perfmodel.slurm; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'axgrid', 'kernels', 'perfmodel') "
            "and m not in ('axgrid', 'axgrid.spec.layout') and not m.startswith(('axgrid.perfmodel', 'axgrid.spec'))]; "
            "assert 'axgrid.perfmodel.cli' in sys.modules and not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rank_layouts_units_and_names(capsys):
    """--layouts 4d shows only what axgrid runs (numbered as --explain numbers them); names are never cut; a machine
    of CPU ranks gets units its numbers show in; every row within the band is said plainly."""
    big = ["rank", "--model", "gpt-80b", "--gpus", "1024", "--machine", "perlmutter", "--batch", "1024"]
    assert main([*big, "--top", "6"]) == 0
    out = capsys.readouterr().out
    assert "TP4xPP16xDP16+SP" in out and "…" not in out                      # 150 columns: nothing truncated
    assert "│ 2 │  TP4xPP4xDP64+SP │     no │" in out and "the model cannot order them" in out
    assert "│ 1 │   4x2x2x64 zero2 │    yes │" in out                        # the zero mode named with the grid
    assert main([*big, "--top", "3", "--layouts", "4d"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("│") for line in out.splitlines() if line.startswith("│")]
    assert [c[3].strip() for c in rows] == ["yes"] * 3 and "TP" not in "".join(c[2] for c in rows)
    assert main([*big, "--layouts", "4d", "--explain", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"4D {rows[0][2].split()[0]} ")      # the grid (the zero mode after)
    assert main(["rank", "--model", "gpt-tiny", "--gpus", "4", "--machine", "local-4", "--batch", "8", "--dtype",
                 "fp32", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "gpt-tiny (137.0K params)" in out and "GFLOP/s/rank" in out and "MiB/rank" in out and "ms/batch" in out
    assert "0.0B params" not in out and "TFLOP/s" not in out


def test_no_feasible_grid_says_the_numbers_and_what_would_fit(capsys):
    assert main(["rank", "--model", "gpt-80b", "--gpus", "16", "--machine", "perlmutter", "--batch", "16"]) == 2
    err = capsys.readouterr().err
    assert "35× memory 73.6–356.5 GiB > 36.0 GiB usable" in err and " N " not in err
    assert "the nearest larger GPU count that fits is 64 (" in err        # none of 18 … 32 fits: a doubling
    # hidden 6, one head, vocabulary 7: Gx*Gy <= 2, so 8 GPUs need Gz*Gd >= 4 sequences
    assert main(["rank", "--layers", "1", "--hidden", "6", "--heads", "1", "--vocab", "7", "--seq", "8", "--gpus", "8",
                 "--machine", "perlmutter", "--batch", "3"]) == 2
    err = capsys.readouterr().err
    assert "16× batch 3 not divisible by Gd*Gz=2–8 (z splits whole sequences)" in err
    assert "the nearest larger GPU count that fits is 9 (3x1x1x3" in err       # batch 3 over Gd = 3, not a doubling
    assert "the nearest smaller one is 6 (2x1x1x3" in err
    assert "on 8 GPUs the smallest larger batch that fits is 4 (2x1x" in err


def test_a_count_that_does_not_factor_names_the_nearest_that_do():
    # 250 = 2·5³: gpt-20b's hidden 7168 = 2¹⁰·7, heads 56 and batch 512 = 2⁹ split over no grid of it; 256 and 224 do
    from axgrid.perfmodel.rank import nearby_counts, what_would_fit
    assert nearby_counts(250, most=4) == ([252, 256, 270, 280], [245, 243, 240, 225])
    prob = pm.Problem(pm.get_model("gpt-20b"), 512, 250)
    text = what_would_fit(prob, pm.load_machine("frontier"))
    assert "the nearest larger GPU count that fits is 256 (" in text
    assert "the nearest smaller one is 224 (" in text
