"""perfmodel's context parallelism (axgrid/perfmodel/context_parallel.py) against the runtime's own chunks and masks
(axgrid.context_parallel: which rows a rank holds, the keys each chunk's SDPA call is given) and the serial causal
count: the attention work it prices is the rectangles the runtime computes, the same on every rank (the causal
balance), and the pairs that count add up to the serial causal attention's; ``rank --cp auto`` ranks CP sizes with
their rows; bad sizes are refused in one line. The ledger's bytes and the saved activations are compared with the
dry run in tests/ranks/test_dryrun_context_parallel.py."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from axgrid import perfmodel as pm
from axgrid.context_parallel.attention import chunk_mask, visible_keys
from axgrid.context_parallel.chunks import chunk_ids
from axgrid.perfmodel import context_parallel as cpm
from axgrid.spec import PUBLIC_MODELS, TransformerShape


@settings(max_examples=30, deadline=None)
@given(cp=st.sampled_from([1, 2, 3, 4, 8]), c=st.integers(1, 6), window=st.one_of(st.none(), st.integers(1, 40)))
def test_priced_rectangles_are_the_runtimes_and_cover_causal_attention(cp, c, window):
    seq = 2 * cp * c
    spec = replace(TransformerShape.named("gpt-tiny"), seq=seq)
    widths = cpm.visible_widths(spec, cp, window)
    counted = 0
    for r in range(cp):
        for chunk, w in zip(chunk_ids(cp, r), widths[r]):
            lo, hi = visible_keys(chunk, c, window)
            assert w == hi - lo                                     # the keys the runtime's SDPA call is given
            counted += int(chunk_mask(chunk, c, window, torch.device("cpu")).sum())
    q = torch.arange(seq)[:, None]
    k = torch.arange(seq)[None, :]
    serial = (k <= q) & ((q - k < window) if window is not None else True)
    assert counted == int(serial.sum())                            # every visible pair once, over the group
    if window is None and cp > 1:                                  # the causal balance: the same work on every rank
        assert {sum(w) for w in widths} == {(2 * cp + 1) * c}
        assert cpm.computed_keys(spec, cp) == (2 * cp + 1) * c


def test_only_the_key_value_heads_travel_and_the_bytes_follow_the_exchange():
    spec = replace(PUBLIC_MODELS["llama-3.1-8b"], seq=131072)             # 32 heads, 8 key-value heads of 128
    mprime = 16384
    block = 2 * mprime * 8 * 128 * 4                                    # fp32 keys and values (rotary promotes)
    assert cpm.kv_block_bytes(spec, 1, mprime, 2) == block
    assert cpm.kv_block_bytes(spec, 2, mprime, 2) == block / 2          # the heads split over y
    ag = cpm.step_events(spec, 1, mprime, 1, 2, 8, "all_gather", recompute=True)
    assert [e for e in ag[:1]] == [("c", "all_gather", 8 * block)]
    assert sum(op == "all_gather" for _, op, _ in ag) == 2 * spec.layers   # forward and the recompute forward
    assert sum(op == "reduce_scatter" for _, op, _ in ag) == spec.layers
    for exchange in ("all_gather", "ring"):
        for recompute in (False, True):
            ev = cpm.step_events(spec, 1, mprime, 2, 2, 8, exchange, recompute)
            assert sum(nb for *_, nb in ev) == 2 * cpm.cp_bytes(spec, 1, mprime, 2, 8, exchange, recompute)
    assert cpm.step_events(spec, 1, mprime, 1, 2, 1) == []


def test_rank_searches_context_parallel_sizes_and_names_them():
    spec = replace(PUBLIC_MODELS["llama-3.1-8b"], seq=32768)
    prob = pm.Problem(spec, 4, 16, "bf16", pm.Options(zero=0))
    rk = pm.rank(prob, pm.load_machine("dgx-h100"), tp_pp_dp=False, cp_sizes=[1, 4])
    cps = {r.cp for r in rk.feasible}
    assert {1, 4} <= cps
    row = next(r for r in rk.feasible if r.cp == 4)
    assert row.config_str.endswith("+cp4") and row.grid[2] % 4 == 0
    assert row.step_bytes["c"] > 0 and "c" in row.exposed_s
    assert [r.rank for r in rk.feasible] == list(range(1, len(rk.feasible) + 1))
    assert all(a.time_s <= b.time_s for a, b in zip(rk.feasible, rk.feasible[1:]))


def test_bad_sizes_are_refused_in_one_line():
    spec = replace(PUBLIC_MODELS["llama-3.1-8b"], seq=131070)
    with pytest.raises(pm.PerfModelError, match=r"does not cut into 2·cp = 8 equal chunks.*multiple of 8"):
        cpm.check(spec, 4)
    with pytest.raises(pm.PerfModelError, match="all-gathers"):
        cpm.check(replace(spec, seq=131072), 4, "ring")
    from axgrid.dryrun import DryRunError, resolve
    with pytest.raises(DryRunError, match=r"cp=4 does not divide Gz=2"):
        resolve("llama-3.1-8b", None, 8, grid="1x1x2x4", seq=131072, machine="dgx-h100", cp=4)
