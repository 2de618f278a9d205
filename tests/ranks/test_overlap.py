"""Every combination of the four overlap switches (OAR, ORS, OAG, ODP) gives the no-overlap results, with
gradient accumulation and activation recompute, and leaves nothing pending after a step."""
import itertools

import pytest

from helpers import slow_where
import torch
from torch import nn

import axgrid
from axgrid.models import MLPStack

COMBOS = list(itertools.product([False, True], repeat=4))


def train(spec: str, overlap: axgrid.OverlapConfig, recompute: bool, steps: int = 3, micro: int = 2):
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60, overlap=overlap, bucket_bytes=2048))
    try:
        gd, d = grid.size("d"), grid.coord.d
        model = MLPStack(12, 2, ffn=24, grid=grid, seed=4, recompute=recompute)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(1)
        per = 12 // gd
        losses, leaks = [], []
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            for mb in range(micro):
                x, t = torch.randn(12, 12, generator=gen), torch.randn(12, 12, generator=gen)
                ctx = grid.no_sync() if mb < micro - 1 else torch.enable_grad()
                with ctx:
                    loss = nn.functional.mse_loss(model(x[d * per:(d + 1) * per]), t[d * per:(d + 1) * per])
                    loss.backward()
                losses.append(loss.item())
            axgrid.sync_gradients(model, grid)
            opt.step()
            rt = grid.runtime
            leaks.append(not rt.grads.empty() or rt.weights.pending is not None)
        dense = [l.to_dense() for l in list(model.ups) + list(model.downs)]
        params = [torch.cat([m.weight.reshape(-1), m.bias]) for m in dense]
        hits = grid.runtime.weights.hits
        return losses, params, leaks, hits
    finally:
        grid.destroy()


def rank_all_combinations(spec: str, recompute: bool, micro: int = 2) -> list:
    base_losses, base_params, _, _ = train(spec, axgrid.OverlapConfig(), recompute, micro=micro)
    report = []
    for oar, ors, oag, odp in COMBOS:
        ov = axgrid.OverlapConfig(oar=oar, ors=ors, oag=oag, odp=odp)
        losses, params, leaks, hits = train(spec, ov, recompute, micro=micro)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(base_losses), rtol=1e-6, atol=1e-7,
                                   msg=lambda m: f"{ov}: losses differ: {m}")
        for a, b in zip(params, base_params):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=lambda m: f"{ov}: parameters differ: {m}")
        assert not any(leaks), f"{ov}: collectives or prefetches left pending after a step"
        report.append(((oar, ors, oag, odp), hits))
    return report


@pytest.mark.parametrize("world,spec,recompute,micro", slow_where([
    (8, "2x1x2x2", False, 2),
    (6, "1x1x3x2", True, 2),     # non-power of two, recompute: OAG also prefetches in the recompute forward
    (6, "3x1x2x1", False, 2),
    (8, "1x2x2x2", True, 2),
    (4, "1x1x2x2", False, 1),    # one micro-batch per step: .grad starts as None under ORS + ODP
], lambda case: case[0] > 4))
def test_all_16_combinations_equal_no_overlap(ranks, world, spec, recompute, micro):
    for report in ranks(world, rank_all_combinations, spec, recompute, micro):
        for (oar, ors, oag, odp), hits in report:
            if oag:
                assert hits > 0, "OAG on, z > 1: some forward must have used a prefetched weight"


def rank_keep_gathered(spec: str) -> tuple:
    ov = axgrid.OverlapConfig(keep_gathered_weights=True)
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60, overlap=ov))
    try:
        from axgrid.tensor_parallel.linear import kept_weight_bytes
        model = MLPStack(12, 2, ffn=24, grid=grid, seed=4)
        grid.ledger.reset()
        model(torch.randn(6, 12)).sum().backward()
        ag = grid.ledger.entries[("z", "all_gather")].calls
        return ag, kept_weight_bytes(model)
    finally:
        grid.destroy()


def test_keep_gathered_weights_saves_one_all_gather_per_layer(ranks):
    calls, extra = ranks(4, rank_keep_gathered, "1x1x4x1")[0]
    # 4 layers: one AG_z each in forward only, plus the output gather of the stack over z
    assert calls == 4 + 1
    assert extra == 4 * (12 * 24 - 12 * 24 // 4) * 4


def rank_trace(spec: str, path: str) -> int:
    ov = axgrid.OverlapConfig(oar=True, ors=True, oag=True)
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60, overlap=ov, trace=True))
    try:
        model = MLPStack(12, 2, ffn=24, grid=grid, seed=4)
        for _ in range(2):
            model(torch.randn(6, 12)).sum().backward()
        grid.runtime.tracer.write(path)
        return len(grid.runtime.tracer.events)
    finally:
        grid.destroy()


def test_chrome_trace_has_compute_and_comm(ranks, tmp_path):
    import json
    n = ranks(4, rank_trace, "2x1x2x1", str(tmp_path / "trace-{rank}.json"))
    assert all(k > 10 for k in n)
    events = json.load(open(tmp_path / "trace-0.json"))["traceEvents"]
    cats = {e["cat"] for e in events}
    assert {"compute", "comm", "wait"} <= cats
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)
