"""Paths a training run meets sooner or later: steps under no_sync, parameters used on some ranks only, uneven
tokens, frozen layers with overlap, several models on one grid, a non-default rank order."""
import torch
from torch import nn

import axgrid
from axgrid.models import MLPStack
from axgrid.nn.init import reference_linear


def rank_no_sync_step(spec: str) -> list:
    """ODP on; step 1 synchronised during backward; step 2 entirely under no_sync, then sync_gradients."""
    cfg = axgrid.RuntimeConfig(timeout_s=60, overlap=axgrid.OverlapConfig(odp=True))
    grid = axgrid.init(spec, config=cfg)
    try:
        layer = axgrid.nn.Linear(4, 4, seed=1)
        out = []
        for step in range(2):
            layer.zero_grad(set_to_none=True)
            x = torch.full((2, 4), float(grid.coord.d + 1))
            if step == 0:
                layer(x).sum().backward()
            else:
                with grid.no_sync():
                    layer(x).sum().backward()
            axgrid.sync_gradients(layer, grid)
            out.append(layer.bias.grad.clone())
        return out
    finally:
        grid.destroy()


def test_a_step_under_no_sync_is_still_averaged(ranks):
    res = ranks(2, rank_no_sync_step, "1x1x1x2")
    for step in range(2):
        torch.testing.assert_close(res[0][step], res[1][step])   # replicas agree after every step


def rank_unused_on_some_ranks(spec: str) -> tuple:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        a, b = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(3))
        used = a if grid.coord.d == 0 else b       # each data-parallel rank uses one parameter
        (used * float(grid.coord.d + 1)).sum().backward()
        axgrid.sync_gradients([a, b], grid)
        return a.grad.tolist(), b.grad.tolist()
    finally:
        grid.destroy()


def test_parameters_without_gradient_on_some_ranks(ranks):
    for ga, gb in ranks(2, rank_unused_on_some_ranks, "1x1x1x2"):
        assert ga == [0.5] * 3 and gb == [1.0] * 3       # mean over d: (1 + 0)/2 and (0 + 2)/2


def rank_uneven_unpaired(spec: str) -> float:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        up = axgrid.nn.Linear(4, 8, seed=1, output_layout="sharded")
        down = axgrid.nn.Linear(8, 4, transpose=True, seed=2, input_layout="sharded")   # no pair_after
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))              # 5 tokens over Gz=2
        y = down(torch.relu(up(x)))
        want = reference_linear(8, 4, True, 2)(torch.relu(reference_linear(4, 8, True, 1)(x)))
        return float((y - want).abs().max())
    finally:
        grid.destroy()


def test_uneven_tokens_through_an_unpaired_sharded_layer(ranks):
    assert all(e < 1e-5 for e in ranks(4, rank_uneven_unpaired, "1x2x2x1"))


def rank_frozen_with_ors(spec: str) -> tuple:
    cfg = axgrid.RuntimeConfig(timeout_s=60, overlap=axgrid.OverlapConfig(oar=True, ors=True, odp=True))
    grid = axgrid.init(spec, config=cfg)
    try:
        frozen = axgrid.nn.Linear(4, 4, seed=1).requires_grad_(False)
        head = axgrid.nn.Linear(4, 4, seed=2)
        before = frozen.weight.detach().clone()
        opt = torch.optim.AdamW(list(frozen.parameters()) + list(head.parameters()), lr=0.1)
        grid.ledger.reset()
        head(frozen(torch.randn(3, 4))).sum().backward()
        axgrid.sync_gradients(head, grid)
        opt.step()
        rs_calls = grid.ledger.entries[("z", "reduce_scatter")].calls
        return frozen.weight.grad is None, torch.equal(frozen.weight, before), rs_calls
    finally:
        grid.destroy()


def test_frozen_layers_get_no_gradient_and_no_collectives(ranks):
    for no_grad, unchanged, rs_calls in ranks(4, rank_frozen_with_ors, "1x1x2x2"):
        assert no_grad and unchanged
        assert rs_calls == 1          # only the trainable layer reduce-scatters its weight gradient


def rank_two_models_prefetch(spec: str) -> tuple:
    import gc
    import weakref
    cfg = axgrid.RuntimeConfig(timeout_s=60, overlap=axgrid.OverlapConfig(oag=True))
    grid = axgrid.init(spec, config=cfg)
    try:
        first = MLPStack(8, 2, grid=grid, seed=1)
        for _ in range(2):
            first(torch.randn(4, 8)).sum().backward()
        hits_first = grid.runtime.weights.hits
        ref = weakref.ref(first)
        del first
        gc.collect()
        second = MLPStack(8, 2, grid=grid, seed=2)
        for _ in range(2):
            second(torch.randn(4, 8)).sum().backward()
        return hits_first, grid.runtime.weights.hits - hits_first, ref() is None
    finally:
        grid.destroy()


def test_prefetch_follows_a_new_model_and_frees_the_old(ranks):
    for h1, h2, freed in ranks(2, rank_two_models_prefetch, "1x1x2x1"):
        assert h1 > 0 and h2 > 0 and freed


def rank_other_order(spec: str, order: str) -> float:
    grid = axgrid.init(spec, order=order, timeout_s=60)
    try:
        worst = 0.0
        for transpose in (False, True):
            layer = axgrid.nn.Linear(8, 12, transpose=transpose, seed=5)
            ref = reference_linear(8, 12, True, 5)
            x = torch.randn(7, 8, generator=torch.Generator().manual_seed(1))
            xp, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
            layer(xp).pow(2).sum().backward()
            ref(xr).pow(2).sum().backward()
            worst = max(worst, float((xp.grad - xr.grad).abs().max()))
            dense = layer.to_dense()
            worst = max(worst, float((dense.weight - ref.weight).abs().max()))
        return worst
    finally:
        grid.destroy()


def test_non_default_rank_orders(ranks):
    for order in ("dzyx", "zdxy", "yxzd"):
        assert all(e < 1e-5 for e in ranks(8, rank_other_order, "2x2x2x1", order))
