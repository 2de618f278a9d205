"""The element-wise (HBM-bound) term of perfmodel: one formula (``compute.elementwise_bytes``) on both the 4D grids
and the TP×PP×DP stages, priced at the machine file's ``hbm_bandwidth``, absent (and said so) without it."""
from __future__ import annotations

from dataclasses import replace

import pytest

from axgrid import perfmodel as pm
from axgrid.perfmodel import pipeline as pl
from axgrid.perfmodel.compute import elementwise_bytes


def test_bytes_per_kernel():
    # 10 tokens, stream 8 wide, MLP 32 wide, 2 heads, S 4, fp16: LN 2·4b + residual adds 2·3b per stream element,
    # bias+GELU 2b per MLP element; dropout +2 bytes per stream element; unfused scores 4b (+2b+1 with dropout)
    stream, scores = elementwise_bytes(10, 8, 32, 2, 4, 2, dropout=False, fused_attention=True)
    assert float(stream) == 10 * 8 * (8 + 12) + 10 * 32 * 4 and float(scores) == 0
    stream, scores = elementwise_bytes(10, 8, 32, 2, 4, 2, dropout=True, fused_attention=False)
    assert float(stream) == 10 * 8 * (8 + 14) + 10 * 32 * 4 and float(scores) == 10 * 4 * 2 * 13


def test_both_sides_priced_alike_and_absent_without_hbm():
    m = pm.load_machine("dgx-a100")
    bare = replace(m, hbm_bandwidth=0.0)
    assert "not priced" in bare.elementwise_note() and "1800 GB/s" in m.elementwise_note()
    prob = pm.Problem(pm.get_model("gpt-5b"), 64, 32)
    # the 4D grid (1, t, 1, d) is the TP×PP×DP stage of PP 1: the same element-wise seconds
    four = pm.evaluate(prob, m, pm.Grids.of([(1, 8, 1, 4)]), microbatches=[16])
    tp = pl.price(prob, m, [pl.TPPPDP(8, 1, 4, mbs=1)])[0]
    assert tp.elementwise_s == pytest.approx(float(four.extra["elementwise"][0])) and tp.elementwise_s > 0
    assert float(pm.evaluate(prob, bare, pm.Grids.of([(1, 8, 1, 4)]), microbatches=[16]).extra["elementwise"][0]) == 0
    # without the host's floor (kernel_latency) the HBM terms add up: element-wise (in every slot, the bubble's too),
    # and the cross entropy and optimizer step, also priced at HBM bandwidth
    gpu, bare = replace(m, kernel_latency=0.0), replace(bare, kernel_latency=0.0)
    for a, b in zip(pl.price(prob, gpu, [pl.TPPPDP(8, 2, 2)]), pl.price(prob, bare, [pl.TPPPDP(8, 2, 2)])):
        assert b.elementwise_s == 0 and a.time_s - b.time_s >= a.elementwise_s * (1 + 1 / a.microbatches) > 0
    # sequence parallel splits the stream kernels over TP; a 4D grid with Gx > 1 splits them over x
    sp, no = pl.price(prob, m, [pl.TPPPDP(8, 2, 2, sp=True), pl.TPPPDP(8, 2, 2)])
    assert sp.elementwise_s < no.elementwise_s
    ev = pm.evaluate(prob, m, pm.Grids.of([(1, 2, 1, 16), (2, 1, 1, 16)]), microbatches=[4, 4])
    assert ev.extra["elementwise"][1] < ev.extra["elementwise"][0]


def test_recompute_and_unfused_attention():
    m = pm.load_machine("dgx-a100")
    base = pm.Problem(pm.get_model("gpt-5b"), 64, 32)
    unfused = replace(base, options=base.options.with_(fused_attention=False, dropout=True))
    full, sel, none = pl.price(unfused, m, [pl.TPPPDP(8, 2, 2, recompute=r) for r in ("full", "selective", "none")])
    assert none.elementwise_s < sel.elementwise_s < full.elementwise_s
    assert full.elementwise_s == pytest.approx(none.elementwise_s * 4 / 3)       # a 4th forward's worth
    fused = pl.price(base, m, [pl.TPPPDP(8, 2, 2, recompute="selective")])[0]
    assert fused.elementwise_s < sel.elementwise_s                               # no S×S traffic with flash


def test_rank_says_how_elementwise_is_priced(capsys):
    from axgrid.perfmodel.cli import main
    assert main(["rank", "--model", "gpt-tiny", "--gpus", "4", "--machine", "local-4", "--batch", "8",
                 "--top", "3"]) == 0
    assert "element-wise kernels not priced: local-4 has no hbm_bandwidth" in capsys.readouterr().out
    assert main(["rank", "--model", "gpt-5b", "--gpus", "32", "--machine", "perlmutter", "--batch", "64",
                 "--grid", "2x2x2x4"]) == 0
    assert "element-wise kernels priced at HBM 1555 GB/s" in capsys.readouterr().out
