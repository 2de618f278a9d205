"""perfmodel's error band (perfmodel/band.py): time_low ≤ time ≤ time_high on every row, the within-error mark,
the out-of-range flag, the stored residuals against check-published, the verdict line's wording, the
Korthikanti et al. 2022 points at their published configurations, and selective recompute."""
import json
import math
import shutil
from dataclasses import replace

import pytest

from axgrid import perfmodel as pm
from axgrid.perfmodel import pipeline as pl
from axgrid.perfmodel.band import Band, Residual, band_for, read_residuals, residuals_path, with_band
from axgrid.perfmodel.machines import MACHINE_DIR
from axgrid.perfmodel.rank import Ranking, verdict

PROB = pm.Problem(pm.get_model("gpt-5b"), 64, 32)


@pytest.fixture(scope="module")
def ranking():
    return pm.rank(PROB, pm.load_machine("perlmutter"))


@pytest.fixture(scope="module")
def checks(published_checks):
    return list(published_checks)


def _rebanded(rk: Ranking, errors: list[float]) -> Ranking:
    """``rk`` with a band made of residuals with these ln(measured/predicted) errors."""
    band = Band(rk.machine.name, tuple(Residual(f"p{i}", "4D", rk.problem.gpus, "c", 1.0, math.exp(e))
                                       for i, e in enumerate(errors)), True, "test")
    best_high = min(r.time_s for r in rk.rows + rk.megatron if r.feasible) * band.hi
    return Ranking(rk.problem, rk.machine, with_band(rk.rows, band, best_high, rk.problem.gpus),
                   with_band(rk.megatron, band, best_high, rk.problem.gpus), band)


def test_json_rows_carry_ordered_bands(ranking, tmp_path):
    ranking.to_json(tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert "perlmutter" in doc["band"]
    rows = doc["rows"] + doc["tp_pp_dp"]
    feasible = [r for r in rows if r["feasible"]]
    assert {r["layout"] for r in feasible} == {"4D", "TPxPPxDP"}
    for r in feasible:
        assert r["time_low"] <= r["time_s"] <= r["time_high"], r["grid"]
        assert r["time_low"] < r["time_high"]                          # Perlmutter's residuals are not all zero
    for r in rows:
        if not r["feasible"]:
            assert r["time_s"] is None and r["time_low"] is None and r["time_high"] is None
    band = band_for(pm.load_machine("perlmutter"))
    r0 = feasible[0]
    assert r0["time_low"] == pytest.approx(r0["time_s"] * band.lo) and r0["time_high"] == pytest.approx(
        r0["time_s"] * band.hi)


def test_within_error_is_band_overlap_with_the_best(ranking):
    best = ranking.combined[0]
    marked = {r.grid_str for r in ranking.combined if r.within_error}
    assert best.grid_str in marked
    for r in ranking.combined:
        assert r.within_error == (r.time_low <= best.time_high)
    wide, exact = _rebanded(ranking, [-0.5, 0.5]), _rebanded(ranking, [0.0])
    assert all(r.within_error for r in wide.combined if r.time_s <= best.time_s * math.exp(1.0))
    assert not all(r.within_error for r in wide.combined)            # far rows stay unmarked
    assert [r.grid_str for r in exact.combined if r.within_error] == [
        r.grid_str for r in exact.combined if r.time_s == best.time_s]


def test_out_of_range_flags_gpus_and_layout_family(ranking):
    band = band_for(pm.load_machine("perlmutter"))      # validated: 4D points up to 4,096 GPUs
    assert band.own and band.gpus_max == 4096 and band.layouts == {"4D"}
    assert all(r.out_of_range == "" for r in ranking.feasible)
    assert all(r.out_of_range == "TPxPPxDP never validated on perlmutter" for r in ranking.megatron)
    assert band.out_of_range(8192, "4D") == "8192 GPUs > 4096, the largest validated on perlmutter"
    a100 = band_for(pm.load_machine("dgx-a100"))        # its suites: vTrain, Korthikanti, llama-public's A100 rows
    assert a100.layouts == {"TPxPPxDP", "4D"} and a100.gpus_max == 512 and a100.source.endswith("suite-residuals.json")
    assert "1024 GPUs > 512" in a100.out_of_range(1024, "4D")
    never = band_for(pm.load_machine("juwels-booster"))  # no residuals: the published points pooled, flagged
    assert not never.own and len(never.residuals) == 15 and not any(r.problem for r in never.residuals)
    assert never.out_of_range(8, "4D").startswith("never validated on juwels-booster")


def test_stored_residuals_are_check_published(checks):
    from axgrid.perfmodel.published import residuals_of
    live = residuals_of(checks)
    assert set(live) == {"perlmutter", "frontier", "alps", "dgx-a100"}
    local = band_for(pm.load_machine("local-4"))            # validate's points on this host (docs/results.md)
    assert local.own and local.layouts == {"4D"} and all(r.problem for r in local.residuals)
    for name, points in live.items():
        stored = read_residuals(residuals_path(pm.load_machine(name)))
        assert [(r.name, r.layout, r.gpus, r.config) for r in stored] == [
            (r.name, r.layout, r.gpus, r.config) for r in points], f"refresh with check-published --write-residuals"
        for s, p in zip(stored, points):
            assert s.error == pytest.approx(p.error, abs=1e-9), (name, s.name)


@pytest.mark.parametrize("errors,word", [([0.0, 0.01], "larger than"), ([-0.3, 0.3], "within")])
def test_verdict_says_whether_the_difference_exceeds_the_band(ranking, errors, word):
    rk = _rebanded(ranking, errors)
    line = verdict(rk)
    best4, bestm = rk.feasible[0], next(r for r in rk.megatron if r.feasible)
    assert best4.time_s != bestm.time_s and f"a difference {word} the model's error band" in line
    assert ("cannot tell them apart" in line) == (word == "within")


KORTHIKANTI = {  # Table 5: (layers, hidden, heads, TP, PP, VPP, GPUs, batch, micro-batch)
    "22B": (48, 6144, 64, 8, 1, 1, 8, 4, 4), "175B": (96, 12288, 96, 8, 8, 3, 64, 64, 1),
    "530B": (105, 20480, 128, 8, 35, 3, 280, 280, 1), "1T": (128, 25600, 160, 8, 64, 1, 512, 512, 1)}
#: the model is optimistic at every Korthikanti configuration, by at most this much (docs/results.md, check-published)
KORTHIKANTI_MAX_RATIO = 1.30


def test_korthikanti_points_priced_at_their_published_configurations(checks):
    ks = [c for c in checks if c.point.name.startswith("Korthikanti")]
    assert len(ks) == 8
    for c in ks:
        p, r = c.point, c.predicted
        L, h, a, tp, pp, v, g, batch, mbs = KORTHIKANTI[p.name.split()[1]]
        spec = p.spec
        assert (spec.layers, spec.hidden, spec.heads, spec.seq, spec.vocab) == (L, h, a, 2048, 51200)
        assert (p.machine, p.dtype, p.gpus, p.batch, p.mbs, p.vpp) == ("dgx-a100", "fp16", g, batch, mbs, v)
        selective = p.name.endswith("sel+SP")
        assert (p.recompute, p.sp) == (("selective", True) if selective else ("full", False))
        assert (r.grid, r.pp, r.vpp, r.sp, r.recompute, r.microbatches) == (
            (1, tp, 1, 1), pp, v, selective, p.recompute, batch // mbs)
        assert 1.0 < c.ratio <= KORTHIKANTI_MAX_RATIO, (p.name, c.ratio)


def test_selective_recompute_is_one_more_forward_attention():
    prob = pm.Problem(pm.get_model("gpt-5b"), 64, 32)
    m = pm.load_machine("dgx-a100")
    full, sel, none = pl.price(prob, m, [pl.TPPPDP(8, 2, 2, recompute=r) for r in ("full", "selective", "none")])
    assert none.time_s < sel.time_s < full.time_s
    assert none.memory_parts["activations"] == sel.memory_parts["activations"] > full.memory_parts["activations"]
    stage = pm.Problem(replace(prob.model, layers=12), 64, 32, options=pm.Options(recompute=False, microbatches=32,
                                                                                 zero1_over_d=True))
    ev = pm.evaluate(stage, m, pm.Grids.of([(1, 8, 1, 2)]))
    assert sel.compute_s - none.compute_s == pytest.approx(float(ev.extra["attention"][0]) / 3)
    with pytest.raises(pm.PerfModelError, match="recompute must be one of"):
        pl.price(prob, m, [pl.TPPPDP(8, 2, 2, recompute="some")])


def test_validate_writes_the_local_band(tmp_path):
    from axgrid.perfmodel.validate import write_validated_residuals
    toml = tmp_path / "mine.toml"
    shutil.copy(MACHINE_DIR / "perlmutter.toml", toml)        # a machine file of one's own, no residuals yet
    m = pm.load_machine(toml)
    assert not band_for(m).own
    prob = pm.Problem(pm.get_model("gpt-tiny"), 8, 4)
    rk = pm.rank(prob, m)
    measured = {r.grid_str: r.time_s * f for r, f in zip(rk.feasible[:3], (1.5, 0.8, 1.1))}
    path = write_validated_residuals(rk, measured)
    assert path == tmp_path / "mine.residuals.json"
    band = band_for(m)
    assert band.own and band.lo == pytest.approx(0.8) and band.hi == pytest.approx(1.5)
    write_validated_residuals(rk, {k: v * 1.0 for k, v in list(measured.items())[:2]})   # same problem: replaced
    assert len(band_for(m).residuals) == 2
    rk2 = pm.rank(prob, m)
    assert rk2.band.own and all(r.time_low == pytest.approx(r.time_s * 0.8) for r in rk2.feasible)


def test_cli_prints_bands_marks_and_the_verdict(capsys):
    from axgrid.perfmodel.cli import main
    args = ["rank", "--model", "gpt-5b", "--gpus", "32", "--machine", "perlmutter", "--batch", "64"]
    assert main([*args, "--top", "40"]) == 0
    out = capsys.readouterr().out
    assert "band: model error band on perlmutter: ×0.79–×1.00" in out and "≈" in out
    assert "† outside the validated range: TPxPPxDP never validated on perlmutter" in out
    assert "the model's error band" in out.replace("\n", " ")
    assert main([*args, "--grid", "2x2x2x4"]) == 0
    assert "model error band" in capsys.readouterr().out
    assert main([*args, "--tp", "4", "--pp", "4", "--recompute-mode", "selective"]) == 0
    out = capsys.readouterr().out
    assert "TP4xPP4xDP2/selective" in out and "outside the validated range: TPxPPxDP never validated" in out
