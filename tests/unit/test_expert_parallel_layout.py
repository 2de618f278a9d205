"""The expert-parallel layout (``RankLayout(ep=...)``, :mod:`axgrid.spec.layout`): over every small grid, rank order
and ep that divides Gd, the expert-parallel groups ("e") and the expert-replica groups ("r") partition the ranks,
each "e" group holds one x·y·z position and a block of ep consecutive d indices, each "r" group the d indices of one
residue mod ep, and an "e" and an "r" group meet in exactly one rank (so every expert has Gd/ep replicas and every
rank sees each expert once). Refusals (ep not dividing Gd, experts not divisible by ep, top-k above the experts) are
one line naming the fix."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from axgrid.expert_parallel import check_moe
from axgrid.spec.layout import GridError, GridShape, RankLayout


@st.composite
def layouts(draw) -> RankLayout:
    shape = GridShape(*(draw(st.sampled_from([1, 2])) for _ in range(3)), draw(st.sampled_from([1, 2, 4, 6])))
    ep = draw(st.sampled_from([e for e in range(1, shape.gd + 1) if shape.gd % e == 0]))
    order = "".join(draw(st.permutations("xyzd")))
    return RankLayout(shape, order, ep=ep)


@settings(max_examples=25, deadline=None)
@given(layout=layouts())
def test_expert_groups_partition_the_ranks_inside_d(layout):
    n, ep = layout.shape.size, layout.ep
    for groups, size in ((layout.ep_groups(), ep), (layout.replica_groups(), layout.shape.gd // ep)):
        members = sorted(r for g in groups for r in g)
        assert members == list(range(n)) and all(len(g) == size for g in groups)
    for r in range(n):
        c = layout.coord(r)
        e, rep = layout.ep_group_of(r), layout.replica_group_of(r)
        assert e in layout.ep_groups() and rep in layout.replica_groups()
        for q in e:
            o = layout.coord(q)
            assert (o.x, o.y, o.z) == (c.x, c.y, c.z) and o.d // ep == c.d // ep
        for q in rep:
            o = layout.coord(q)
            assert (o.x, o.y, o.z) == (c.x, c.y, c.z) and o.d % ep == c.d % ep
        assert set(e) & set(rep) == {r}
        assert e.index(r) == c.d % ep == sorted(e).index(r)        # a process group orders members by rank


def test_ep_that_does_not_divide_gd_is_refused_in_one_line():
    with pytest.raises(GridError) as err:
        RankLayout(GridShape(1, 1, 1, 4), ep=3)
    assert str(err.value) == ("expert-parallel size ep=3 does not divide Gd=4 of grid 1x1x1x4: the experts are spread "
                              "over the data-parallel ranks; choose ep in [1, 2, 4]")


@pytest.mark.parametrize("experts,top_k,ep,says", [
    (6, 2, 4, "6 experts do not divide over the expert-parallel size ep=4; choose ep in [1, 2, 3, 6] that also divides Gd"),
    (4, 5, 2, "top-k=5 experts per token but the model has 4 experts; choose num_experts_per_tok in 1..4"),
])
def test_bad_moe_sizes_are_refused_in_one_line(experts, top_k, ep, says):
    with pytest.raises(ValueError) as err:
        check_moe(experts, top_k, ep, "model.layers.0.mlp")
    assert str(err.value) == f"model.layers.0.mlp: {says}" and "\n" not in str(err.value)


def test_groups_match_the_brief_on_four_ranks():
    lay = RankLayout(GridShape(1, 1, 1, 4), ep=2)
    assert lay.ep_groups() == [[0, 1], [2, 3]] and lay.replica_groups() == [[0, 2], [1, 3]]
    lay = RankLayout(GridShape(2, 1, 1, 2), ep=2)
    assert lay.ep_groups() == [[0, 2], [1, 3]] and lay.replica_groups() == [[0], [1], [2], [3]]
    assert list(itertools.chain(*RankLayout(GridShape(1, 1, 1, 4), ep=4).ep_groups())) == [0, 1, 2, 3]
