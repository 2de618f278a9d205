"""The dry run (axgrid/dryrun/) is the real runtime: one rank's step on the fakegpu device under torch's fake process
group posts exactly the collectives (bytes and calls per grid dimension and operation) that the same step posts on
real gloo ranks, and its peak of live tensor bytes is within 5% of the one ``axgrid.metrics.memtrack`` measures
there; on 4 and 8 ranks, several grids, with and without recompute and the overlaps. The real side runs in fp32
(gloo's bf16 sums add fp32 copies a GPU does not make). A dry run of a 4,096-rank grid completes and agrees with
perfmodel's collectives; bad input is refused in one line before anything is allocated. The same for a Hugging Face
config.json (a small Llama with grouped-query attention, tied and untied; Qwen2 and Mistral too): the dry run equals
gloo ranks, its ledger and parameter, gradient, optimizer and activation bytes equal perfmodel's, and its peak is
within 5% of perfmodel's; the command line prints perfmodel's s/batch for it and, without --grid, dry-runs
perfmodel's best grid."""
from __future__ import annotations

import dataclasses

import pytest

from helpers import slow_where
from helpers.dryrun_real import measure_real_step

from axgrid.dryrun import DryRunError, predict, resolve
from axgrid.testing.isolated import run_isolated

PEAK_TOLERANCE = 0.05
# (grid, batch, microbatches, recompute, overlap, zero)
CASES = [
    ("2x1x2x1", 4, 2, True, "all", 0),
    ("1x2x1x2", 4, 2, False, "none", 0),
    ("2x2x1x2", 4, 2, False, "oar,oag", 0),
    ("1x1x2x4", 8, 1, True, "all", 2),
    ("2x2x2x1", 4, 2, True, "all,keep", 0),
]


def _config(grid: str, batch: int, mb: int, recompute: bool, overlap: str, zero: int):
    return resolve("gpt-tiny", None, batch, grid=grid, machine="local-4", dtype="fp32", recompute=recompute,
                   overlap=overlap, microbatches=mb, zero=zero)


def dry(cfg, rank: int):
    from axgrid.dryrun.step import measure_rank
    return measure_rank(cfg, rank)


def dry_ranks(cfg, ranks: list[int]) -> list:
    """The dry runs of several ranks of ``cfg``, one after another in one process (one isolated process per
    configuration, not per rank: its fake-tensor caches warm after the first)."""
    from axgrid.dryrun.step import measure_rank
    return [measure_rank(cfg, r) for r in ranks]


@pytest.mark.parametrize("grid,batch,mb,recompute,overlap,zero",
                         slow_where(CASES, lambda c: c[0] != "2x1x2x1"), ids=[c[0] for c in CASES])
def test_dry_run_equals_real_ranks(ranks, grid, batch, mb, recompute, overlap, zero):
    cfg = _config(grid, batch, mb, recompute, overlap, zero)
    got = ranks(cfg.gpus, measure_real_step, cfg)
    compared = sorted({0, cfg.gpus - 1})
    for r, d in zip(compared, run_isolated(dry_ranks, cfg, compared, timeout_s=300)):
        assert d.comm == got[r].comm, f"rank {r}: ledger {d.comm} in the dry run, {got[r].comm} on gloo"
        assert abs(d.peak / got[r].peak - 1) <= PEAK_TOLERANCE, (r, d.peak, got[r].peak, d.moment, got[r].moment)
        for k in ("parameters", "gradients", "optimizer", "activations"):
            assert d.memory[k] == got[r].memory[k], (r, k, d.memory[k], got[r].memory[k])


def test_a_4096_rank_dry_run_agrees_with_perfmodel():
    # recompute off: what each block saves is compared (flash attention's set: with torch's math attention on the
    # fakegpu device the activations are 45% over)
    cfg = resolve("gpt-tiny", None, 256, grid="4x4x16x16", machine="frontier", microbatches=1, recompute=False)
    m = run_isolated(dry, cfg, 4095, timeout_s=300)
    p = predict(cfg)
    assert m.comm == p.comm
    assert m.coord == {"x": 3, "y": 3, "z": 15, "d": 15}
    for k in ("parameters", "gradients", "optimizer", "gathered", "activations"):
        assert m.memory[k] == p.memory[k], (k, m.memory[k], p.memory[k])


def test_bad_input_is_refused_naming_the_valid_grids():
    with pytest.raises(DryRunError, match=r"hidden 64 not divisible by Gx=3.*grids of 6 ranks that do: .*2x1x1x3"):
        resolve("gpt-tiny", None, 12, grid="3x1x1x2", machine="local-4")
    with pytest.raises(DryRunError, match=r"has 8 ranks, not --gpus 16: .*; grids of 16 ranks"):
        resolve("gpt-tiny", 16, 16, grid="2x2x2x1", machine="local-4")
    with pytest.raises(DryRunError, match="unknown model"):
        resolve("gpt-nope", 8, 8, machine="local-4")
    with pytest.raises(DryRunError, match="--zero 1 on grid 2x2x2x1: Gd = 1"):
        resolve("gpt-tiny", None, 8, grid="2x2x2x1", machine="local-4", zero=1)


def test_the_grid_defaults_to_perfmodels_best():
    from axgrid import perfmodel as pm
    cfg = resolve("gpt-20b", 512, 512, machine="frontier")
    opt = dataclasses.replace(cfg.options(), microbatches=None, zero=None)
    best = pm.rank(dataclasses.replace(cfg.problem(), options=opt),
                   pm.load_machine("frontier"), tp_pp_dp=False).feasible[0]
    assert (cfg.grid, cfg.microbatches, cfg.zero) == (best.grid_str, best.microbatches, best.zero)


@pytest.mark.slow
def test_perfmodel_rank_verify_dry_runs_the_top_rows(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "axgrid.perfmodel", "rank", "--model", "gpt-tiny", "--gpus", "4",
                          "--machine", "local-4", "--batch", "8", "--no-recompute", "--verify", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    row = out.stdout.strip().splitlines()[-1].split()
    assert row[0] == "1" and row[-2:] == ["equal", "ok"], out.stdout
    bad = subprocess.run([sys.executable, "-m", "axgrid.perfmodel", "rank", "--layers", "2", "--hidden", "64",
                          "--heads", "4", "--gpus", "4", "--machine", "local-4", "--batch", "8", "--verify", "1"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--verify dry-runs a named model" in bad.stderr


def groups_of(grid: str, rank: int) -> tuple[int, float]:
    import time

    from axgrid.dryrun.harness import dry_run
    start = time.perf_counter()
    with dry_run(grid, rank=rank, device="fakegpu") as run:
        return len(run.grid._all_groups), time.perf_counter() - start


def test_a_rank_of_32768_builds_only_its_own_groups():
    groups, seconds = run_isolated(groups_of, "8x8x2x256", 12345, timeout_s=300)
    assert groups == 6, f"{groups} process groups built (this rank's: x, y, z, d, xy, xyz)"
    assert seconds < 30


@pytest.mark.slow
def test_a_run_that_does_not_fit_names_perfmodels_best_grid_that_does(tmp_path):
    import re
    import subprocess
    import sys

    from axgrid.perfmodel.machines import known_machine_files
    text = known_machine_files()["local-4"].read_text()
    toml = tmp_path / "small.toml"       # 2.3 MB per rank: gpt-tiny's 4 sequences fit 1x1x1x2 in 2 micro-batches only
    toml.write_text(re.sub(r"(?m)^memory_bytes = \d+", "memory_bytes = 2300000", text).replace('"local-4"', '"small"'))
    out = subprocess.run([sys.executable, "-m", "axgrid.dryrun", "--model", "gpt-tiny", "--grid", "1x1x1x2", "--batch",
                          "4", "--microbatches", "1", "--zero", "0", "--machine", str(toml)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("DOES NOT FIT")]
    assert line and "does not fit small's 2.19 MiB" in line[0], line
    assert "perfmodel's best grid that fits is 1x1x1x2 zero 1 with 2 micro-batch(es)" in line[0], line


# ---------------------------------------------------------------------------------- a Hugging Face config.json

def _llama_config(folder, tied: bool, kv_heads: int = 2, heads: int = 4, ffn: int = 64, vocab: int = 64,
                  model_type: str = "llama") -> str:
    """A small config.json of the Llama structure (GQA: 4 heads, 2 key-value heads; SwiGLU; rope) in ``folder``."""
    import json
    import os
    os.makedirs(folder, exist_ok=True)
    fields = {"model_type": model_type, "hidden_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": 64, "hidden_act": "silu",
              "rms_norm_eps": 1e-5, "tie_word_embeddings": tied, "attention_bias": False, "mlp_bias": False}
    path = os.path.join(folder, "config.json")
    with open(path, "w") as f:
        json.dump(fields, f)
    return path


# (family, grid, batch, microbatches, recompute, overlap, zero, tied)
HF_CASES = [
    ("llama", "2x2x1x1", 4, 2, True, "all", 0, True),
    ("llama", "1x2x2x1", 4, 1, False, "none", 0, False),
    ("llama", "2x1x1x2", 4, 2, True, "oar,oag", 1, False),
    ("qwen2", "1x2x2x1", 4, 2, True, "all", 0, False),       # q, k, v biases
    ("mistral", "2x1x2x1", 4, 2, True, "all", 0, False),
]


@pytest.mark.slow          # the fast set runs a config through the command line (below)
@pytest.mark.parametrize("family,grid,batch,mb,recompute,overlap,zero,tied", HF_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in HF_CASES])
def test_a_hugging_face_config_dry_run_equals_real_ranks_and_perfmodel(ranks, tmp_path, family, grid, batch, mb,
                                                                       recompute, overlap, zero, tied):
    path = _llama_config(tmp_path / family, tied, model_type=family)
    cfg = resolve(path, None, batch, grid=grid, machine="local-4", dtype="fp32", recompute=recompute,
                  overlap=overlap, microbatches=mb, zero=zero, seq=16)
    got = ranks(cfg.gpus, measure_real_step, cfg)
    p = predict(cfg)
    # perfmodel's peak is a micro-batch's that starts with the gradients accumulated: one micro-batch on Gd = 1 peaks
    # lower by up to the gradients (perfmodel.memory's docstring), so the peak is compared from two on or Gd > 1
    compare_peak = mb > 1 or cfg.shape[3] > 1
    compared = sorted({0, cfg.gpus - 1})
    for r, d in zip(compared, run_isolated(dry_ranks, cfg, compared, timeout_s=300)):
        assert d.comm == got[r].comm, f"rank {r}: ledger {d.comm} in the dry run, {got[r].comm} on gloo"
        assert d.comm == p.comm, f"rank {r}: ledger {d.comm}, perfmodel {p.comm}"
        assert abs(d.peak / got[r].peak - 1) <= PEAK_TOLERANCE, \
            f"rank {r}: peak {d.peak} at {d.moment} {d.memory}; gloo {got[r].peak} at {got[r].moment} {got[r].memory}"
        for k in ("parameters", "gradients", "optimizer", "activations"):
            assert d.memory[k] == got[r].memory[k], (r, k, d.memory[k], got[r].memory[k])
        for k in ("parameters", "gradients", "optimizer", "activations", "gathered"):
            assert d.memory[k] == p.memory[k], (r, k, d.memory[k], p.memory[k])
        if compare_peak:
            assert abs(d.peak / p.peak - 1) <= PEAK_TOLERANCE, (r, d.peak, p.peak, d.moment, d.memory, p.memory)


def test_a_hugging_face_config_is_refused_before_anything_is_allocated(tmp_path):
    ok = _llama_config(tmp_path / "ok", False)
    with pytest.raises(DryRunError, match=r"model_type 'gpt2' .* not a family the dry run models; use a config of "
                                          r"llama, mistral, qwen2"):
        resolve(_llama_config(tmp_path / "gpt2", False, model_type="gpt2"), None, 4, grid="1x1x1x1")
    with pytest.raises(DryRunError, match=r"num_key_value_heads 2 not divisible by Gy=4; grids of 4 ranks that do: "
                                          r"1x1x1x4, 1x1x2x2, 1x1x4x1, 1x2x1x2"):
        resolve(ok, None, 4, grid="1x4x1x1", machine="local-4")
    with pytest.raises(DryRunError, match=r"intermediate_size 66 not divisible by Gy=4"):
        resolve(_llama_config(tmp_path / "f", False, kv_heads=4, ffn=66), None, 4, grid="1x4x1x1")
    with pytest.raises(DryRunError, match=r"vocab_size 66 not divisible by Gy=4"):
        resolve(_llama_config(tmp_path / "v", False, kv_heads=4, vocab=66), None, 4, grid="1x4x1x1")
    with pytest.raises(DryRunError, match=r"hidden_size 32 not divisible by Gx=3"):
        resolve(ok, None, 3, grid="3x1x1x1")
    chosen = resolve(ok, 4, 4, machine="local-4")           # no grid: perfmodel's best that the model divides
    assert chosen.gpus == 4 and not chosen.model.divisibility(chosen.shape), chosen.grid
    with pytest.raises(DryRunError, match=r"give --gpus N \(perfmodel picks the grid\) or --grid"):
        resolve(ok, None, 4)
    with pytest.raises(DryRunError, match=r"no such config.json"):
        resolve(str(tmp_path / "nowhere" / "config.json"), None, 4, grid="1x1x1x1")
    with pytest.raises(DryRunError, match=r"--seq 16: a named size has its own"):
        resolve("gpt-tiny", None, 4, grid="1x1x1x1", seq=16)


def cli(argv: list) -> tuple:
    """``python -m axgrid.dryrun argv``: (exit code, stdout, the warnings it gave)."""
    import contextlib
    import io
    import warnings

    from axgrid.dryrun.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(argv)
    return code, out.getvalue(), [str(w.message) for w in caught]


def test_the_command_line_dry_runs_a_config_beside_perfmodel(tmp_path):
    import json
    import re

    from axgrid.perfmodel.machines import known_machine_files
    toml = tmp_path / "small.toml"           # 100 kB per rank: less than the step's peak
    toml.write_text(re.sub(r"(?m)^memory_bytes = \d+", "memory_bytes = 100000",
                           known_machine_files()["local-4"].read_text()).replace('"local-4"', '"small"'))
    path = _llama_config(tmp_path / "llama", False)
    argv = ["--model", path, "--grid", "1x2x2x1", "--batch", "4", "--microbatches", "2", "--seq", "16", "--dtype", "fp32",
            "--machine", str(toml), "--json",
            str(tmp_path / "dry.json")]
    code, out, warned = run_isolated(cli, argv, timeout_s=300)
    assert code == 1, out
    # a fake tensor has no memory address: parallelize's move_to_device does not ask for one (torch warns, and
    # would merge every fake buffer of one shape into one)
    assert not [w for w in warned if "data pointer" in w], warned
    assert re.search(r"perfmodel: not priced on small: memory .* usable", out), out      # it does not fit there
    assert re.search(r"activations +([\d.]+ KiB) +\1 +equal", out), out
    line = [x for x in out.splitlines() if x.startswith("DOES NOT FIT")]
    assert line and "perfmodel" in line[0] and "not modelled" not in out, out
    doc = json.loads((tmp_path / "dry.json").read_text())
    r = doc["ranks"][0]
    assert doc["config"]["family"] == "llama" and doc["config"]["kv_heads"] == 2 and doc["agree"]
    assert r["predicted_memory"]["activations"] == r["memory"]["activations"]
    assert r["predicted_memory"]["parameters"] == r["memory"]["parameters"] and not r["not_modelled"]
    assert abs(r["peak_bytes"] / r["predicted_peak_bytes"] - 1) <= PEAK_TOLERANCE
    assert r["comm_bytes"] == r["predicted_comm_bytes"]
