"""perfmodel against public measurements (perfmodel/suites.py, ``validate-public``): the metrics against scipy and
by hand, the vTrain rows priced exactly as ``price_named`` prices each one, and today's figures pinned as a
regression guard (a change that worsens a suite's MAPE by more than a point fails)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from axgrid.perfmodel import load_machine, price_named
from axgrid.perfmodel.cli import main
from axgrid.perfmodel.suites import (price_published, price_vtrain, run_suites, suite_metrics, vtrain_csv,
                                     vtrain_problem, vtrain_rows)

#: the figures of the shipped model (docs/results.md, "perfmodel against public measurements"): MAPE in percent,
#: mean per-group Spearman ρ; a change may improve them, and then moves them here
PINNED = {"vtrain": {"mape": 6.9, "spearman": 0.94}, "korthikanti": {"mape": 7.8}, "published": {"mape": 13.7},
          "frontier-public": {"mape": 15.0},    # 7 rows, no groups (perfmodel.weak_scaling; issue 47: goal 15)
          "llama-public": {"mape": 9.4},        # 13 priced rows (perfmodel/llama_suite.py); the goal is 10
          "vtrain-multi": {"mape": 13.2}}       # the held-out test, priced once at 7faeb6b: a guard, never a target


@pytest.fixture(scope="module")
def suites(published_checks):
    """Every suite priced; the published ones from the session's checks (run_suites prices them with
    ``published.check_all``, the function the session fixture called)."""
    from axgrid.perfmodel import published
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(published, "check_all", lambda: list(published_checks))
        return {r.name: r for r in run_suites()}


def test_figures_do_not_get_worse(suites):
    for name, pin in PINNED.items():
        k = suites[name].metrics
        assert k["mape"] <= pin["mape"] + 1.0, (name, k["mape"])
        if "spearman" in pin:
            assert k["spearman"] >= pin["spearman"] - 0.02, (name, k["spearman"])
    v = suites["vtrain"].metrics
    assert v["n"] == 1440 and v["groups"] == 136 and suites["korthikanti"].metrics["n"] == 8
    assert suites["published"].metrics["n"] == 15 and suites["vtrain-multi"].metrics["n"] == 109
    assert suites["llama-public"].metrics["n"] == 13 and len(suites["llama-public"].notes) == 24
    assert suites["frontier-public"].metrics["n"] == 7 and suites["frontier-public"].metrics["groups"] == 0


#: the predicted weak-scaling efficiency of AxoNN's Frontier series against its 512-GCD point (docs/results.md,
#: experiments/perfmodel/frontier_weak_scaling.py), and the published one (perfmodel.weak_scaling)
WEAK_SCALING = {8192: 0.856, 16384: 0.850, 32768: 0.839}


def test_frontier_weak_scaling_against_the_published_series(suites):
    """The frontier-public suite's AxoNN rows give the predicted TFLOP/s per GCD (published × measured/predicted
    time): its efficiency against the 512-GCD row is pinned, within 10 points of the published one at 8,192 and
    16,384 GCDs; at 32,768 the published falloff (53.5%) is not reproduced (issue 47, not reached)."""
    from axgrid.perfmodel.weak_scaling import BASE_TFLOPS, PUBLISHED_EFFICIENCY
    res = suites["frontier-public"]
    gcds = [512, 8192, 16384, 32768]
    assert [g for g, layout in zip(res.gpus, res.layouts) if layout == "4D"] == gcds
    tf = {g: BASE_TFLOPS * PUBLISHED_EFFICIENCY[g] * m / p for g, p, m in zip(res.gpus, res.predicted, res.measured)
          if g in gcds}
    assert 70 < tf[512] < 80                      # 74.3 predicted, 78.7 published
    for g, pin in WEAK_SCALING.items():
        eff = tf[g] / tf[512]
        assert eff == pytest.approx(pin, abs=0.005), g
        assert (abs(eff - PUBLISHED_EFFICIENCY[g]) <= 0.10) == (g < 32768), g


def test_multi_node_rows_are_read_without_their_parameter_column():
    rows = vtrain_rows(vtrain_csv("multi"))
    assert len(rows) == 109 and {r["gpus"] for r in rows} <= {64, 128, 256, 512}
    assert all(r["tp"] * r["pp"] * r["dp"] == r["gpus"] and r["seq"] == 2048 for r in rows)
    first = rows[0]      # 3.6B, 64 GPUs, batch 512, mbs 8, h 3072, 32 heads, 30 layers, TP1 DP64 PP1: 3566.5 ms
    assert (first["gpus"], first["batch"], first["mbs"], first["hidden"], first["layers"], first["dp"], first["ms"]) == (
        64, 512, 8, 3072, 30, 64, 3566.5)


def test_vtrain_rows_priced_as_price_named(suites):
    rows = vtrain_rows()
    machine = load_machine("dgx-a100").scaled(memory=1e3)
    res = suites["vtrain"]
    for i in (0, 1, 2, 3, 777, 1439):
        r = rows[i]
        want = price_named(vtrain_problem(r), machine, r["tp"], r["pp"], r["dp"], mbs=r["mbs"], recompute="full")
        assert res.predicted[i] == pytest.approx(want.time_s, rel=1e-12), res.labels[i]
        assert res.measured[i] == pytest.approx(r["ms"] / 1e3)


def test_published_suite_is_check_published(suites, published_checks):
    checks = list(published_checks)
    k = price_published(True, checks)
    assert k.labels == [c.point.name for c in checks if c.point.name.startswith("Korthikanti")]
    assert np.allclose(k.measured, [c.point.seconds for c in checks if c.point.seconds is not None])


def test_metrics_by_hand():
    # group a: predicted order b < a < c, measured a < b < c; group b: all predicted equal (a coin toss)
    pred = [2.0, 1.0, 3.0, 1.0, 1.0, 1.0, 5.0]
    meas = [1.0, 2.0, 4.0, 1.0, 2.0, 3.0, 4.0]
    k = suite_metrics(pred, meas, [("a",)] * 3 + [("b",)] * 3 + [("c",)])
    err = np.abs(np.array(pred) - meas) / meas
    assert k["mape"] == pytest.approx(100 * err.mean()) and k["within_n"] == int((err <= 0.15).sum())
    assert k["groups"] == 2 and k["groups_tied"] == 1
    assert k["spearman"] == pytest.approx(0.5)                  # group a only
    assert k["regret_mean"] == pytest.approx((2.0 + 2.0) / 2)   # a: picks 2.0 of best 1.0; b: mean 2.0 of best 1.0
    assert k["regret_worst"] == pytest.approx(2.0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 10.0), st.floats(0.1, 10.0)), min_size=3, max_size=12, unique=True))
def test_one_group_rho_is_scipys_and_regret_at_least_one(pairs):
    pred, meas = (np.array(v) for v in zip(*pairs))
    k = suite_metrics(pred, meas, [("g",)] * len(pred))
    assert k["regret_worst"] >= 1.0 and k["regret_mean"] == k["regret_worst"]
    if np.ptp(pred) > 0:
        assert k["spearman"] == pytest.approx(stats.spearmanr(pred, meas).statistic, nan_ok=True)


def test_cli_prints_and_plots(tmp_path, capsys, monkeypatch, published_checks):
    pytest.importorskip("matplotlib")
    from axgrid.perfmodel import published
    monkeypatch.setattr(published, "check_all", lambda: list(published_checks))     # priced once per session
    assert main(["validate-public", "--suite", "korthikanti", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("korthikanti  n=    8  MAPE") and (tmp_path / "korthikanti.png").stat().st_size > 1000
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["validate-public", "--suite", "vtrain", "--vtrain", str(bad)]) == 2
    assert "expected vTrain's 11 columns" in capsys.readouterr().err


def test_price_vtrain_reads_a_given_file(tmp_path):
    src = vtrain_rows()[:5]
    f = tmp_path / "five.csv"
    f.write_text("# GPUs,b,mb,h,a,L,s,t,d,p,ms\n" + "".join(
        ",".join(str(r[k]) for k in ("gpus", "batch", "mbs", "hidden", "heads", "layers", "seq", "tp", "dp", "pp",
                                     "ms")) + "\n" for r in src))
    res = price_vtrain(f)
    assert len(res.predicted) == 5 and np.all(res.predicted > 0)
