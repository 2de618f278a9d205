"""Checkpoints reshard across expert-parallel sizes: a Mixtral trained and saved under ep = 2 on 1x1x1x4 (two replicas
of each expert; zero 0, and zero 1 with each expert's AdamW state sharded over its two replicas) loads under ep = 1,
2 and 4 to the weights the saving run held and one AdamW state, bit for bit, and a further AdamW step then gives the
loss the saving run gets when it goes on uninterrupted."""
from __future__ import annotations

import pytest
import torch

import axgrid
from axgrid.checkpoint import load_checkpoint, save_checkpoint

pytest.importorskip("transformers")

VOCAB, SEQ, ROWS = 64, 6, 4          # ROWS sequences per global batch, split over d
STATE = ("exp_avg", "exp_avg_sq")


def _mixtral(seed: int) -> torch.nn.Module:
    """4 experts, top-2, no auxiliary loss (the loss is then the mean over the batch's tokens on any Gd)."""
    import transformers
    cfg = transformers.MixtralConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=12, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=32, router_jitter_noise=0.0,
                                     output_router_logits=False)
    torch.manual_seed(seed)
    return transformers.MixtralForCausalLM(cfg)


def _batch(step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(step))


def _loss(model, grid, step: int, train: bool, opt=None) -> float:
    """The global batch ``step``'s mean loss (each d-rank its rows); with ``train`` an AdamW step on it too."""
    gd, d = grid.size("d"), grid.index("d")
    rows = _batch(step)[d * ROWS // gd:(d + 1) * ROWS // gd]
    if train:
        opt.zero_grad(set_to_none=True)
        out = model(input_ids=rows, labels=rows)
        out.loss.backward()
        axgrid.sync_gradients(model, grid)
        opt.step()
        axgrid.finish_gradients(grid)
    else:
        with torch.no_grad():
            out = model(input_ids=rows, labels=rows)
    return float(grid.comm.all_reduce(out.loss.detach().reshape(1), "d")[0]) / gd


def rank_train_and_save(root: str, zero: int) -> tuple[dict, float]:
    """Two AdamW steps under ep = 2, a checkpoint at step 2, then step 2 and batch 3's loss uninterrupted: this
    rank's weights at the checkpoint (its experts by their global names) and that loss."""
    grid = axgrid.init("1x1x1x4", ep=2, config=axgrid.RuntimeConfig(timeout_s=60, zero=zero, seed=0))
    try:
        model = axgrid.parallelize(_mixtral(3), grid)
        opt = axgrid.shard_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2), model, grid)
        for step in range(2):
            _loss(model, grid, step, True, opt)
        save_checkpoint(root, model, opt, grid, step=2)
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        _loss(model, grid, 2, True, opt)
        return weights, _loss(model, grid, 3, False)
    finally:
        grid.destroy()


def rank_load_and_step(root: str, spec: str, ep: int, zero: int) -> tuple[dict, dict, float]:
    """Load ``root`` on ``spec`` under ``ep`` (other initial weights: the load must replace them all): this rank's
    weights and AdamW state by name (zero 0), and batch 3's loss after an AdamW step on batch 2."""
    grid = axgrid.init(spec, ep=ep, config=axgrid.RuntimeConfig(timeout_s=60, zero=zero, seed=0))
    try:
        model = axgrid.parallelize(_mixtral(99), grid)
        opt = axgrid.shard_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2), model, grid)
        info = load_checkpoint(root, model, opt, grid)
        assert info.step == 2 and info.optimizer
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        state = {} if zero else {n: {k: opt.state[p][k].clone() for k in STATE} for n, p in model.named_parameters()}
        _loss(model, grid, 2, True, opt)
        return weights, state, _loss(model, grid, 3, False)
    finally:
        grid.destroy()


@pytest.mark.parametrize("zero,loads", [(0, (("1x1x1x1", 1, 0), ("1x1x1x4", 4, 0))),
                                        (1, (("1x1x1x1", 1, 0), ("1x1x1x4", 2, 1), ("1x1x1x2", 2, 0)))])
def test_a_checkpoint_saved_under_ep_2_loads_under_ep_1_2_and_4(ranks, tmp_path, zero, loads):
    root = str(tmp_path / "ck")
    saved = ranks(4, rank_train_and_save, root, zero)
    want_loss = saved[0][1]
    want = {}
    for weights, _ in saved:                                   # the e-ranks' experts together: every expert
        for n, w in weights.items():
            assert n not in want or torch.equal(w, want[n]), n   # replicas equal
            want[n] = w
    assert sum(".experts." in n for n in want) == 2 * 4 * 3     # 2 layers, 4 experts, 3 layers each
    reference_state = None
    for spec, ep, load_zero in loads:
        got = ranks(int(spec.split("x")[-1]), rank_load_and_step, root, spec, ep, load_zero)
        for weights, state, loss in got:
            for n, w in weights.items():
                assert torch.equal(w, want[n]), (spec, ep, n)   # resharding copies values: bit for bit
            if ep == 1 and not load_zero:
                reference_state = state
                assert all(float(s["exp_avg_sq"].abs().max()) > 0 for s in state.values())
            for n, s in state.items():
                for k in STATE:
                    assert torch.equal(s[k], reference_state[n][k]), (spec, ep, n, k)
            assert loss == pytest.approx(want_loss, rel=1e-5), (spec, ep)
        if ep > 1:
            held = [set(n for n in w if ".experts." in n) for w, _, _ in got]
            assert len(set().union(*held)) == 24 and all(len(h) == 24 // ep for h in held)
