"""axgrid.measure (measurements on real gloo ranks, run in-process on every rank of a pool as under
``axgrid launch``) and perfmodel reading what it writes: samples -> fitted machine file; step times -> validation
metrics and files; missing, malformed or mismatched files -> one-line errors naming the command that writes them."""
from __future__ import annotations

import json
import os

import pytest

from axgrid import perfmodel as pm
from axgrid.spec.layout import GridShape, RankLayout
from axgrid.perfmodel import calibrate as cal
from axgrid.perfmodel.cli import main
from axgrid.measure import cli as measure_cli
from axgrid.measure.collectives import group_layouts
TINY = ["--layers", "1", "--hidden", "8", "--heads", "2", "--seq", "8", "--vocab", "16", "--batch", "4",
        "--dtype", "fp32"]


def rank_main(argv: list) -> dict:
    return measure_cli.main(argv)


def rank_refusal(argv: list) -> str:
    try:
        measure_cli.main(argv)
    except SystemExit as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("n", [2, 4, 6, 8, 12])
def test_group_layouts_have_the_size_and_stride_they_claim(n):
    seen = set()
    for p, s, spec, dim in group_layouts(n):
        groups = RankLayout(GridShape.parse(spec, n), "xyzd").groups(dim)
        assert all(len(g) == p for g in groups) and len(groups) == n // p
        assert all(b - a == s for g in groups for a, b in zip(g, g[1:]))
        seen.add((p, s))
    want = {(p, s) for s in range(1, n + 1) for p in range(2, n + 1) if n % (p * s) == 0}
    assert seen == want


@pytest.mark.slow
def test_collectives_script_writes_samples_that_calibrate_fits(ranks, tmp_path, capsys):
    samples, sizes = tmp_path / "calibration.json", [1024, 16384]
    docs = ranks(4, rank_main, ["collectives", "--sizes", "1024,16384", "--gemm-cubes", "16,48", "--reps", "2",
                                "--warmup", "1", "--gemm-min-time", "0.01", "--out", str(samples)])
    doc = json.loads(samples.read_text())
    assert all(d["comm"] == doc["comm"] for d in docs) and doc["nranks"] == 4
    keys = {(c["op"], c["group_size"], c["stride"]) for c in doc["comm"]}
    assert keys == {(op, p, s) for op in ("all_reduce", "all_gather", "reduce_scatter")
                    for p, s in ((2, 1), (4, 1), (2, 2))}
    assert len(doc["comm"]) == len(keys) * len(sizes)
    assert all(c["seconds"] > 0 and c["bytes"] in sizes for c in doc["comm"])   # sizes divide by every group
    assert [(g["m"], g["n"], g["k"]) for g in doc["gemm"]] == [(16, 16, 16), (48, 48, 48)]
    out = tmp_path / "local.toml"
    assert main(["calibrate", "--samples", str(samples), "--out", str(out)]) == 0
    assert "intra: alpha" in capsys.readouterr().out
    m = pm.load_machine(out)
    assert m.gpus_per_node == 4 and set(m.placement) >= {"intra"}     # one host: every ring is inside the node
    assert 0 < m.gemm_eff_max <= 1 and len(m.gemm_table) == 2


@pytest.mark.slow
def test_steps_script_times_what_validate_compares(ranks, tmp_path, capsys):
    """All overlaps, recompute, 2 micro-batches (the first under no_sync) and small buckets, through the GPT, in
    bf16 as train_gpt runs it (fp32 parameters under autocast; casting the model failed in the first GEMM)."""
    machine, steps = tmp_path / "m.toml", tmp_path / "steps.json"
    cal.write_machine(cal.local_base(4, 5e10), machine)
    problem = [*TINY, "--gpus", "4", "--machine", str(machine), "--microbatches", "2", "--bucket-mib", "0.001",
               "--dtype", "bf16"]
    docs = ranks(4, rank_main, ["steps", *problem, "--top", "1", "--sample", "1", "--steps", "1", "--warmup", "0",
                                "--rounds", "1", "--out", str(steps)])
    doc = json.loads(steps.read_text())
    assert doc["problem"]["options"] == "oar,ors,oag,odp" and doc["problem"]["recompute"] is True
    assert len(doc["configs"]) == 2 and all(0 < c["seconds"] < 30 and c["microbatches"] == 2
                                            for c in doc["configs"])
    assert docs[1]["configs"] == doc["configs"]
    out = tmp_path / "val"
    assert main(["validate", *problem, "--measured", str(steps), "--out-dir", str(out)]) == 0
    assert "Spearman rho" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 2 and summary["top1_regret"] >= 1.0 and summary["measured_from"] == str(steps)
    assert (out / "validation.csv").read_text().count("\n") == 3
    # the same file for another problem is refused, naming the field and the command that writes the file
    assert main(["validate", *problem, "--no-odp", "--measured", str(steps)]) == 2
    err = capsys.readouterr().err
    assert "options='oar,ors,oag,odp'" in err and "python -m axgrid.measure steps" in err


@pytest.mark.slow
def test_script_refuses_bad_input_on_every_rank(ranks, tmp_path):
    machine = tmp_path / "m.toml"
    cal.write_machine(cal.local_base(4, 5e10), machine)
    out = str(tmp_path / "x.json")
    msgs = ranks(4, rank_refusal, ["collectives", "--sizes", "2", "--out", out])
    assert all("--sizes" in m for m in msgs)
    msgs = ranks(4, rank_refusal, ["steps", *TINY, "--gpus", "8", "--machine", str(machine), "--out", out])
    assert all("axgrid launch -n 8" in m for m in msgs)
    assert not os.path.exists(out)


def test_calibrate_and_validate_name_the_command_for_a_missing_or_bad_file(tmp_path, capsys):
    missing = str(tmp_path / "none.json")
    assert main(["calibrate", "--out", str(tmp_path / "m.toml")]) == 2
    assert "python -m axgrid.measure collectives" in capsys.readouterr().err
    assert main(["calibrate", "--samples", missing]) == 2
    err = capsys.readouterr().err
    assert missing in err and f"axgrid.measure collectives --out {missing}" in err and err.count("\n") == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"comm": [{"op": "all_reduce"}]}')
    assert main(["calibrate", "--samples", str(bad)]) == 2
    assert "bad sample" in capsys.readouterr().err
    machine = tmp_path / "m.toml"
    cal.write_machine(cal.local_base(4, 5e10), machine)
    problem = [*TINY, "--gpus", "4", "--machine", str(machine)]
    assert main(["validate", *problem]) == 2
    assert "axgrid launch -n 4 -- python -m axgrid.measure steps" in capsys.readouterr().err
    assert main(["validate", *problem, "--measured", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "axgrid.measure steps" in err and err.count("\n") == 1


def test_model_gemm_shapes_cover_the_models_gemms():
    shapes = cal.model_gemm_shapes(pm.get_model("gpt-tiny"), 8, 4, limit=1000)
    # 1x1x1x4: m' = 8*64/4 = 128 tokens; QKV forward [128, 64] x [64, 192]
    assert (128, 192, 64) in shapes and (128, 64, 192) in shapes and (192, 64, 128) in shapes
    assert (64, 64, 16) in shapes                                     # attention: seq x seq x head_dim
    assert len(cal.model_gemm_shapes(pm.get_model("gpt-tiny"), 8, 4, limit=10)) <= 10
