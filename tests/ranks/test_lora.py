"""LoRA on the 3D Linear against PEFT on the serial transformers model: loss, logits and two SGD updates of every
adapter parameter (lr · its gradient) agree on every grid of 4 ranks and on 2x2x2x1, for Llama (untied and tied),
Qwen3 and Phi-3's fused projections, under every overlap and zero 0/1/2 (hypothesis picks the cases: a bounded
number by default, many more with ``AXGRID_DEEP=1``; :mod:`helpers.lora_reference`). The frozen base posts no
reduce-scatter over z and holds no gradient; the reduction over d carries the adapters only."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from axgrid.spec.layout import all_shapes
import torch

from helpers.lora_reference import (MODELS, Case, bad_inputs, checkpoint_adapters, dropout_replicas, lora_differences,
                                    peft_format_round_trip)

pytest.importorskip("peft")

DEEP = bool(os.environ.get("AXGRID_DEEP"))
GRIDS4 = [str(s) for s in all_shapes(4)]
OVERLAPS = ("none", "oar", "ors", "oag", "odp", "keep", "all")
TOL = 1e-4


def _check(ranks, case: Case) -> None:
    world = 8 if case.grid == "2x2x2x1" else 4
    for r, out in enumerate(ranks(world, lora_differences, case)):
        assert all(v < TOL for v in out["worst"].values()), (case, r, out)
        assert out["rs_z"] == 0 and out["frozen_grads"] == 0, (case, r, out)   # the base: no gradient at all
        if case.grid.endswith("x1"):
            continue
        # over d: the adapters' gradients (fp32) and, with zero >= 1, their all-gather -- nothing of the base
        assert out["d_bytes"] <= 3 * out["trained_bytes"] + 4096, (case, r, out)


@st.composite
def cases(draw, grids):
    grid = draw(st.sampled_from(grids))
    zero = draw(st.sampled_from([0, 1, 2])) if not grid.endswith("x1") else 0
    return Case(draw(st.sampled_from(sorted(MODELS))), grid, draw(st.sampled_from(OVERLAPS)), zero,
                draw(st.integers(0, 2 ** 10)))


def test_lora_equals_peft_on_4_rank_grids(ranks):
    @settings(max_examples=300 if DEEP else 16, deadline=None, derandomize=not DEEP, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=cases(GRIDS4))
    def run(case):
        _check(ranks, case)
    run()


@pytest.mark.parametrize("case", [
    Case("phi3", "1x2x2x1", "all"),          # fused rows over y, adapters' gradients through the ORS pipeline
    Case("llama-tied", "2x1x1x2", "odp", 2),  # A over x, B replicated over x; zero=2 buckets of the adapters only
    Case("qwen3", "1x1x2x2", "all", 1),      # tokens over z and d: both reductions of the adapters' gradients
], ids=str)
def test_lora_equals_peft_named(ranks, case):
    _check(ranks, case)


@pytest.mark.slow
def test_lora_equals_peft_on_2x2x2x1(ranks):
    for kind in sorted(MODELS):
        _check(ranks, Case(kind, "2x2x2x1", "all"))


def test_peft_format_both_ways_and_merge(ranks, tmp_path):
    """A PEFT-saved adapter loads into axgrid, axgrid's saved adapter loads into PEFT, and the merged model and its
    export give PEFT's logits (Phi-3: the fused B's rows through the row map, over y)."""
    for out in ranks(4, peft_format_round_trip, "1x2x2x1", str(tmp_path)):
        assert {"adapter_config.json", "adapter_model.safetensors"} <= set(out["files"]), out
        assert out["trainable_after_merge"] == 0, out
        assert all(out[k] < 1e-5 for k in ("loaded", "peft_loads_ours", "merged", "exported")), out


def test_bad_lora_input_names_the_value_on_every_rank(ranks, tmp_path):
    for msgs in ranks(2, bad_inputs, "1x2x1x1", str(tmp_path)):
        assert all("\n" not in m for m in msgs), msgs
        target, r, shape, base = msgs
        assert "'qq_proj'" in target and "matches no module" in target, target
        assert "r=0" in r, r
        assert "k_proj.lora_B.weight" in shape and "(32, 4)" in shape and "(16, 4)" in shape, shape
        assert "gate_up_proj" in base and "another base model" in base, base


def test_checkpoint_holds_the_adapters_only_and_reshards(ranks, tmp_path):
    """Saved on 1x2x1x2 (zero=1: AdamW state in pieces over d), loaded on 2x1x2x1: the same dense adapters, and
    the checkpoint holds the adapters and their optimizer state, nothing of the frozen base."""
    saved = ranks(4, checkpoint_adapters, "1x2x1x2", str(tmp_path), True)[0]
    loaded = ranks(4, checkpoint_adapters, "2x1x2x1", str(tmp_path), False)[0]
    assert sorted(saved["adapters"]) == sorted(loaded["adapters"])
    for n, t in saved["adapters"].items():
        assert torch.equal(t, loaded["adapters"][n]), n
    model = sorted(n for n in saved["held"] if n.startswith("model/"))
    assert model == sorted("model/" + n for n in saved["adapters"]), model        # no frozen base tensor
    assert all(".lora." in n.split("/")[1] for n in saved["held"] if n.startswith("optim/")), saved["held"]


def test_dropout_masks_agree_across_the_ranks_that_share_an_input(ranks):
    """Dropout 0.5 on 2x2x1x1 (A replicated over y for normal layers, over x for transposed ones): after two SGD steps
    every adapter's replicas are equal; with per-rank RNG seeds (masks drawn independently) they drift."""
    for out in ranks(4, dropout_replicas, "2x2x1x1"):
        assert out["drifted 0.0"] == [] and out["drifted 0.5"] == [] and out["changed"] > 1e-3, out
    for out in ranks(4, dropout_replicas, "2x2x1x1", False):
        assert any(".lora." in n for n in out["drifted 0.5"]), out
