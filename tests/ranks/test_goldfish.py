"""Goldfish loss: the hashed mask depends only on the text (same passage, same mask, wherever it appears), drops
about 1/k of the targets, never drops the first h-1 positions; the static mask drops every k-th target; and the
goldfish-averaged loss on the grid (data-parallel ranks with different kept counts, micro-batches) equals the
serial loss averaged over all kept targets of the step, gradients included."""
import math

import pytest

from helpers import slow_where
import torch

import axgrid
from axgrid.memorization.goldfish import context_hash, goldfish_mask, kept_count
from axgrid.models import GPT, GPTConfig
from axgrid.spec import TransformerShape


def test_same_passage_same_mask_anywhere():
    gen = torch.Generator().manual_seed(0)
    h, k = 13, 4
    passage = torch.randint(0, 256, (60,), generator=gen)
    batch = torch.randint(0, 256, (3, 128), generator=gen)
    batch[0, 5:65] = passage          # row 0, offset 5
    batch[2, 50:110] = passage        # row 2, offset 50
    other = torch.randint(0, 256, (1, 80), generator=gen)
    other[0, 20:80] = passage         # another batch, offset 20
    m1, m2 = goldfish_mask(batch, k, h), goldfish_mask(other, k, h)
    # positions of the passage whose h-token context lies inside the passage: identical masks
    a, b, c = m1[0, 5 + h - 1:65], m1[2, 50 + h - 1:110], m2[0, 20 + h - 1:80]
    assert torch.equal(a, b) and torch.equal(a, c)
    assert 0 < int((a == 0).sum()) < a.numel()      # some dropped, not all
    # a different seed gives another (fixed) mask family; identical calls give identical masks
    assert torch.equal(goldfish_mask(batch, k, h), m1)
    assert not torch.equal(goldfish_mask(batch, k, h, seed=1), m1)


@pytest.mark.parametrize("k", [2, 4, 7, 32])
def test_dropped_fraction_is_about_one_in_k(k):
    h = 13
    tokens = torch.randint(0, 50304, (64, 512), generator=torch.Generator().manual_seed(k))
    mask = goldfish_mask(tokens, k, h)
    assert torch.all(mask[:, : h - 1] == 1)          # first h-1 positions never dropped
    eligible = mask[:, h - 1:]
    n = eligible.numel()
    frac = 1.0 - float(eligible.mean())
    p = 1.0 / k
    assert abs(frac - p) < 6 * math.sqrt(p * (1 - p) / n), (frac, p)   # 6 standard deviations
    # also on byte-level text-like data (small vocabulary, repeated tokens)
    small = torch.randint(0, 4, (64, 512), generator=torch.Generator().manual_seed(100 + k))
    frac_small = 1.0 - float(goldfish_mask(small, k, h)[:, h - 1:].mean())
    assert abs(frac_small - p) < 6 * math.sqrt(p * (1 - p) / n), (frac_small, p)


def test_static_mask_and_errors():
    m = goldfish_mask(torch.zeros(2, 10, dtype=torch.long), 3, mode="static")
    assert m[0].tolist() == [1, 1, 0, 1, 1, 0, 1, 1, 0, 1] and torch.equal(m[0], m[1])
    assert kept_count(m) == 14
    assert context_hash(torch.arange(5).view(1, 5), 13).shape == (1, 0)   # shorter than h: nothing dropped
    assert torch.all(goldfish_mask(torch.arange(5).view(1, 5), 2) == 1)
    with pytest.raises(ValueError, match="k=1"):
        goldfish_mask(torch.zeros(1, 4, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="choose 'static' or 'hash'"):
        goldfish_mask(torch.zeros(1, 4, dtype=torch.long), 3, mode="random")


SHAPE = TransformerShape("test", layers=1, hidden=24, heads=6, seq=16, vocab=24)


def rank_goldfish_loss(spec: str, micro: int) -> list:
    """Parallel goldfish loss (global kept count as normaliser) vs serial masked mean over the whole step."""
    grid = axgrid.init(spec, timeout_s=60)
    try:
        gd, d = grid.size("d"), grid.coord.d
        cfg = GPTConfig(SHAPE)
        par, ser = GPT(cfg, grid), GPT(cfg, None)
        gen = torch.Generator().manual_seed(7)
        per_mb = 2 * gd * grid.size("z")
        text = torch.randint(0, 3, (micro * per_mb, cfg.shape.seq + 1), generator=gen)   # few ids: repeats
        inputs, targets = text[:, :-1], text[:, 1:]
        mask = goldfish_mask(inputs, k=3, h=4)
        kept = kept_count(mask)
        logged = 0.0
        for mb in range(micro):
            rows = slice(mb * per_mb, (mb + 1) * per_mb)
            bd = per_mb // gd
            mine = slice(rows.start + d * bd, rows.start + (d + 1) * bd)
            loss = par(inputs[mine], targets[mine], mask[mine], normalizer=kept / gd)
            loss.backward()
            logged += float(loss)
        axgrid.sync_gradients(par, grid)
        logged = float(grid.comm.all_reduce(torch.tensor([logged]), "d", average=True)[0])
        ref = ser(inputs, targets, mask)          # mean over every kept target of the step
        ref.backward()
        assert abs(logged - float(ref)) < 1e-5, (logged, float(ref))
        sp = dict(ser.named_parameters())
        for name, p in par.named_parameters():
            t = p.axgrid_tile
            torch.testing.assert_close(p.grad, t.part_of(sp[name].grad[t.slices()]), rtol=1e-4, atol=2e-5)
        # the kept counts really differ between data-parallel ranks (so a per-rank mean would be wrong)
        per_d = [kept_count(mask[mb * per_mb + dd * (per_mb // gd): mb * per_mb + (dd + 1) * (per_mb // gd)])
                 for dd in range(gd) for mb in range(micro)]
        return [logged, float(ref), len(set(per_d)) > 1]
    finally:
        grid.destroy()


@pytest.mark.parametrize("spec,micro", slow_where([("1x2x2x2", 2), ("2x1x1x4", 3), ("3x1x1x2", 1)],
                                                  lambda case: case[0] != "2x1x1x4"))
def test_goldfish_loss_matches_masked_serial(ranks, spec, micro):
    world = math.prod(int(v) for v in spec.split("x"))
    out = ranks(world, rank_goldfish_loss, spec, micro)
    assert all(o[2] for o in out)
