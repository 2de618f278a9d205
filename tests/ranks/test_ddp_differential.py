"""axgrid's data parallelism against PyTorch's DDP, generated: random small models from a vocabulary of training
patterns (a per-d-rank branch, a Linear called twice, a frozen and an unused Linear, tied weights, a bf16 Linear,
two optimizer groups) trained for 3 steps under a random schedule (micro-batches with or without ``no_sync``,
``model.zero_grad()`` or the optimizer's, clipping) on 1x1x1x2, 1x1x2x2 and 2x1x1x2 for every ``zero`` and overlap,
and under ``DistributedDataParallel(find_unused_parameters=True)`` + the same torch optimizer on the same ranks:
the parameters agree after every step (:mod:`helpers.ddp_reference`). A bounded number of examples by default;
``AXGRID_DEEP=1`` runs 500 in all. The five patterns that once went wrong, and the replica race, are named cases."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from helpers.ddp_reference import Case, Recipe, Step, compare_with_ddp

GRIDS = ("1x1x1x2", "1x1x2x2", "2x1x1x2")
OVERLAPS = ("none", "oar", "ors", "oag", "odp", "keep", "all")
DEEP = bool(os.environ.get("AXGRID_DEEP"))
EXAMPLES = {"1x1x1x2": 8, "1x1x2x2": 5, "2x1x1x2": 5} if not DEEP else {"1x1x1x2": 200, "1x1x2x2": 150,
                                                                           "2x1x1x2": 150}


def _world(spec: str) -> int:
    n = 1
    for v in spec.split("x"):
        n *= int(v)
    return n


steps = st.builds(Step, micro=st.integers(1, 3), no_sync=st.booleans(), zero_grad=st.sampled_from(["model", "opt"]),
                  clip=st.sampled_from([0.0, 0.0, 0.5]),
                  branch=st.tuples(st.booleans(), st.booleans()))
recipes = st.builds(Recipe, twice=st.booleans(), branch=st.booleans(), frozen=st.booleans(), unused=st.booleans(),
                    tied=st.booleans(), mixed=st.booleans(), groups=st.booleans(), seed=st.integers(0, 2**16))


def _check(ranks, case: Case) -> None:
    per_rank = ranks(_world(case.grid), compare_with_ddp, case)
    errors = [f"rank {r}: {e}" for r, bad in enumerate(per_rank) for e in bad]
    assert not errors, f"{case}\n" + "\n".join(errors[:20])


@pytest.mark.parametrize("spec", GRIDS)
def test_axgrid_trains_as_ddp(ranks, spec):
    # no shrinking: each example runs ranks for seconds; a failure prints the example as drawn
    @settings(max_examples=EXAMPLES[spec], deadline=None, derandomize=not DEEP, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(zero=st.sampled_from([0, 1, 2]), overlap=st.sampled_from(OVERLAPS), recipe=recipes,
           schedule=st.tuples(steps, steps, steps))
    def run(zero, overlap, recipe, schedule):
        _check(ranks, Case(spec, zero, overlap, recipe, schedule))
    run()


# -- the patterns that once gave silently wrong training (each failed on 0c7c76d) -------------------------------
ONE, BOTH = (True, False), (True, True)
NAMED = {
    # a parameter used on only some d-ranks: buckets reduced in another order on each rank
    "branch-odp": Case("1x1x1x2", 0, "odp", Recipe(branch=True), (Step(branch=ONE),) * 3),
    "branch-zero2": Case("1x1x1x2", 2, "none", Recipe(branch=True), (Step(branch=ONE),) * 3),
    # several backwards in one step without no_sync, zero=1 with ODP
    "extra-backward-zero1-odp": Case("1x1x1x2", 1, "odp", Recipe(), (Step(micro=2, no_sync=False),) * 3),
    # zero=2 and model.zero_grad()
    "model-zero-grad-zero2": Case("1x1x1x2", 2, "none", Recipe(), (Step(zero_grad="model"),) * 3),
    # one Linear used twice with ORS + ODP, and with zero=2
    "twice-all": Case("1x1x2x2", 0, "all", Recipe(twice=True)),
    "twice-zero2-all": Case("1x1x2x2", 2, "all", Recipe(twice=True)),
    # a parameter no rank used: AdamW must skip it (no decay)
    "unused-adamw": Case("1x1x1x2", 0, "none", Recipe(unused=True)),
    "unused-adamw-zero1": Case("1x1x1x2", 1, "odp", Recipe(unused=True)),
    "branch-nobody-zero2": Case("1x1x1x2", 2, "odp", Recipe(branch=True), (Step(branch=(False, False)),) * 3),
}


@pytest.mark.parametrize("name", NAMED)
def test_named_pattern_trains_as_ddp(ranks, name):
    _check(ranks, NAMED[name])
