"""Several optimizer steps of a normal+transposed MLP stack end where serial training ends (data parallel,
gradient accumulation and global gradient-norm clipping included); parallelize() keeps a model's function."""
import warnings

import pytest

from helpers import slow_where
import torch
from torch import nn

import axgrid
from axgrid.models import MLPStack

TOL = dict(rtol=1e-4, atol=1e-5)


def rank_train(spec: str, steps: int, micro: int, clip: float) -> dict:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        gd, d = grid.size("d"), grid.coord.d
        par = MLPStack(12, 2, ffn=24, grid=grid, seed=3)
        ser = MLPStack(12, 2, ffn=24, grid=None, seed=3)
        opt_p = torch.optim.AdamW(par.parameters(), lr=1e-2, weight_decay=0.1)
        opt_s = torch.optim.AdamW(ser.parameters(), lr=1e-2, weight_decay=0.1)
        gen = torch.Generator().manual_seed(0)
        tokens = 24 * micro
        per = 24 // gd
        norms = []
        for step in range(steps):
            x = torch.randn(tokens, 12, generator=gen)
            t = torch.randn(tokens, 12, generator=gen)
            opt_p.zero_grad(set_to_none=True)
            opt_s.zero_grad(set_to_none=True)
            for mb in range(micro):          # gradient accumulation over micro-batches
                xs, ts = x[mb * 24:(mb + 1) * 24], t[mb * 24:(mb + 1) * 24]
                lp = nn.functional.mse_loss(par(xs[d * per:(d + 1) * per]), ts[d * per:(d + 1) * per]) / micro
                lp.backward()
                (nn.functional.mse_loss(ser(xs), ts) / micro).backward()
            axgrid.sync_gradients(par, grid)
            n_p = axgrid.clip_grad_norm_(par, clip, grid)
            n_s = torch.nn.utils.clip_grad_norm_(ser.parameters(), clip)
            norms.append((float(n_p), float(n_s)))
            opt_p.step()
            opt_s.step()
        worst = 0.0
        for pl, sl in zip(list(par.ups) + list(par.downs), list(ser.ups) + list(ser.downs)):
            dense = pl.to_dense()
            torch.testing.assert_close(dense.weight, sl.weight, **TOL)
            torch.testing.assert_close(dense.bias, sl.bias, **TOL)
            worst = max(worst, float((dense.weight - sl.weight).abs().max()))
        for a, b in norms:
            assert abs(a - b) <= 1e-4 * max(1.0, b), (a, b)
        return {"worst": worst, "norms": norms}
    finally:
        grid.destroy()


@pytest.mark.parametrize("world,spec", slow_where([(8, "2x2x2x1"), (6, "3x1x2x1"), (6, "1x3x1x2"), (6, "2x1x1x3"),
                                                    (8, "1x2x2x2"), (4, "1x1x1x4"), (8, "2x1x4x1")],
                                                   lambda case: case[0] > 4))
def test_mlp_stack_trains_like_serial(ranks, world, spec):
    out = ranks(world, rank_train, spec, 4, 2, 0.05)   # clip hard so clipping is active every step
    assert all(o["worst"] < 1e-4 for o in out)
    assert all(a > 0.05 for a, _ in out[0]["norms"])


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 12))
        self.norm = nn.LayerNorm(12)
        self.head = nn.Linear(12, 6, bias=False)
        self.odd = nn.Linear(12, 7)          # 7 output features: not divisible by Gy=2 -> stays dense

    def forward(self, x):
        h = self.norm(x + self.mlp(x))
        return self.head(h).sum(-1) + self.odd(h).sum(-1)


def rank_parallelize(spec: str) -> dict:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        torch.manual_seed(0)
        orig = Toy()
        model = Toy()
        model.load_state_dict(orig.state_dict())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            axgrid.parallelize(model, grid)
        kinds = {n: type(m).__name__ for n, m in model.named_modules() if "Linear" in type(m).__name__}
        x = torch.randn(5, 4, 12)          # same batch on every rank (gd == 1)
        torch.testing.assert_close(model(x), orig(x), rtol=1e-5, atol=1e-5)
        model(x).pow(2).sum().backward()
        orig(x).pow(2).sum().backward()
        torch.testing.assert_close(model.norm.weight.grad, orig.norm.weight.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model.odd.weight.grad, orig.odd.weight.grad, rtol=1e-4, atol=1e-5)
        for name in ("mlp.0", "mlp.2", "head"):
            p, o = model.get_submodule(name), orig.get_submodule(name)
            want = p._shard_from(lambda r, c: o.weight.grad.double()[r.start:r.stop, c.start:c.stop]).float()
            torch.testing.assert_close(p.weight.grad, want, rtol=1e-4, atol=1e-5)
        layouts = {n: (m.transpose, m.input_layout, m.output_layout) for n, m in model.named_modules()
                   if isinstance(m, axgrid.nn.Linear)}
        return {"kinds": kinds, "layouts": layouts, "warnings": [str(w.message) for w in caught]}
    finally:
        grid.destroy()


def test_parallelize_keeps_outputs_and_gradients(ranks):
    out = ranks(8, rank_parallelize, "2x2x2x1")[0]
    assert out["kinds"]["odd"] == "Linear" and "odd left dense" in " ".join(out["warnings"])
    assert out["layouts"]["mlp.0"] == (False, "replicated", "sharded")     # auto-paired MLP
    assert out["layouts"]["mlp.2"] == (True, "sharded", "replicated")
    assert out["layouts"]["head"] == (False, "replicated", "replicated")   # drop-in by default


def rank_plan_errors(spec: str) -> str:
    grid = axgrid.init(spec, timeout_s=30)
    try:
        try:
            axgrid.parallelize(Toy(), grid, plan={"nope": axgrid.LinearPlan()})
        except ValueError as e:
            return str(e)
        return "no error"
    finally:
        grid.destroy()


def test_parallelize_unknown_plan_name(ranks):
    msgs = ranks(2, rank_plan_errors, "2x1x1x1")
    assert all("not nn.Linear modules" in m and "mlp.0" in m for m in msgs)


class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = self.a                         # one Linear at two paths
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.frozen(self.b(self.a(x)))


def rank_parallelize_edge_cases(spec: str) -> dict:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        out = {}
        bad_plans = {
            "normal->normal pair": {"0": axgrid.LinearPlan(False, "replicated", "sharded"),
                                    "2": axgrid.LinearPlan(False, "sharded", "replicated", after="0")},
            "orphan": {"2": axgrid.LinearPlan(False, "replicated", "sharded")},
            "no after": {"2": axgrid.LinearPlan(True, "sharded", "replicated")},
        }
        for what, plan in bad_plans.items():
            try:
                axgrid.parallelize(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)), grid, plan=plan,
                                   auto_pair=False)
                out[what] = "no error"
            except ValueError as e:
                out[what] = str(e)
        torch.manual_seed(0)
        orig = Shared()
        model = Shared()
        model.load_state_dict(orig.state_dict())
        axgrid.parallelize(model, grid)
        out["shared"] = model.a is model.b and isinstance(model.a, axgrid.nn.Linear)
        out["frozen"] = not model.frozen.weight.requires_grad and not model.frozen.bias.requires_grad
        x = torch.randn(3, 8)
        torch.testing.assert_close(model(x), orig(x), rtol=1e-5, atol=1e-5)
        model(x).sum().backward()
        out["frozen_grad"] = model.frozen.weight.grad is None
        return out
    finally:
        grid.destroy()


def test_parallelize_rejects_bad_plans_and_keeps_sharing_and_freezing(ranks):
    for o in ranks(4, rank_parallelize_edge_cases, "2x2x1x1"):
        assert "the producer must have a sharded output and the opposite orientation" in o["normal->normal pair"]
        assert "no layer takes" in o["orphan"]
        assert "needs after=" in o["no after"]
        assert o["shared"] and o["frozen"] and o["frozen_grad"]
