"""Checkpoints reshard across context-parallel sizes: a GPT trained and saved under cp = 2 (beside data parallelism,
AdamW's state sharded over d, zero 1) loads under cp = 1 and cp = 4 to the weights and AdamW state the serial model
loads from the same files (``grid=None``: the reference), part for part, and the next step's loss equals the serial
model's on the same batch."""
from __future__ import annotations

import torch

import axgrid
from axgrid.checkpoint import load_checkpoint, save_checkpoint
from axgrid.models import GPT, GPTConfig
from axgrid.spec import TransformerShape

SHAPE = TransformerShape("test", layers=2, hidden=48, heads=8, seq=16, vocab=48)
STATE = ("exp_avg", "exp_avg_sq")


def _batch(seed: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, SHAPE.vocab, (rows, SHAPE.seq), generator=g),
            torch.randint(0, SHAPE.vocab, (rows, SHAPE.seq), generator=g))


def rank_train_and_save(root: str) -> None:
    """Two AdamW steps on grid 1x1x2x2 under cp = 2 and zero 1, then a checkpoint at step 2."""
    grid = axgrid.init("1x1x2x2", cp=2, config=axgrid.RuntimeConfig(timeout_s=60, zero=1, seed=0))
    try:
        model = GPT(GPTConfig(SHAPE, seed=3), grid)
        grid.watch(model)
        opt = axgrid.shard_optimizer(torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-2), model, grid)
        d = grid.index("d")
        for step in range(2):
            tok, tgt = _batch(step, 2)                     # one sequence per d-rank, its chunks over the cp group
            opt.zero_grad(set_to_none=True)
            model(tok[d:d + 1], tgt[d:d + 1], normalizer=tok.numel() / 2).backward()
            opt.step()
            axgrid.finish_gradients(grid)
        save_checkpoint(root, model, opt, grid, step=2)
    finally:
        grid.destroy()


def rank_load_and_step(root: str, spec: str, cp: int, weights: dict, state: dict) -> tuple[float, float]:
    """Load ``root`` on ``spec`` under ``cp``: the largest difference of a weight or AdamW state part from the
    serial load's (``weights``, ``state``: dense, by name), and the loss of one step on batch 2."""
    grid = axgrid.init(spec, cp=cp, config=axgrid.RuntimeConfig(timeout_s=60, seed=0))
    try:
        model = GPT(GPTConfig(SHAPE, seed=99), grid)       # other initial weights: the load must replace them all
        grid.watch(model)
        opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-2)
        load_checkpoint(root, model, opt, grid)
        worst = 0.0
        for name, p in model.named_parameters():
            t = p.axgrid_tile
            worst = max(worst, float((p.detach() - t.part_of(weights[name][t.slices()])).abs().max()))
            for key in STATE:
                worst = max(worst, float((opt.state[p][key] - t.part_of(state[name][key][t.slices()])).abs().max()))
        tok, tgt = _batch(2, 1)
        loss = model(tok, tgt, normalizer=tok.numel())
        return worst, float(loss.detach())
    finally:
        grid.destroy()


def test_a_checkpoint_saved_under_cp_2_loads_under_cp_1_and_4(ranks, tmp_path):
    root = str(tmp_path / "ck")
    ranks(4, rank_train_and_save, root)
    serial = GPT(GPTConfig(SHAPE, seed=99), None)
    opt = torch.optim.AdamW(serial.optimizer_groups(0.1), lr=1e-2)
    load_checkpoint(root, serial, opt)
    params = dict(serial.named_parameters())
    weights = {n: p.detach().clone() for n, p in params.items()}
    state = {n: {k: opt.state[p][k].clone() for k in STATE} for n, p in params.items()}
    assert all(float(s["exp_avg_sq"].abs().max()) > 0 for s in state.values())   # two steps' moments were saved
    tok, tgt = _batch(2, 1)
    with torch.no_grad():
        want = float(serial(tok, tgt, normalizer=tok.numel()))
    for spec, cp, n in (("1x1x1x1", 1, 1), ("1x1x4x1", 4, 4)):
        for worst, loss in ranks(n, rank_load_and_step, root, spec, cp, weights, state):
            assert worst == 0.0, (spec, worst)             # resharding copies values: bit for bit
            assert abs(loss - want) < 1e-5 * abs(want), (spec, loss, want)
