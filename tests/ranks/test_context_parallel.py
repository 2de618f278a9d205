"""Context-parallel attention equals serial ``scaled_dot_product_attention``, forward and backward (dq, dk, dv), within
fp32 round-off: causal, GQA, with and without a sliding window, keys and values all-gathered or passed around a
ring, rotary at each chunk's own positions (transformers' Llama rotary), on real gloo ranks of 2 and 4
(context-parallel groups inside z, inside d, across z and d, beside x and y; 8 too with ``AXGRID_DEEP=1``), over
cases generated with hypothesis (sequence length through the chunk size, heads, key-value heads, head size, window,
exchange). A bounded number of examples by default (28); ``AXGRID_DEEP=1`` runs 360. :mod:`helpers.cp_reference`
computes both sides on each rank."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from axgrid.spec import GridShape
from helpers.cp_reference import AttentionCase, attention_differences, loss_differences

DEEP = bool(os.environ.get("AXGRID_DEEP"))
#: (grid, cp): the group inside z; inside d; two groups side by side in z; one across z and d; beside x and y.
#: With AXGRID_DEEP=1 also 8 ranks: a group of 8 across z and d, and groups of 4 beside x.
LAYOUTS = (("1x1x2x1", 2), ("1x1x1x2", 2), ("1x1x4x1", 4), ("1x1x2x2", 2), ("1x1x2x2", 4), ("2x1x2x1", 2),
           ("1x2x1x2", 2)) + ((("1x1x2x4", 8), ("2x1x2x2", 4)) if DEEP else ())
EXAMPLES = 4 if not DEEP else 40            # per layout: 28 in CI, 360 deep
TOL = 2e-5                                  # fp32 round-off, relative to (1 + the reference's largest magnitude)


def _world(spec: str) -> int:
    return GridShape.parse(spec).size


@st.composite
def cases(draw, grid: str, cp: int) -> AttentionCase:
    chunk = draw(st.integers(1, 6))
    seq = 2 * cp * chunk
    window = draw(st.one_of(st.none(), st.integers(1, seq + 2)))
    return AttentionCase(grid, cp, batch=draw(st.integers(1, 2)), kv_heads=draw(st.integers(1, 3)),
                         group=draw(st.integers(1, 3)), chunk=chunk, head_dim=draw(st.sampled_from([2, 4, 8])),
                         window=window, rotary=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
                         exchange=draw(st.sampled_from(["all_gather", "ring"])))


def _check(ranks, case: AttentionCase) -> None:
    per_rank = ranks(_world(case.grid), attention_differences, case)
    bad = [f"rank {r}: {name} differs by {d[name]:.3g}" for r, d in enumerate(per_rank)
           for name in ("out", "dq", "dk", "dv") if not d[name] <= TOL * (1 + d["scale"])]
    assert not bad, f"{case}\n" + "\n".join(bad)
    # only the key-value heads travel: forward all-gather [cp, 2, b, H_kv, 2c, d], backward its reduce-scatter; or
    # blocks [2, b, H_kv, 2c, d] sent and received cp-1 times forward, cp-1 times backward with cp gradient blocks
    kv = 2 * case.batch * case.kv_heads * case.seq * case.head_dim * 4
    want = 2 * kv if case.exchange == "all_gather" else (4 * (case.cp - 1) + 2 * case.cp) * kv // case.cp
    assert all(d["ledger_c_bytes"] == want for d in per_rank), (case, want, [d["ledger_c_bytes"] for d in per_rank])


@pytest.mark.parametrize("grid,cp", LAYOUTS, ids=[f"{g}-cp{c}" for g, c in LAYOUTS])
def test_attention_equals_serial_sdpa(ranks, grid, cp):
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=not DEEP, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=cases(grid, cp))
    def run(case):
        _check(ranks, case)
    run()


@pytest.mark.parametrize("exchange", ["all_gather", "ring"])
def test_a_window_of_one_token_and_the_longest_reach(ranks, exchange):
    """The edges: each query sees only itself; a window wider than the sequence is plain causal attention."""
    for window in (1, 10_000):
        _check(ranks, AttentionCase("1x1x4x1", 4, batch=1, kv_heads=2, group=2, chunk=3, head_dim=4,
                                    window=window, rotary=True, seed=7, exchange=exchange))


@pytest.mark.parametrize("exchange", ["all_gather", "ring"])
def test_a_group_across_z_and_d_in_a_rank_order_with_d_first(ranks, exchange):
    """Order "xydz": the group's chunk order (z + Gz·d) is not its ranks' order; the communicator's (global rank
    order) is what the chunks follow."""
    _check(ranks, AttentionCase("1x1x2x2", 4, batch=1, kv_heads=2, group=2, chunk=2, head_dim=4, window=5,
                                rotary=True, seed=11, exchange=exchange, order="xydz"))


@pytest.mark.parametrize("grid,cp", [("1x1x2x1", 2), ("1x1x2x2", 4)])
def test_the_loss_is_the_mean_over_whole_sequences(ranks, grid, cp):
    """whole_sequence_mean over the chunks equals the serial masked mean, its gradient the serial one's rows."""
    for got, want, grad_diff in ranks(_world(grid), loss_differences, grid, cp, 3):
        assert abs(got - want) <= 1e-6 * (1 + abs(want)) and grad_diff <= 1e-7, (got, want, grad_diff)
