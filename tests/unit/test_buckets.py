"""The data-parallel bucket layout (axgrid.spec.buckets) and the tiles of a d-rank's piece (TileSpec.piece): every
element of every parameter is in exactly one share, and a piece's boxes are exactly its elements of the dense
tensor."""
import itertools

import numpy as np
import pytest

from axgrid.spec import Bucket, TileSpec, pack_buckets, part_boxes, part_shape


def test_buckets_close_once_they_hold_the_limit_and_split_by_kind():
    b = pack_buckets([2, 2, 5, 1, 1], [4] * 5, ["f32", "f32", "f32", "f32", "bf16"], limit=16, parts=1)
    assert [x.members for x in b] == [(0, 1), (2,), (3,), (4,)]       # 16 B closes; 20 B alone; a new kind
    assert [x.offsets for x in b] == [(0, 2), (0,), (0,), (0,)]
    with pytest.raises(ValueError):
        pack_buckets([1], [4], [0], limit=0)


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_every_element_in_exactly_one_share(parts):
    numels = [5, 0, 7, 1, 12, 3]
    for bucket in pack_buckets(numels, [4] * len(numels), [0] * len(numels), limit=40, parts=parts):
        assert bucket.padded % parts == 0 and bucket.padded - bucket.numel < parts
        for k, m in enumerate(bucket.members):
            seen = np.zeros(numels[m], dtype=int)
            for i in range(parts):
                lo, hi = bucket.piece(k, i)
                share_lo, share_hi = bucket.share(i)
                assert hi == lo or share_lo <= bucket.offsets[k] + lo < bucket.offsets[k] + hi <= share_hi
                seen[lo:hi] += 1
            assert (seen == 1).all(), (bucket, k)


def _dense_index(tile: TileSpec) -> list[int]:
    """The flat dense indices of a part's elements, read through its boxes, in order."""
    dense = np.arange(int(np.prod(tile.dense_shape))).reshape(tile.dense_shape)
    return [int(v) for b in part_boxes(tile) for v in dense[b.slices()].reshape(-1)]


@pytest.mark.parametrize("split", [None, "z"])
def test_piece_boxes_are_its_share_of_the_part(split):
    tile = TileSpec((6, 10), (2, 4), (3, 5), split, 2 if split else 1, 1 if split else 0)   # part: 8 elements
    part = _dense_index(tile)                          # the part's real elements, in its flat order
    n = part_shape(tile)[0] if split else len(part)    # padded part length (split: 8, of which 7 real)
    for lo, hi in itertools.combinations(range(n + 1), 2):
        piece = TileSpec(tile.dense_shape, tile.offsets, tile.tile_shape, tile.split_dim, tile.split_size,
                         tile.split_index, piece=(lo, hi))
        assert part_shape(piece) == (hi - lo,)
        assert _dense_index(piece) == part[lo:hi], (lo, hi)    # past the real elements: padding, no box
    assert part_boxes(TileSpec((4,), (0,), (4,), piece=(2, 2))) == []
    assert isinstance(Bucket((0,), (0,), (3,), 2).share(1), tuple)
