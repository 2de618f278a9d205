"""Which ranked rows the model can tell apart (perfmodel/band.py: slower_confidence, separation; rank.verdict) and
the band made of a validation suite's residuals: the confidence is the share of residual pairs, checked against
counting every pair by hand over generated residuals; the sentence names exactly the rows whose confidence is below
the level; a machine never validated says so."""
import itertools
import json
import math
import re
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from axgrid import perfmodel as pm
from axgrid.perfmodel.band import (BAND_LEVEL, QUANTILE_MIN, SEPARATION_LEVEL, Band, Residual, band_for,
                                   residuals_path, separation, slower_confidence, suite_residuals_path,
                                   write_residuals)
from axgrid.perfmodel.machines import MACHINE_DIR

ERRORS = st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=2, max_size=40)
RATIOS = st.lists(st.floats(1.0, 3.0, allow_nan=False), min_size=1, max_size=6)


def _band(errors, own=True, machine="m") -> Band:
    return Band(machine, tuple(Residual(f"p{i}", "4D", 8, "c", 1.0, math.exp(e)) for i, e in enumerate(errors)),
                own, "test")


def _by_hand(errors, ratio) -> float:
    d = math.log(ratio)
    pairs = [(a, b) for a, b in itertools.permutations(range(len(errors)), 2)]
    score = sum(1.0 if errors[a] - errors[b] < d else 0.5 if errors[a] - errors[b] == d else 0.0 for a, b in pairs)
    m = len(errors) // 2
    return score / len(pairs) * m / (m + 1)


@settings(max_examples=60, deadline=None)
@given(ERRORS, RATIOS)
def test_confidence_is_the_share_of_residual_pairs(errors, ratios):
    got = slower_confidence(errors, ratios)
    for r, g in zip(ratios, got):
        assert g == pytest.approx(_by_hand(errors, r), abs=1e-12)
    order = np.argsort(ratios, kind="stable")
    assert np.all(np.diff(got[order]) >= -1e-12)                       # never less sure of a slower row


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-0.5, 0.5, allow_nan=False), min_size=18, max_size=60),
       st.lists(st.floats(0.0, 0.6, allow_nan=False), min_size=1, max_size=12))
def test_the_sentence_names_the_rows_below_the_level(errors, steps):
    times = list(np.exp(np.cumsum([0.0] + steps)))        # best first, each row at least as slow as the one above
    band = _band(errors)
    text = separation(times, band)
    conf = slower_confidence(band.errors, [t / times[0] for t in times[1:]])     # the errors as stored (ln ∘ exp)
    head = 1 + int(np.sum(conf < SEPARATION_LEVEL))
    n = len(times)
    if head == n:
        assert text.startswith(f"Rows 1–{n} are indistinguishable")
    else:
        m = re.search(r"[Rr]ow (\d+) is slower than row 1 with (\d+)% confidence", text)
        assert m and int(m.group(1)) == head + 1 and int(m.group(2)) == round(100 * conf[head - 1])
        assert int(m.group(2)) >= 90
        assert (f"ows 1–{head} are indistinguishable" in text) == (head > 1)
    assert f"{len(errors)} residuals on m" in text


def test_few_or_no_residuals_state_no_confidence():
    times = [1.0, 2.0, 9.0]
    assert "never validated on m" in separation(times, _band([0.0, 0.1], own=False))
    assert "One validated point" in separation(times, _band([0.1]))
    # 17 identical residuals: every pair's difference is 0 < ln 9, yet m/(m+1) = 8/9 keeps it below 90%
    assert separation(times, _band([0.05] * 17)).startswith("Rows 1–3 are indistinguishable")
    assert "row 2 is slower" in separation(times, _band([0.05] * 18)).lower()
    assert separation([1.0], _band([0.0] * 30)) == ""


@settings(max_examples=40, deadline=None)
@given(ERRORS)
def test_band_edges_are_extremes_or_quantiles(errors):
    b = _band(errors)
    e = np.array(errors)
    lo, hi = (e.min(), e.max()) if len(e) < QUANTILE_MIN else np.quantile(e, [(1 - BAND_LEVEL) / 2,
                                                                              (1 + BAND_LEVEL) / 2])
    assert b.lo == pytest.approx(math.exp(min(0.0, lo))) and b.hi == pytest.approx(math.exp(max(0.0, hi)))
    assert b.lo <= 1.0 <= b.hi


def test_a_machine_with_a_suite_takes_its_band_from_the_suite(tmp_path):
    toml = tmp_path / "m.toml"
    shutil.copy(MACHINE_DIR / "perlmutter.toml", toml)
    m = pm.load_machine(toml)
    write_residuals(residuals_path(m), "perlmutter", [Residual("published", "4D", 8, "c", 1.0, 1.5)], "test")
    assert band_for(m).source == "m.residuals.json"
    errors = np.linspace(-0.2, 0.3, 40)
    write_residuals(suite_residuals_path(m), "perlmutter",
                    [Residual(f"s{i}", "TPxPPxDP", 64, "c", 1.0, math.exp(e), problem="vtrain")
                     for i, e in enumerate(errors)], "test")
    band = band_for(m)
    assert band.own and band.source == "m.suite-residuals.json" and len(band.residuals) == 40
    assert band.lo == pytest.approx(math.exp(np.quantile(errors, 0.05)))
    assert band.hi == pytest.approx(math.exp(np.quantile(errors, 0.95)))
    assert "the 90% range of measured/predicted over 40 validated points" in band.describe()
    doc = json.loads(suite_residuals_path(m).read_text())
    assert {p["problem"] for p in doc["points"]} == {"vtrain"}


def test_rank_says_which_rows_it_can_tell_apart():
    from axgrid.perfmodel.rank import verdict
    prob = pm.Problem(pm.get_model("gpt-5b"), 64, 32)
    never = pm.rank(prob, pm.load_machine("juwels-booster"))
    assert "never validated on juwels-booster" in verdict(never)
    seen = pm.rank(prob, pm.load_machine("perlmutter"))     # two published points: too few for 90%
    n = len(seen.shown("all"))
    assert f"Rows 1–{n} are indistinguishable" in verdict(seen)
