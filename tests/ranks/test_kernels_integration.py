"""The layers run their three GEMMs through the tuner: cached decisions are honoured, results do not change,
and every rank of an x-y group uses the same decision."""
import json

import torch

import axgrid
from axgrid import kernels
from axgrid.kernels.signature import GemmSignature
from axgrid.kernels.validators import current_validators
from axgrid.nn.init import reference_linear


def rank_tuned_layer(spec: str, mode: str, cache: str) -> dict:
    cfg = axgrid.RuntimeConfig(timeout_s=60, gemm_tuning=mode, gemm_cache=cache)
    grid = axgrid.init(spec, config=cfg)
    try:
        layer = axgrid.nn.Linear(8, 16, seed=3)
        ref = reference_linear(8, 16, True, 3)
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
        xp, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        layer(xp).pow(2).sum().backward()
        ref(xr).pow(2).sum().backward()
        torch.testing.assert_close(xp.grad, xr.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer(x), ref(x), rtol=1e-5, atol=1e-5)
        sh = layer.sharding
        m = 6 // grid.size("z")
        choices = {role: grid.runtime.gemm_fn.choice(*shape, torch.float32, "cpu", role) for role, shape in
                   (("forward", (m, sh.n_blk, sh.k_blk)), ("input_grad", (m, sh.k_blk, sh.n_blk)),
                    ("weight_grad", (sh.n_blk, sh.k_blk, m)))}
        return {"calls": dict(grid.runtime.gemm_fn.stats.calls), "choices": choices, "xy": grid.index("xy"),
                "group": tuple(grid.layout.group_of(grid.rank, "xy"))}
    finally:
        grid.destroy()


def test_cached_decisions_are_used_by_the_layer(ranks, tmp_path):
    """A cache that forces non-default layouts: the layer uses them, and gradients still equal serial."""
    cache = tmp_path / "gemm.json"
    forced = {"forward": "torch:TN:BtAt", "input_grad": "torch:TT:AB", "weight_grad": "torch:NN:BtAt"}
    m, n_blk, k_blk = 3, 8, 4            # grid 2x2x2x1: 6 tokens over Gz=2, W [16, 8] -> block [8, 4]
    entries = {}
    for role, (mm, nn_, kk) in (("forward", (m, n_blk, k_blk)), ("input_grad", (m, k_blk, n_blk)),
                                ("weight_grad", (n_blk, k_blk, m))):
        sig = GemmSignature.make(mm, nn_, kk, torch.float32, "cpu", role)
        entries[sig.key] = {"winner": forced[role], "validators": current_validators("cpu"),
                            "times_s": {}, "signature": sig.key}
    kernels.GemmCache(str(cache)).update(entries)   # in the cache's own format
    out = ranks(8, rank_tuned_layer, "2x2x2x1", "cache-only", str(cache))
    for o in out:
        assert o["choices"] == forced
        for name in forced.values():
            assert o["calls"].get(name, 0) >= 1, o["calls"]


def test_on_first_use_agrees_within_each_xy_group(ranks, tmp_path):
    out = ranks(4, rank_tuned_layer, "2x1x2x1", "on-first-use", str(tmp_path / "g.json"))
    by_group = {}
    for o in out:
        by_group.setdefault(o["group"], []).append(o["choices"])
    for choices in by_group.values():
        assert all(c == choices[0] for c in choices)
