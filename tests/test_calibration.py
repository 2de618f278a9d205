"""The runtime side of calibration and validation (axgrid.calibration) on real gloo ranks, and its plumbing into
perfmodel (samples -> fitted machine file; timed configurations -> validation metrics and files)."""
from __future__ import annotations

import json

import pytest

from axgrid import perfmodel as pm
from axgrid import calibration
from axgrid.layout import GridShape, Layout
from axgrid.perfmodel import calibrate as cal
from axgrid.perfmodel import validate as val
from axgrid.perfmodel.cli import main
from axgrid.perfmodel.errors import PerfModelError

TINY = pm.TransformerSpec("tiny-test", layers=1, hidden=8, heads=2, seq=8, vocab=16)


@pytest.mark.parametrize("n", [2, 4, 6, 8, 12])
def test_group_layouts_have_the_size_and_stride_they_claim(n):
    seen = set()
    for p, s, spec, dim in calibration.group_layouts(n):
        groups = Layout(GridShape.parse(spec, n), "xyzd").groups(dim)
        assert all(len(g) == p for g in groups) and len(groups) == n // p
        assert all(b - a == s for g in groups for a, b in zip(g, g[1:]))
        seen.add((p, s))
    want = {(p, s) for s in range(1, n + 1) for p in range(2, n + 1) if n % (p * s) == 0}
    assert seen == want


def test_measure_on_real_ranks_and_fit_a_machine(tmp_path):
    sizes, shapes = [1024, 16384], [(16, 16, 16), (64, 32, 48)]
    comm, gemm = cal.measure_with_runtime(4, sizes, shapes, reps=2, warmup=1)
    keys = {(c.op, c.group_size, c.stride) for c in comm}
    assert keys == {(op, p, s) for op in calibration.OPS for p, s in ((2, 1), (4, 1), (2, 2))}
    assert len(comm) == len(keys) * len(sizes)
    for c in comm:
        assert c.seconds > 0 and c.concurrent == 1
        assert c.bytes in sizes             # both sizes are multiples of every group size: no rounding
    assert [(g.m, g.n, g.k) for g in gemm] == shapes and all(g.seconds > 0 for g in gemm)
    peak = max(2.0 * g.m * g.n * g.k / g.seconds for g in gemm)
    out = tmp_path / "local.toml"
    m = cal.calibrate(comm, gemm, cal.local_base(4, peak), out=out, peak=peak)
    assert set(cal.fit_placements(comm, 4)) == {"intra"}          # one host: every ring is inside the "node"
    loaded = pm.load_machine(out)
    assert loaded.placement["intra"].beta == pytest.approx(m.placement["intra"].beta)
    assert 0 < loaded.gemm_eff_max <= 1 and len(loaded.gemm_table) == 2


def test_measure_rejects_bad_input_before_starting_ranks():
    with pytest.raises(ValueError, match="nranks"):
        calibration.measure(nranks=1, sizes_bytes=[1024], gemm_shapes=[])
    with pytest.raises(ValueError, match="sizes_bytes"):
        calibration.measure(nranks=2, sizes_bytes=[], gemm_shapes=[])
    with pytest.raises(ValueError, match="GEMM shape"):
        calibration.measure(nranks=2, sizes_bytes=[1024], gemm_shapes=[(4, 0, 4)])
    with pytest.raises(ValueError, match="unknown collective"):
        calibration.measure(nranks=2, sizes_bytes=[1024], gemm_shapes=[], ops=["broadcast"])


def test_time_configs_rejects_bad_input_before_starting_ranks():
    with pytest.raises(ValueError, match="unknown overlap"):
        calibration.time_configs(TINY, [(2, 1, 1, 1)], batch=2, overlap="oar,fast")
    for ov in ("oar,ors,oag,odp,keep", "all", "none"):          # every runtime overlap is passed through now
        assert calibration._check_options(ov, recompute=True) is not None
    assert calibration._check_options("all", False) == calibration._check_options("oar,ors,oag,odp", False)
    if not calibration._has_gpt():                                  # the GPT recomputes; the stack does not
        with pytest.raises(ValueError, match="--no-recompute"):
            calibration.time_configs(TINY, [(2, 1, 1, 1)], batch=2, recompute=True)
    with pytest.raises(ValueError, match="same number of ranks"):
        calibration.time_configs(TINY, [(2, 1, 1, 1), (2, 2, 1, 1)], batch=2)
    with pytest.raises(ValueError, match="layers"):
        calibration.time_configs({"hidden": 8}, [(2, 1, 1, 1)], batch=2)
    with pytest.raises(ValueError, match="bucket_bytes"):
        calibration.time_configs(TINY, [(2, 1, 1, 1)], batch=2, bucket_bytes=0)


def test_time_configs_passes_overlaps_and_recompute_to_the_runtime():
    """ORS/OAG/keep with recompute, and ODP with 2 micro-batches (the first under no_sync) and small buckets, run
    through the runtime (the GPT workload recomputes when asked)."""
    secs = calibration.time_configs(TINY, [(1, 1, 2, 2), (1, 2, 1, 2)], batch=4, microbatches=[1, 2],
                                    overlap="oar,ors,oag,keep", recompute=calibration._has_gpt(), steps=1,
                                    warmup=0, rounds=1)
    assert len(secs) == 2 and all(0 < s < 30 for s in secs)
    secs = calibration.time_configs(TINY, [(1, 2, 1, 2)], batch=4, microbatches=2, overlap="oar,oag,odp",
                                    steps=1, warmup=1, rounds=1, bucket_bytes=256)
    assert len(secs) == 1 and 0 < secs[0] < 30


def test_time_configs_stack_workload_on_real_ranks():
    secs = calibration.time_configs(TINY, [(2, 2, 1, 1)], batch=4, microbatches=2,
                                    overlap="oar", steps=1, warmup=0, rounds=1, workload="stack")
    assert len(secs) == 1 and 0 < secs[0] < 30
    with pytest.raises(ValueError, match="--no-recompute"):
        calibration.time_configs(TINY, [(2, 1, 1, 1)], batch=2, recompute=True, workload="stack")
    with pytest.raises(ValueError, match="unknown workload"):
        calibration.time_configs(TINY, [(2, 1, 1, 1)], batch=2, workload="bert")


def test_time_configs_on_real_ranks():
    secs = calibration.time_configs(TINY, [(1, 1, 2, 2), (1, 2, 1, 2)], batch=4,
                                    microbatches=[1, 2], overlap="oar,keep", steps=1, warmup=0, rounds=1)
    assert len(secs) == 2 and all(0 < s < 30 for s in secs)


def test_validate_cli_end_to_end(tmp_path, capsys):
    machine = tmp_path / "m.toml"
    cal.write_machine(cal.local_base(4, 5e10), machine)
    out = tmp_path / "val"
    rc = main(["validate", "--layers", "1", "--hidden", "8", "--heads", "2", "--seq", "8", "--vocab", "16",
               "--gpus", "4", "--machine", str(machine), "--batch", "4", "--dtype", "fp32", "--no-ors", "--no-oag",
               "--no-odp", "--no-recompute", "--top", "1", "--sample", "1", "--steps", "1", "--warmup", "0",
               "--rounds", "1", "--out-dir", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "Spearman rho" in text and calibration.workload_name() in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 2 and "workload" in summary and summary["top1_regret"] >= 1.0
    assert (out / "validation.csv").read_text().count("\n") == 3
    assert (out / "validation.png").stat().st_size > 0


def test_validate_passes_the_options_and_maps_runtime_refusals_to_perfmodel_errors(monkeypatch):
    opt = pm.Options(overlap_dp=False, bucket_bytes=4096)           # ORS/OAG/OAR + recompute on, ODP off
    prob = pm.Problem(TINY, 4, 4, "fp32", opt)
    rk = pm.rank(prob, cal.local_base(4, 5e10))
    seen = {}

    def fake(**kw):
        seen.update(kw)
        return [0.1] * len(kw["grids"])
    monkeypatch.setattr(calibration, "time_configs", fake)
    val.measure_with_runtime(rk, rk.feasible[:2], steps=1)
    assert seen["overlap"] == "oar,ors,oag" and seen["recompute"] is True and seen["bucket_bytes"] == 4096

    def refuse(**kw):
        raise ValueError("no such thing")
    monkeypatch.setattr(calibration, "time_configs", refuse)
    with pytest.raises(PerfModelError, match="validation run: no such thing"):
        val.measure_with_runtime(rk, rk.feasible[:2], steps=1)


def test_model_gemm_shapes_cover_the_models_gemms():
    shapes = cal.model_gemm_shapes(pm.get_model("gpt-tiny"), 8, 4, limit=1000)
    # 1x1x1x4: m' = 8*64/4 = 128 tokens; QKV forward [128, 64] x [64, 192]
    assert (128, 192, 64) in shapes and (128, 64, 192) in shapes and (192, 64, 128) in shapes
    assert (64, 64, 16) in shapes                                     # attention: seq x seq x head_dim
    assert len(cal.model_gemm_shapes(pm.get_model("gpt-tiny"), 8, 4, limit=10)) <= 10


def test_time_configs_gpt_in_bf16_runs_under_autocast():
    """``validate``'s default dtype: the GPT workload in bf16 runs as train_gpt runs it (fp32 parameters under
    autocast); casting the whole model used to fail in the first GEMM (float != BFloat16)."""
    secs = calibration.time_configs(TINY, [(1, 2, 1, 1)], batch=2, dtype="bf16", steps=1, warmup=0, rounds=1)
    assert len(secs) == 1 and 0 < secs[0] < 30
