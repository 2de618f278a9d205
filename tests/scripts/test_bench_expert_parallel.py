"""experiments/bench/bench_expert_parallel.py on 4 real gloo ranks: a tiny Mixtral whose experts' weights,
gradients and AdamW moments pass a per-rank budget when every rank holds every expert (ep 1) stops at the
allocation that passes it, in one line, before its first step completes; with the experts over 4 ranks (ep 4) the
same budget holds it, its parameters fall by 3/4 of the experts', and it trains (every step's loss finite)."""
from __future__ import annotations

import math

import pytest

from helpers import load_script

pytest.importorskip("transformers")

SIZES = dict(layers=1, hidden=32, experts=8, ffn=128, top_k=2, vocab=64, seq=16, steps=2)
BUDGET = 1 << 20          # 1 MiB: the experts alone cost 8·3·32·128·4 B = 0.375 MiB, ×4 with gradient and moments


def rank_measure(ep: int, budget: int) -> dict:
    return load_script("bench/bench_expert_parallel.py").measure(ep, **SIZES, budget=budget, timeout=60)


def test_a_mixture_of_experts_over_budget_replicated_trains_under_ep(ranks):
    experts = 8 * 3 * 32 * 128 * 4
    replicated = ranks(4, rank_measure, 1, BUDGET)
    spread = ranks(4, rank_measure, 4, BUDGET)
    for r in replicated:
        assert not r["fits"] and r["losses"] == [] and r["error"].endswith(")") and "\n" not in r["error"], r
        assert "pass the budget of 1.0 MiB per rank" in r["error"] and r["expert_param_bytes"] == experts
        assert 4 * r["param_bytes"] > BUDGET          # weights, gradients and two moments pass it
    for r, rep in zip(spread, replicated):
        assert r["fits"] and len(r["losses"]) == 2 and all(math.isfinite(x) for x in r["losses"]), r
        assert r["expert_param_bytes"] * 4 == experts
        assert rep["param_bytes"] - r["param_bytes"] == experts * 3 // 4
        assert r["peak_bytes"] <= BUDGET
