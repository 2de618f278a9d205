"""perfmodel's mixture-of-experts terms (``axgrid.perfmodel.moe``) against hand formulas written here from the
layout (EP a split of d, uniform routing), over generated shapes and grids; rank's EP sizes; the one-line refusals
of an EP size that does not divide Gd or the experts and of top-k larger than the experts."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from axgrid import perfmodel as pm
from axgrid.perfmodel.cli import main
from axgrid.perfmodel.moe import all_to_all_bytes, moe_flops
from axgrid.spec import PUBLIC_MODELS, TransformerShape

DEEP = bool(os.environ.get("AXGRID_DEEP"))
H100 = pm.load_machine("dgx-h100")


@st.composite
def moe_problems(draw):
    """A small Mixtral-like or Qwen3-MoE-like shape, a grid of 16 ranks, an EP size dividing Gd and the experts, a
    batch every split divides."""
    family = draw(st.sampled_from(["mixtral", "qwen3_moe", "olmoe"]))
    experts = draw(st.sampled_from([2, 4, 8, 16]))
    top_k = draw(st.integers(1, experts))
    kv = draw(st.sampled_from([2, 4]))
    heads, head_dim = 4 * kv, draw(st.sampled_from([16, 32]))
    extra = {"head_dim": head_dim, "head_norms": True} if family == "qwen3_moe" else {}
    if family == "olmoe":
        extra = {"head_norms": True}
    shape = TransformerShape("m", draw(st.integers(1, 4)), heads * head_dim, heads, 64, 256, bias=False,
                             ffn=draw(st.sampled_from([64, 128])), family=family, kv_heads=kv, experts=experts,
                             top_k=top_k, expert_ffn=draw(st.sampled_from([32, 64, 96])),
                             norm_topk_prob=family == "mixtral", **extra)
    gx, gy, gz = (draw(st.sampled_from([1, 2])) for _ in range(3))
    gd = 16 // (gx * gy * gz)
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8, 16) if gd % e == 0 and experts % e == 0]))
    return shape, (gx, gy, gz, gd, ep), draw(st.booleans()), draw(st.sampled_from([0, 1, 2]))


@settings(max_examples=300 if DEEP else 12, deadline=None)
@given(case=moe_problems())
def test_flops_all_to_all_bytes_and_expert_memory_by_hand(case):
    spec, (gx, gy, gz, gd, ep), recompute, zero = case
    batch, mb = 64, 2
    prob = pm.Problem(spec, batch, 16, "bf16", pm.Options(recompute=recompute, microbatches=mb, zero=zero or 0))
    ev = pm.evaluate(prob, H100, pm.Grids.of([(gx, gy, gz, gd, ep)]))
    h, f, E, k, L = spec.hidden, spec.expert_ffn, spec.experts, spec.top_k, spec.layers
    tokens = batch * spec.seq
    # FLOPs: each token through k experts' three [f, h] matrices and the router [E, h], 2 per multiply-add,
    # forward + 2 backward (+ 1 recompute)
    passes = 3 + int(recompute)
    assert moe_flops(spec, tokens, recompute) == 2 * passes * tokens * L * (k * 3 * h * f + E * h)
    # the all-to-alls: per micro-batch and MoE layer dispatch + combine forward, the same backward, again with
    # recompute; each sends (ep-1)/ep of a rank's m'·k token copies, h/Gx features of 2 bytes
    m = batch // mb * spec.seq // (gd * gz)
    per_call = (ep - 1) / ep * m * k * (h // gx) * 2
    calls = mb * L * (4 + 2 * int(recompute))
    assert ev.extra["all_to_all_bytes"][0] == pytest.approx(calls * per_call, rel=1e-12)
    assert all_to_all_bytes(spec, gx, m, ep, 2) == pytest.approx(per_call, rel=1e-12)
    assert (ev.extra["all_to_all"][0] > 0) == (ep > 1)
    # the experts' fp32 parameters on a rank: E/ep experts of three [f, h] blocks split over x, y and z; the same
    # grid without EP holds all E
    expert = L * 3 * (h // gx) * (f // gy) // gz
    whole = pm.evaluate(prob, H100, pm.Grids.of([(gx, gy, gz, gd, 1)]))
    assert float(whole.memory.params[0]) - float(ev.memory.params[0]) == 4 * expert * (E - E // ep)


def test_rank_tries_every_ep_size_and_the_rows_say_it():
    """Mixtral-8x7B on 64 H100s: grids with Gd = 64 appear with ep 1, 2, 4, 8 (the divisors of 64 that divide 8
    experts), each a row of its own; the 8-way EP of a d of 64 rows reads ``/ep8``."""
    spec = PUBLIC_MODELS["mixtral-8x7b"]
    rk = pm.rank(pm.Problem(spec, 512, 64, "bf16", pm.Options(zero=None)), H100)
    assert {r.ep for r in rk.rows if r.grid == (1, 1, 1, 64)} == {1, 2, 4, 8}
    assert any(r.ep > 1 for r in rk.feasible[:20])
    assert "1x1x1x64/ep8" in {r.grid_str for r in rk.rows}
    assert not rk.megatron                                      # TP×PP×DP is not priced for a MoE


def test_expert_parallel_sheds_expert_memory_and_pays_all_to_alls():
    """Qwen3-30B-A3B on one 64-way d: each doubling of ep halves the experts a rank holds (static memory falls)
    and sends more of each all-to-all off the rank ((ep−1)/ep)."""
    spec = PUBLIC_MODELS["qwen3-30b-a3b"]
    prob = pm.Problem(spec, 512, 64, "bf16", pm.Options(zero=1, microbatches=4))
    ev = pm.evaluate(prob, H100, pm.Grids.of([(1, 1, 1, 64, e) for e in (1, 2, 4, 8, 16)]))
    static = ev.memory.static
    assert all(np.diff(static) < 0)
    sent = ev.extra["all_to_all_bytes"]
    assert sent[0] == 0 and all(np.diff(sent) > 0)
    assert sent[2] / sent[1] == pytest.approx((3 / 4) / (1 / 2))


def one_line_error(args, capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    return err


def test_bad_ep_and_bad_top_k_are_refused_in_one_line(tmp_path, capsys):
    base = ["rank", "--model", "mixtral-8x7b", "--gpus", "64", "--machine", "dgx-h100", "--batch", "512"]
    err = one_line_error(base + ["--grid", "1x1x2x32", "--ep", "3"], capsys)
    assert "ep=3 does not divide Gd=32" in err and "experts 8 not divisible by ep=3" in err
    err = one_line_error(base + ["--grid", "1x1x1x64", "--ep", "16"], capsys)
    assert "experts 8 not divisible by ep=16" in err
    config = PUBLIC_MODELS["mixtral-8x7b"].hf_config()
    config["num_experts_per_tok"] = 9
    (tmp_path / "config.json").write_text(json.dumps(config))
    err = one_line_error(["rank", "--config", str(tmp_path / "config.json"), "--gpus", "64", "--machine",
                          "dgx-h100", "--batch", "512"], capsys)
    assert "top_k=9 experts per token is more than the 8 experts" in err


def test_a_grid_with_ep_prices_and_explains(capsys):
    assert main(["rank", "--model", "qwen3-30b-a3b", "--gpus", "64", "--machine", "dgx-h100", "--batch", "512",
                 "--grid", "1x1x1x64", "--ep", "8"]) == 0
    out = capsys.readouterr().out
    assert "1x1x1x64/ep8" in out and "each rank holds 16" in out


@settings(max_examples=300 if DEEP else 12, deadline=None)
@given(case=moe_problems(), keep=st.booleans())
def test_the_time_models_bytes_per_dimension_equal_the_step_replay(case, keep):
    """``evaluate``'s bytes per grid dimension (summed term by term) equal the step replay's events
    (``perfmodel.step.step_collective_events``, posted one by one) for a mixture of experts with EP: the dense part, the
    experts' collectives, the all-to-alls and the expert gradients over their replicas."""
    from axgrid.perfmodel.step import step_collective_events
    spec, (gx, gy, gz, gd, ep), recompute, zero = case
    if zero and gd == 1:
        return
    batch, mb = 64, 2
    opt = pm.Options(recompute=recompute, microbatches=mb, zero=zero, keep_gathered=keep)
    ev = pm.evaluate(pm.Problem(spec, batch, 16, "bf16", opt), H100, pm.Grids.of([(gx, gy, gz, gd, ep)]))
    events = step_collective_events(spec, (gx, gy, gz, gd), batch // mb * spec.seq, mb, 2, keep, recompute,
                                    opt.grad_bytes, opt.bucket_bytes, zero, clip=opt.clip, ep=ep)
    within = {"d": ("d", "e", "r")}     # the expert-parallel group "e" and the replica group "r" are parts of d
    for d in ("x", "y", "z", "d", "xyz"):
        assert ev.step_bytes[d][0] == pytest.approx(sum(n for dd, _, n in events if dd in within.get(d, (d,))),
                                                    rel=1e-12), d
    # the ledger counts an all-to-all's whole send buffer (the dispatch's in the fp32 stream, the combine's in bf16,
    # the counts' E int64 per forward); the time prices what leaves the rank, (ep-1)/ep of the rows' buffers
    mprime = batch // mb * spec.seq // (gd * gz)
    fp32, computed = mprime * spec.top_k * (spec.hidden // gx) * 4, mprime * spec.top_k * (spec.hidden // gx) * 2
    forwards, backwards = mb * spec.layers * (1 + int(recompute)), mb * spec.layers
    ledger = forwards * (fp32 + computed + spec.experts * 8) + backwards * (fp32 + computed)
    assert sum(n for _, op, n in events if op == "all_to_all") == (ledger if ep > 1 else 0)
    calls = 2 * (forwards + backwards)
    assert ev.extra["all_to_all_bytes"][0] == pytest.approx((ep - 1) / ep * calls * computed, rel=1e-12)


#: the commands docs/perfmodel.md and docs/results.md print the figures of (the arguments after ``rank``), and a
#: line of output each prints
DOCUMENTED_RANKS = {
    "--model mixtral-8x7b --gpus 64 --machine dgx-h100 --batch 512 --layouts 4d --top 5": "1x1x8x8 zero2",
    "--model qwen3-30b-a3b --gpus 64 --machine dgx-h100 --batch 512 --layouts 4d --top 5": "1x1x1x64/ep8 zero1",
    "--model mixtral-8x7b --gpus 64 --machine frontier --batch 512 --layouts 4d --top 5": "1x1x16x4 zero2",
    "--model qwen3-30b-a3b --gpus 64 --machine frontier --batch 512 --layouts 4d --top 5": "1x1x2x32/ep4 zero1",
    "--model qwen3-30b-a3b --gpus 8 --machine dgx-h100 --batch 512 --microbatches 16 --zero 2 --grid 1x1x1x8 --ep 8":
        "memory 97.7 GiB > 72.0 GiB",
}


@pytest.mark.parametrize("args", list(DOCUMENTED_RANKS))
def test_the_documented_moe_rankings(args, capsys):
    assert main(["rank", *args.split()]) == 0
    out = capsys.readouterr().out
    assert DOCUMENTED_RANKS[args] in out
    if "--grid" not in args:                       # the best row is the one the docs name
        first = next(line for line in out.splitlines() if line.replace(" ", "").startswith("│1│"))
        assert DOCUMENTED_RANKS[args] in first
