"""axgrid.spec.tiles: a part's boxes are exactly its elements of the dense tensor, in order, and placing every
rank's part rebuilds the dense tensor (no ranks needed: the geometry is per rank); a fused tensor's row map gives
each rank its share of every segment, and the pieces of a part in any band of dense rows are its elements there."""
from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from axgrid.spec import Box, overlap, part_boxes, part_shape, row_segments, segment_row_map
from axgrid.io import part_of_dense, place_part, read_part
from axgrid.spec import TileSpec


@st.composite
def tiles(draw):
    """A dense shape (0-3 dims), one tile of it, and a split of that tile into ``parts`` (0: not split)."""
    nd = draw(st.integers(0, 3))
    dense = tuple(draw(st.integers(1, 6)) for _ in range(nd))
    offsets = tuple(draw(st.integers(0, d - 1)) for d in dense)
    shape = tuple(draw(st.integers(1, d - o)) for d, o in zip(dense, offsets))
    parts = draw(st.integers(0, 5))
    return dense, offsets, shape, parts


def _specs(dense, offsets, shape, parts):
    if parts == 0:
        return [TileSpec(dense, offsets, shape)]
    return [TileSpec(dense, offsets, shape, "z", parts, i) for i in range(parts)]


@settings(max_examples=150, deadline=None)
@given(tiles())
def test_boxes_are_the_part_in_order_and_placing_every_part_rebuilds_the_tile(case):
    dense_shape, offsets, shape, parts = case
    dense = torch.arange(math.prod(dense_shape), dtype=torch.float64).reshape(dense_shape) + 1
    out = torch.zeros(dense_shape, dtype=torch.float64)
    covered = 0
    for spec in _specs(*case):
        boxes = part_boxes(spec)
        start, stop = spec.part_range()
        assert sum(b.numel for b in boxes) == stop - start
        tile_box = Box(offsets, shape)
        for i, b in enumerate(boxes):
            assert overlap(b, tile_box) == b                          # inside the tile
            for c in boxes[i + 1:]:
                assert overlap(b, c) is None                          # disjoint
        want = spec.part_of(dense[spec.slices()])                      # the spec leaf's own definition
        got = part_of_dense(spec, dense)
        assert got.shape == part_shape(spec) and torch.equal(got, want)
        reads = []
        assert torch.equal(read_part(spec, lambda b: reads.append(b) or dense[b.slices()]), want)
        assert reads == boxes                                           # each box read once, nothing else
        covered += place_part(spec, got, out)
    assert covered == math.prod(shape)
    assert torch.equal(out[Box(offsets, shape).slices()], dense[Box(offsets, shape).slices()])
    assert out.sum() == dense[Box(offsets, shape).slices()].sum()      # nothing outside the tile written


def test_a_split_matrix_block_is_at_most_three_boxes_and_a_region_takes_its_share():
    spec = TileSpec((8, 10), (4, 5), (4, 5), "z", 3, 1)               # 20 elements, 7 per part: [7, 14)
    assert part_boxes(spec) == [Box((5, 7), (1, 3)), Box((6, 5), (1, 4))]
    dense = torch.arange(80.).reshape(8, 10)
    part = part_of_dense(spec, dense)
    region = torch.zeros(2, 10)                                        # rows 5..6 of the dense tensor only
    assert place_part(spec, part, region, origin=(5, 0)) == 7
    assert torch.equal(region[0, 7:], dense[5, 7:]) and torch.equal(region[1, 5:9], dense[6, 5:9])
    only_pad = TileSpec((2, 2), (0, 0), (2, 2), "z", 8, 7)               # 4 elements over 8 parts
    assert part_boxes(only_pad) == [] and torch.equal(read_part(only_pad, lambda b: 1 / 0), torch.zeros(1))


@st.composite
def fused(draw):
    """Segments (each divisible by ``parts``, the y split), columns and a z split of each y-rank's block."""
    parts = draw(st.integers(1, 4))
    segments = tuple(parts * draw(st.integers(1, 3)) for _ in range(draw(st.integers(1, 3))))
    return segments, parts, draw(st.integers(1, 4)), draw(st.integers(1, 3))


@settings(max_examples=100, deadline=None)
@given(fused())
def test_a_fused_tensors_parts_are_each_ranks_share_of_every_segment(case):
    segments, parts, cols, gz = case
    n = sum(segments)
    dense = torch.arange(n * cols, dtype=torch.float64).reshape(n, cols) + 1
    rows_of = torch.arange(n, dtype=torch.float64).unsqueeze(1).expand(n, cols).contiguous()
    rmap = segment_row_map(segments, parts)
    starts = [sum(segments[:i]) for i in range(len(segments))]
    out = torch.zeros_like(dense)
    for j in range(parts):
        share = torch.cat([dense[a + j * s // parts: a + (j + 1) * s // parts] for a, s in zip(starts, segments)])
        for z in range(gz):
            spec = TileSpec((n, cols), (j * n // parts, 0), (n // parts, cols), "z", gz, z, rmap)
            got = part_of_dense(spec, dense)
            assert torch.equal(got, TileSpec((n, cols), (0, 0), (n // parts, cols), "z", gz, z).part_of(share))
            assert place_part(spec, got, out) == spec.part_range()[1] - spec.part_range()[0]
            real = spec.part_range()[1] - spec.part_range()[0]
            rows = part_of_dense(spec, rows_of)[:real]
            for r0 in range(n):
                r1 = min(n, r0 + 1 + (r0 * 7) % 3)
                pieces = row_segments(spec, r0, r1)
                assert sum(b.numel for _, b in pieces) == int(((rows >= r0) & (rows < r1)).sum())
                for pos, box in pieces:
                    assert r0 <= box.offsets[0] and box.offsets[0] + box.shape[0] <= r1
                    assert torch.equal(got[pos: pos + box.numel].view(box.shape), dense[box.slices()])
    assert torch.equal(out, dense)
    assert rmap == () or sorted(a for a, _ in rmap) == sorted({a for a, _ in rmap})     # a permutation of bands
