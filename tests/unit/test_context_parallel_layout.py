"""Where the context-parallel group sits (axgrid.spec.layout) and which tokens each of its ranks holds
(axgrid.context_parallel.chunks), checked as properties over generated grids and sequences (no ranks)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from axgrid.context_parallel import check_sequence, positions, shard, unshard
from axgrid.spec.layout import GridError, GridShape, RankLayout, check_cp, cp_sizes


@st.composite
def layouts(draw) -> RankLayout:
    shape = GridShape(*(draw(st.integers(1, 3)) for _ in range(2)), draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    order = "".join(draw(st.permutations("xyzd")))
    return RankLayout(shape, order, draw(st.sampled_from(cp_sizes(shape))))


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_cp_groups_split_the_token_plane(lay: RankLayout):
    """The groups partition the ranks; a group's members share x and y (they hold the same heads and features),
    are listed in global rank order (a process group's order, which the communicator's indices follow), each knows
    its place, and a group lies inside one z-group or is made of whole z-groups."""
    groups = lay.cp_groups()
    assert sorted(r for g in groups for r in g) == list(range(lay.shape.size))
    zgroups = [set(g) for g in lay.groups("z")]
    for g in groups:
        assert len(g) == lay.cp and g == sorted(g)
        coords = [lay.coord(r) for r in g]
        assert len({(c.x, c.y) for c in coords}) == 1
        assert [lay.cp_index(r) for r in g] == list(range(lay.cp))
        assert all(lay.cp_group_of(r) == g for r in g)
        if lay.shape.gz % lay.cp == 0:
            assert any(set(g) <= z for z in zgroups), g
        else:
            assert all(z <= set(g) or not (z & set(g)) for z in zgroups), g


def test_a_cp_size_the_grid_does_not_take_is_refused_in_one_line():
    with pytest.raises(GridError) as e:
        RankLayout(GridShape(1, 1, 2, 3), cp=4)
    msg = str(e.value)
    assert "\n" not in msg and "cp=4" in msg and "[1, 2, 6]" in msg
    with pytest.raises(GridError, match=r"choose one of \[1, 2, 4\]"):
        check_cp(GridShape(2, 1, 4, 1), 3)
    with pytest.raises(GridError, match="integer >= 1"):
        RankLayout(GridShape(1, 1, 2, 1), cp=0)


@settings(max_examples=60, deadline=None)
@given(cp=st.integers(1, 8), chunk=st.integers(1, 6), batch=st.integers(1, 3))
def test_the_chunks_cover_the_sequence_and_balance_causal_work(cp, chunk, batch):
    """Every token on exactly one rank, at the position it has in the sequence; under a causal mask every rank's
    queries see the same number of keys (the load balance)."""
    seq = 2 * cp * chunk
    tokens = torch.arange(seq).repeat(batch, 1)
    parts = torch.stack([shard(tokens, cp, r, dim=1) for r in range(cp)])
    assert torch.equal(unshard(parts, dim=1), tokens)
    for r in range(cp):
        assert torch.equal(positions(seq, cp, r), parts[r, 0])
    work = {int((positions(seq, cp, r) + 1).sum()) for r in range(cp)}
    assert len(work) == 1


def test_a_sequence_that_does_not_cut_into_2cp_chunks_is_refused_naming_lengths_that_do():
    assert check_sequence(4096, 4) == 512
    with pytest.raises(ValueError) as e:
        check_sequence(100, 4)
    msg = str(e.value)
    assert "\n" not in msg and "100" in msg and "multiple of 8" in msg and "96" in msg and "104" in msg
    with pytest.raises(ValueError, match="multiple of 8"):
        check_sequence(4, 4)
