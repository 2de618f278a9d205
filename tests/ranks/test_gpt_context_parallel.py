"""The GPT trains under context parallelism to the serial model's losses, gradients and parameters: two AdamW steps
on real gloo ranks, each sequence split over the context-parallel group (inside z) beside data parallelism over d
(zero 0, 1 and 2) and tensor parallelism over x; and its sizes refused in one line before any collective."""
from __future__ import annotations

import pytest
import torch

import axgrid
from axgrid.driver import share_rows
from axgrid.models import GPT, GPTConfig
from axgrid.models.kv_cache import KVCache
from axgrid.spec import TransformerShape

TOL = dict(rtol=1e-4, atol=2e-5)
#: AdamW's eps: the key bias's gradient is zero in exact arithmetic (softmax ignores a shift shared by every key), so
#: with the default 1e-8 Adam turns its round-off (~1e-9, different in any two summation orders) into steps of ±lr.
EPS = 1e-4
SHAPE = TransformerShape("test", layers=2, hidden=48, heads=8, seq=16, vocab=48)


def rank_train_under_cp(spec: str, cp: int, zero: int, overlap: str, exchange: str) -> list[float]:
    """Two AdamW steps (two micro-batches each) under ``cp`` and serially on the same global batches; asserts the
    losses, every gradient (each step, ``zero=0``) and every parameter after each step agree. Returns the losses."""
    config = axgrid.RuntimeConfig(timeout_s=60, zero=zero, overlap=axgrid.OverlapConfig.parse(overlap),
                                  bucket_bytes=4096, seed=0)
    grid = axgrid.init(spec, cp=cp, config=config)
    try:
        gd, d = grid.size("d"), grid.coord.d
        cfg = GPTConfig(SHAPE, seed=11)
        par, ser = GPT(GPTConfig(SHAPE, seed=11, cp_exchange=exchange), grid), GPT(cfg, None)
        sp = dict(ser.named_parameters())
        grid.watch(par)
        opt = axgrid.shard_optimizer(torch.optim.AdamW(par.optimizer_groups(0.1), lr=1e-2, eps=EPS, foreach=False),
                                     par, grid)
        ref_opt = torch.optim.AdamW(ser.optimizer_groups(0.1), lr=1e-2, eps=EPS, foreach=False)
        gen = torch.Generator().manual_seed(5)
        per = gd * grid.size("z") // cp            # sequences of one micro-batch: one per group of cp z-ranks
        s = SHAPE.seq
        # the drivers' corpus reads only the rows a rank computes: its group's sequences of its d-slice
        local = par.local_rows(per // gd)
        assert share_rows(per, 1, grid) == [d * per // gd + i for i in range(local.start, local.stop)]
        losses = []
        for step in range(2):
            opt.zero_grad(set_to_none=True)
            ref_opt.zero_grad(set_to_none=True)
            for mb in range(2):
                tok = torch.randint(0, SHAPE.vocab, (per, s), generator=gen)
                tgt = torch.randint(0, SHAPE.vocab, (per, s), generator=gen)
                mask = (torch.rand(per, s, generator=gen) < 0.7).float()
                kept = float(mask.sum())
                mine = slice(d * per // gd, (d + 1) * per // gd)
                with grid.no_sync() if mb == 0 else torch.enable_grad():
                    loss = par(tok[mine], tgt[mine], mask[mine], normalizer=2 * kept / gd)
                    loss.backward()
                ref = ser(tok, tgt, mask, normalizer=2 * kept)
                ref.backward()
                got = grid.comm.all_reduce(loss.detach().reshape(1), "d", average=True)[0]
                torch.testing.assert_close(got, ref.detach(), **TOL)
                losses.append(float(ref.detach()))
            axgrid.sync_gradients(par, grid)
            if zero == 0:
                for name, p in par.named_parameters():
                    t = p.axgrid_tile
                    try:
                        torch.testing.assert_close(p.grad, t.part_of(sp[name].grad[t.slices()]), **TOL)
                    except AssertionError as e:
                        raise AssertionError(f"step {step}, gradient of {name}: {e}") from None
            opt.step()
            ref_opt.step()
            axgrid.finish_gradients(grid)
            for name, p in par.named_parameters():
                t = p.axgrid_tile
                try:
                    torch.testing.assert_close(p.detach(), t.part_of(sp[name].detach()[t.slices()]), **TOL)
                except AssertionError as e:
                    raise AssertionError(f"step {step}, parameter {name}: {e}") from None
        return losses
    finally:
        grid.destroy()


@pytest.mark.parametrize("spec,cp,zero,overlap,exchange", [
    ("1x1x2x1", 2, 0, "none", "all_gather"), ("1x1x2x2", 2, 1, "all", "all_gather"),
    ("2x1x2x1", 2, 0, "oag", "ring"), ("1x1x4x1", 4, 0, "none", "ring"), ("1x1x2x2", 2, 2, "all", "ring")])
def test_gpt_trains_under_cp_as_serial(ranks, spec, cp, zero, overlap, exchange):
    n = 1
    for v in spec.split("x"):
        n *= int(v)
    losses = ranks(n, rank_train_under_cp, spec, cp, zero, overlap, exchange)
    assert all(lo == losses[0] for lo in losses) and len(losses[0]) == 4


def rank_refusals(spec: str, cp: int) -> list[str]:
    grid = axgrid.init(spec, cp=cp, config=axgrid.RuntimeConfig(timeout_s=30, seed=0))
    msgs = []
    try:
        model = GPT(GPTConfig(SHAPE), grid)
        for bad in (torch.zeros(2, 14, dtype=torch.long), torch.zeros(1, 6, dtype=torch.long)):
            try:
                model(bad, bad)
                msgs.append("no error")
            except ValueError as e:
                msgs.append(str(e))
        try:
            model(torch.zeros(1, 16, dtype=torch.long), cache=KVCache(SHAPE.layers))
            msgs.append("no error")
        except ValueError as e:
            msgs.append(str(e))
        return msgs
    finally:
        grid.destroy()


def test_a_sequence_that_does_not_cut_into_2cp_chunks_is_refused_before_any_collective(ranks):
    msgs = ranks(4, rank_refusals, "1x1x4x1", 4)
    assert all(m == msgs[0] for m in msgs)                # the same line on every rank, nobody hung
    assert msgs[0][2].startswith("generation (a KV cache) under context parallelism (cp=4) is not supported")
    for m, seq in zip(msgs[0], (14, 6)):
        assert "\n" not in m and f"sequence length {seq}" in m and "multiple of 8" in m, m
    assert "16" in msgs[0][0] and "8" in msgs[0][1]


def rank_saved_bytes(spec: str, cp: int) -> tuple[dict, dict]:
    """What each block saves for backward (memtrack), serially and under ``cp`` with each exchange, one sequence."""
    from axgrid.metrics.memtrack import SavedBytes
    shape = TransformerShape("m", layers=2, hidden=64, heads=4, seq=256, vocab=64)
    tok = torch.randint(0, 64, (1, 256), generator=torch.Generator().manual_seed(0))
    serial = GPT(GPTConfig(shape), None)
    with SavedBytes({f"blocks.{i}": b for i, b in enumerate(serial.blocks)}, exclude=list(serial.parameters())) as s:
        serial(tok, torch.roll(tok, -1, 1))
    grid = axgrid.init(spec, cp=cp, config=axgrid.RuntimeConfig(timeout_s=60, seed=0))
    try:
        out = {}
        for exchange in ("all_gather", "ring"):
            model = GPT(GPTConfig(shape, cp_exchange=exchange), grid)
            with SavedBytes({f"blocks.{i}": b for i, b in enumerate(model.blocks)},
                            exclude=list(model.parameters())) as p:
                model(tok, torch.roll(tok, -1, 1))
            out[exchange] = p.by_tag["blocks.0"]
        return s.by_tag["blocks.0"], out
    finally:
        grid.destroy()


@pytest.mark.parametrize("spec,cp", [("1x1x2x1", 2), ("1x1x4x1", 4)])
def test_a_block_saves_1_over_cp_of_its_activations_under_the_ring(ranks, spec, cp):
    """memtrack: under the ring a block saves 1/cp of what it saves serially (within 1%: its log-sum-exp and masks
    differ from SDPA's by a few hundred bytes); the all-gather saves more -- the whole sequence's keys and values and,
    on CPU, each chunk's mask as floats (docs/design.md#context-parallelism)."""
    for serial, par in ranks(cp, rank_saved_bytes, spec, cp):
        assert abs(par["ring"] - serial / cp) <= 0.01 * serial / cp, (serial, par)
        assert par["all_gather"] > 1.1 * serial / cp, (serial, par)
