"""Hypothesis properties and bad inputs of perfmodel."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from axgrid import perfmodel as pm
from axgrid.perfmodel.space import enumerate_grids

SPEC = pm.get_model("gpt-mini")
MACHINES = ["perlmutter", "frontier", "dgx-h100"]
opts = st.builds(pm.Options, overlap_ar=st.booleans(), overlap_rs=st.booleans(), overlap_ag=st.booleans(),
                 overlap_dp=st.booleans(), recompute=st.booleans(), keep_gathered=st.booleans())
FAST = settings(max_examples=25, deadline=None)


@FAST
@given(gpus=st.sampled_from([8, 12, 16, 32]), machine=st.sampled_from(MACHINES), opt=opts,
       bw=st.floats(1.0, 100.0), fl=st.floats(1.0, 100.0))
def test_more_bandwidth_or_flops_never_slower(gpus, machine, opt, bw, fl):
    m = pm.load_machine(machine)
    prob = pm.Problem(SPEC, 48, gpus, options=opt)
    g = enumerate_grids(gpus)
    base = pm.evaluate(prob, m, g).time
    for faster in (m.scaled(bandwidth=bw), m.scaled(flops=fl), m.scaled(flops=fl, bandwidth=bw)):
        t = pm.evaluate(prob, faster, g).time
        ok = np.isfinite(base)
        assert np.all(np.isfinite(t) == ok)
        assert np.all(t[ok] <= base[ok] * (1 + 1e-12))


@FAST
@given(gpus=st.sampled_from([4, 8, 16]), machine=st.sampled_from(MACHINES), opt=opts, frac=st.floats(1e-6, 1.0))
def test_over_memory_is_always_rejected(gpus, machine, opt, frac):
    m = pm.load_machine(machine).scaled(memory=frac)
    ev = pm.evaluate(pm.Problem(pm.get_model("gpt-5b"), 64, gpus, options=opt), m, enumerate_grids(gpus))
    over = ev.memory.total > ev.memory_limit
    assert not np.any(ev.feasible & over)
    assert all("memory" in ev.reasons[i] or ev.reasons[i] for i in np.nonzero(over)[0])
    tiny = m.scaled(memory=1e-9)
    ev2 = pm.evaluate(pm.Problem(SPEC, 16, gpus, options=opt), tiny, enumerate_grids(gpus))
    assert not ev2.feasible.any()


@FAST
@given(gpus=st.sampled_from([12, 16, 24]), seed=st.integers(0, 2**31 - 1), opt=opts)
def test_ranking_independent_of_enumeration_order(gpus, seed, opt):
    m = pm.load_machine("perlmutter")
    prob = pm.Problem(SPEC, 48, gpus, options=opt)
    g = enumerate_grids(gpus)
    perm = np.random.default_rng(seed).permutation(len(g))
    a = pm.rank(prob, m, g, require_feasible=False)
    b = pm.rank(prob, m, g.take(perm), require_feasible=False)
    assert [(r.rank, r.grid, r.time_s) for r in a.rows] == [(r.rank, r.grid, r.time_s) for r in b.rows]


def test_feasible_rows_respect_divisibility():
    rk = pm.rank(pm.Problem(SPEC, 48, 24), pm.load_machine("perlmutter"))
    for r in rk.feasible:
        gx, gy, gz, gd = r.grid
        assert SPEC.hidden % gx == 0 and SPEC.hidden % gy == 0 and SPEC.heads % gy == 0
        assert 48 % gd == 0 and (48 * SPEC.seq) % (gd * gz) == 0
    reasons = {r.reason for r in rk.rows if not r.feasible}
    assert any(f"heads {SPEC.heads} not divisible by Gy=3" in x for x in reasons)   # gpt-mini: heads 4 (was 8)
    ranks = [r.rank for r in rk.feasible]
    assert ranks == list(range(1, len(ranks) + 1))
    assert all(rk.feasible[i].time_s <= rk.feasible[i + 1].time_s for i in range(len(ranks) - 1))


def test_unknown_model_lists_known():
    """An unknown name lists the GPT sizes and the public models, and says that a config.json works too."""
    with pytest.raises(pm.PerfModelError, match=r"GPT size \(.*gpt-80b.*public model \(.*llama-3.1-8b.*--config"):
        pm.get_model("gpt-7b")


def test_unknown_machine_lists_known():
    with pytest.raises(pm.MachineFileError, match="known machines: .*perlmutter"):
        pm.load_machine("summit")


def test_no_valid_factorisation():
    with pytest.raises(pm.NoFeasibleConfig, match="7 GPUs.*not divisible"):
        pm.rank(pm.Problem(pm.get_model("gpt-tiny"), 2, 7), pm.load_machine("perlmutter"))


def test_batch_indivisible():
    with pytest.raises(pm.PerfModelError, match="not divisible by microbatches 4"):
        pm.Problem(SPEC, 6, 8, options=pm.Options(microbatches=4))
    with pytest.raises(pm.PerfModelError, match="batch must be a positive"):
        pm.Problem(SPEC, 0, 8)
    with pytest.raises(pm.PerfModelError, match="unknown dtype"):
        pm.Problem(SPEC, 8, 8, dtype="int8")


GOOD = """name = "t"
gpus_per_node = 4
peak_flops_bf16 = 1e12
peak_flops_fp32 = 1e11
memory_bytes = 1_000_000_000
intra_node_bandwidth = 1e10
intra_node_latency = 1e-6
inter_node_bandwidth_per_nic = 1e9
inter_node_latency = 1e-5
nics_per_node = 2
"""


def test_machine_file_errors_name_file_and_field(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(GOOD.replace("nics_per_node = 2\n", ""))
    with pytest.raises(pm.MachineFileError, match=r"m\.toml.*'nics_per_node'"):
        pm.load_machine(f)
    f.write_text(GOOD.replace("gpus_per_node = 4", 'gpus_per_node = "four"'))
    with pytest.raises(pm.MachineFileError, match=r"m\.toml.*'gpus_per_node' must be int"):
        pm.load_machine(f)
    f.write_text(GOOD + "[fitted.placement.intra]\nalpha = 1e-6\n")
    with pytest.raises(pm.MachineFileError, match=r"m\.toml.*fitted\.placement\.intra\.beta"):
        pm.load_machine(f)
    f.write_text(GOOD + "oops = = 3\n")
    with pytest.raises(pm.MachineFileError, match=r"m\.toml: malformed TOML"):
        pm.load_machine(f)
    f.write_text(GOOD)
    assert pm.load_machine(f).nics_per_node == 2


def test_every_library_machine_loads_and_has_sources():
    ms = pm.list_machines()
    assert {"perlmutter", "frontier", "alps", "juwels-booster", "dgx-h100"} <= {m.name for m in ms}
    from axgrid.perfmodel.machines import MACHINE_DIR, REQUIRED
    for f in MACHINE_DIR.glob("*.toml"):
        lines = f.read_text().splitlines()
        for key in REQUIRED:
            if key == "name":
                continue
            line = next(x for x in lines if x.startswith(key + " "))
            assert "# source:" in line, (f.name, key)


@pytest.mark.parametrize("machine", ["perlmutter", "frontier", "alps", "juwels-booster", "dgx-h100"])
def test_gpt_table_ranks_on_every_machine(machine):
    m = pm.load_machine(machine)
    for name in ("gpt-5b", "gpt-80b", "gpt-640b"):
        rk = pm.rank(pm.Problem(pm.get_model(name), 2048, 1024), m)
        assert 0 < rk.best.pct_peak < 100
