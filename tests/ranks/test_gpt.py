"""axgrid.models.GPT equals its serial reference -- initial weights, logits, loss (masked and unmasked, with a
global normaliser across data-parallel ranks) and EVERY parameter gradient -- on every grid of 1, 2, 4 and 6 ranks
and on every grid of 8 ranks, recompute on and off; plus the model's errors.

The tiny model (hidden 48, 24 heads of size 2, vocab 48, MLP 192) is divisible by every Gx, Gy <= 8 that occurs,
so one configuration serves all grids. Each parallel parameter's gradient is compared with the serial gradient cut
through the parameter's own TileSpec, so the tile descriptions are checked at the same time.
"""
import pytest

from helpers import slow_where
import torch

import axgrid
from axgrid.spec.layout import all_shapes
from axgrid.models import GPT, GPTConfig, gpt_flops_per_iteration
from axgrid.spec import TransformerShape

TOL = dict(rtol=1e-4, atol=2e-5)
SHAPE = TransformerShape("test", layers=2, hidden=48, heads=24, seq=8, vocab=48)


def _compare(grid: axgrid.Grid, cfg: GPTConfig, seqs_per_rank: int, masked: bool, seed: int) -> float:
    """One forward/backward on ``grid`` against serial; returns the worst gradient difference."""
    gd, gz, d = grid.size("d"), grid.size("z"), grid.coord.d
    par, ser = GPT(cfg, grid), GPT(cfg, None)
    sp = dict(ser.named_parameters())
    for name, p in par.named_parameters():      # same initial values, tile by tile
        t = p.axgrid_tile
        assert torch.equal(t.part_of(sp[name].detach()[t.slices()]), p.detach()), name
    gen = torch.Generator().manual_seed(seed)
    bsz, s = gd * gz * seqs_per_rank, cfg.shape.seq
    tokens = torch.randint(0, cfg.shape.vocab, (bsz, s), generator=gen)
    targets = torch.randint(0, cfg.shape.vocab, (bsz, s), generator=gen)
    mask = (torch.rand(bsz, s, generator=gen) < 0.6).float() if masked else None
    kept = float(mask.sum()) if masked else float(bsz * s)
    bd = bsz // gd
    mine = slice(d * bd, (d + 1) * bd)
    # logits: this rank's sequences (z) and vocabulary slice (y)
    with torch.no_grad():
        lp, ls = par(tokens[mine]), ser(tokens)[mine][par.local_rows(bd)]
    v = cfg.shape.vocab // grid.size("y")
    torch.testing.assert_close(lp, ls[..., grid.coord.y * v:(grid.coord.y + 1) * v], **TOL)
    # loss and gradients, normalised by the kept tokens of the whole global batch
    loss = par(tokens[mine], targets[mine], None if mask is None else mask[mine], normalizer=kept / gd)
    loss.backward()
    axgrid.sync_gradients(par, grid)
    ref = ser(tokens, targets, mask)
    ref.backward()
    mean_loss = grid.comm.all_reduce(loss.detach().reshape(1), "d", average=True)[0]
    torch.testing.assert_close(mean_loss, ref.detach(), **TOL)
    worst = 0.0
    for name, p in par.named_parameters():
        t = p.axgrid_tile
        want = t.part_of(sp[name].grad[t.slices()])
        assert p.grad is not None, name
        try:
            torch.testing.assert_close(p.grad, want, **TOL)
        except AssertionError as e:
            raise AssertionError(f"gradient of {name}: {e}") from None
        worst = max(worst, float((p.grad - want).abs().max()))
    return worst


def rank_all_grids(world: int, recompute_every: int, only: list | None = None) -> list:
    """Every grid of ``world`` ranks (or the ``only`` ones); recompute on every ``recompute_every``-th grid."""
    done = []
    shapes = [s for s in all_shapes(world) if only is None or str(s) in only]
    for i, shape in enumerate(shapes):
        grid = axgrid.init(shape, timeout_s=60)
        try:
            recompute = i % recompute_every == 0
            cfg = GPTConfig(SHAPE, recompute=recompute, seed=i)
            worst = _compare(grid, cfg, seqs_per_rank=1 + i % 2, masked=i % 3 != 1, seed=100 + i)
            done.append((str(shape), recompute, worst))
        except AssertionError as e:
            raise AssertionError(f"grid {shape}: {e}") from None
        finally:
            grid.destroy()
    return done


@pytest.mark.parametrize("world", slow_where([1, 2, 4, 6, 8], lambda w: w > 2))
def test_gpt_matches_serial_on_every_grid(ranks, world):
    out = ranks(world, rank_all_grids, world, 3)
    n = len(list(all_shapes(world)))
    assert all(len(o) == n for o in out)
    assert any(rc for _, rc, _ in out[0])
    assert n == 1 or any(not rc for _, rc, _ in out[0])


def rank_recompute_same(spec: str) -> list:
    """Recompute gives bitwise the same loss and gradients as no recompute on the same grid."""
    grid = axgrid.init(spec, timeout_s=60)
    try:
        grads = []
        for recompute in (False, True):
            model = GPT(GPTConfig(SHAPE, recompute=recompute), grid)
            gen = torch.Generator().manual_seed(3)
            tok = torch.randint(0, 48, (4, 8), generator=gen)
            loss = model(tok, torch.roll(tok, -1, 1))
            loss.backward()
            grads.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
        return [bool(torch.equal(a, b)) for a, b in zip(*grads)]
    finally:
        grid.destroy()


@pytest.mark.slow
def test_recompute_is_bitwise_identical(ranks):
    assert all(all(o) for o in ranks(8, rank_recompute_same, "2x2x2x1"))


def rank_errors(spec: str) -> list:
    grid = axgrid.init(spec, timeout_s=30)
    msgs = []
    try:
        model = GPT(GPTConfig(SHAPE), grid)
        for bad in (torch.zeros(3, 8, dtype=torch.long), torch.zeros(2, 9, dtype=torch.long)):
            try:
                model(bad, bad)
                msgs.append("no error")
            except ValueError as e:
                msgs.append(str(e))
        try:
            GPT(GPTConfig(TransformerShape("test", layers=1, hidden=20, heads=5, seq=8, vocab=48)), grid)
            msgs.append("no error")
        except ValueError as e:
            msgs.append(str(e))
        return msgs
    finally:
        grid.destroy()


def test_errors_are_clear_and_raised_before_collectives(ranks):
    msgs = ranks(4, rank_errors, "1x2x2x1")
    for m in msgs:   # identical on every rank, nobody hung
        assert m == msgs[0]
    batch, seq, fit = msgs[0]
    assert "not divisible by Gz=2" in batch and "whole sequences" in batch
    assert "exceeds the model's seq=8" in seq
    assert "heads=5 is not divisible by Gy=2" in fit or "hidden=20" in fit


def test_named_configs_and_flops():
    tiny = GPTConfig.named("gpt-tiny")
    t = tiny.shape
    assert (t.layers, t.hidden, t.heads, t.seq, t.vocab, t.ffn) == (2, 64, 4, 64, 256, 256)
    assert GPTConfig.named("GPT-5B").shape.hidden == 4096 and GPTConfig.named("gpt-640b").shape.layers == 192
    assert GPTConfig.named("gpt-mini", recompute=True).recompute
    with pytest.raises(ValueError, match="gpt-tiny, gpt-mini, gpt-5b"):
        GPTConfig.named("gpt-7b")
    with pytest.raises(ValueError, match="not divisible by heads"):
        TransformerShape("test", layers=1, hidden=10, heads=4, seq=4, vocab=8)
    # the formula's terms: 24·B·S·L·h² per forward of the FC layers, x3 (x4 with recompute)
    b, s, l, h, v = 8, 2048, 24, 4096, 50304
    fc = 24 * b * s * l * h * h
    attn = 4 * b * s * s * h * l
    logit = 2 * b * s * h * v
    assert gpt_flops_per_iteration(b, s, l, h, v, False) == pytest.approx(3 * (fc + attn + logit))
    assert gpt_flops_per_iteration(b, s, l, h, v, True) == pytest.approx(4 * (fc + attn) + 3 * logit)
    # parameter count of the serial model
    cfg = GPTConfig(SHAPE)
    assert sum(p.numel() for p in GPT(cfg).parameters()) == cfg.shape.params


def _train_with(spec: str, overlap: "axgrid.OverlapConfig", recompute: bool) -> tuple:
    """Two AdamW steps of two micro-batches each; returns the losses and this rank's parameter shards."""
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60, overlap=overlap, bucket_bytes=4096))
    try:
        gd, d = grid.size("d"), grid.coord.d
        model = GPT(GPTConfig(SHAPE, recompute=recompute, seed=5), grid)
        grid.watch(model)
        opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-2)
        gen = torch.Generator().manual_seed(9)
        per = 2 * gd * grid.size("z")
        losses = []
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            for mb in range(2):
                tok = torch.randint(0, 48, (per, 8), generator=gen)
                mine = slice(d * per // gd, (d + 1) * per // gd)
                with grid.no_sync() if mb == 0 else torch.enable_grad():
                    loss = model(tok[mine], torch.roll(tok, -1, 1)[mine], normalizer=2 * per * 8 / gd)
                    loss.backward()
                losses.append(float(loss))
            axgrid.sync_gradients(model, grid)
            axgrid.clip_grad_norm_(model, 0.5, grid)
            opt.step()
        assert grid.runtime.grads.empty(), "gradient collectives left pending"
        return losses, [p.detach().clone() for p in model.parameters()]
    finally:
        grid.destroy()


def rank_overlaps(spec: str) -> int:
    """OAR, ORS, OAG, ODP (one at a time and all together, recompute on and off) leave the GPT's training as is."""
    base_l, base_p = _train_with(spec, axgrid.OverlapConfig(), False)
    combos = ["oar", "ors", "oag", "odp", "all"]
    for recompute in (False, True):
        for name in combos:
            ov = axgrid.OverlapConfig.parse(name)
            losses, params = _train_with(spec, ov, recompute)
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(base_l), rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"{name} recompute={recompute}: losses differ: {m}")
            for a, b in zip(params, base_p):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"{name} recompute={recompute}: parameters differ: {m}")
    return 2 * len(combos)


@pytest.mark.slow
def test_overlaps_keep_gpt_training_identical(ranks):
    assert ranks(8, rank_overlaps, "1x2x2x2") == [10] * 8
