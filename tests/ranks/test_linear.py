"""axgrid.nn.Linear equals a serial nn.Linear -- output, input gradient, weight gradient, bias gradient -- on every
grid of 1 to 8 ranks (non-powers of two included), normal and transposed, with data parallelism."""
import pytest

from helpers import slow_where
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import axgrid
from axgrid.spec.layout import all_shapes
from axgrid.nn.init import reference_linear

TOL = dict(rtol=1e-5, atol=1e-5)


def rank_check_all_grids(world: int, a: int, b: int, m: int, bias: bool, seed: int) -> int:
    """On every grid of ``world`` ranks and both orientations: compare with serial. Returns grids checked."""
    checked = 0
    for shape in all_shapes(world):
        grid = axgrid.init(shape, timeout_s=60)
        try:
            gx, gy, gd = shape.gx, shape.gy, shape.gd
            k, n = gx * gy * a, gx * gy * b          # divisible by Gx and Gy in either orientation
            for transpose in (False, True):
                layer = axgrid.nn.Linear(k, n, bias=bias, transpose=transpose, seed=seed)
                ref = reference_linear(k, n, bias, seed)
                gen = torch.Generator().manual_seed(seed + 1)
                x_all = torch.randn(gd * m, 3, k, generator=gen)        # [batch, seq, k]: leading dims kept
                dy_all = torch.randn(gd * m, 3, n, generator=gen)
                d = grid.coord.d
                x = x_all[d * m:(d + 1) * m].clone().requires_grad_()
                y = layer(x)
                (y * dy_all[d * m:(d + 1) * m]).sum().backward()
                axgrid.sync_gradients(layer, grid)
                xr = x_all.clone().requires_grad_()
                (ref(xr) * dy_all).sum().backward()
                torch.testing.assert_close(y, ref(x_all)[d * m:(d + 1) * m], **TOL)
                torch.testing.assert_close(x.grad, xr.grad[d * m:(d + 1) * m], **TOL)
                sh = layer.sharding
                want_w = layer._shard_from(lambda r, c: ref.weight.grad.double()[r.start:r.stop, c.start:c.stop])
                torch.testing.assert_close(layer.weight.grad, (want_w / gd).float(), **TOL)
                if bias:
                    torch.testing.assert_close(layer.bias.grad, ref.bias.grad[sh.row0:sh.row0 + sh.n_blk] / gd, **TOL)
                # the initialisation equals slicing the serial one, and to_dense() gives it back
                dense = layer.to_dense()
                torch.testing.assert_close(dense.weight, ref.weight, rtol=0, atol=0)
                if bias:
                    torch.testing.assert_close(dense.bias, ref.bias, rtol=0, atol=0)
            checked += 1
        except AssertionError as e:
            raise AssertionError(f"grid {shape} (a={a}, b={b}, m={m}, bias={bias}): {e}") from None
        finally:
            grid.destroy()
    return checked


@pytest.mark.parametrize("world", slow_where(list(range(1, 9)), lambda w: w not in (1, 2)))
@given(a=st.integers(1, 3), b=st.integers(1, 3), m=st.integers(1, 5), bias=st.booleans(), seed=st.integers(0, 999))
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_grid_matches_serial(ranks, world, a, b, m, bias, seed):
    checked = ranks(world, rank_check_all_grids, world, a, b, m, bias, seed)
    assert checked == [len(list(all_shapes(world)))] * world


def rank_from_dense_roundtrip(spec: str) -> bool:
    grid = axgrid.init(spec, timeout_s=60)
    try:
        torch.manual_seed(5)  # the same dense layer on every rank
        dense = torch.nn.Linear(12, 18)
        par = axgrid.nn.Linear.from_dense(dense, grid, transpose=True)
        x = torch.randn(7, 12)
        torch.testing.assert_close(par(x), dense(x), **TOL)
        back = par.to_dense()
        assert torch.equal(back.weight, dense.weight) and torch.equal(back.bias, dense.bias)
        return True
    finally:
        grid.destroy()


def test_from_dense_to_dense(ranks):
    assert all(ranks(6, rank_from_dense_roundtrip, "3x2x1x1"))
    assert all(ranks(6, rank_from_dense_roundtrip, "1x3x2x1"))


def rank_tiles(spec: str) -> bool:
    """Each parameter's TileSpec cuts exactly its data out of the dense layer."""
    grid = axgrid.init(spec, timeout_s=60)
    try:
        for transpose in (False, True):
            layer = axgrid.nn.Linear(6, 12, transpose=transpose, seed=11)
            ref = reference_linear(6, 12, True, 11)
            for p, dense in ((layer.weight, ref.weight), (layer.bias, ref.bias)):
                t = p.axgrid_tile
                assert t.dense_shape == tuple(dense.shape)
                assert torch.equal(t.part_of(dense.detach()[t.slices()]), p.detach())
        return True
    finally:
        grid.destroy()


def test_tile_specs_describe_the_shards(ranks):
    assert all(ranks(6, rank_tiles, "1x2x3x1"))
    assert all(ranks(6, rank_tiles, "3x2x1x1"))


def rank_autocast(spec: str, tuning: str, cache: str) -> float:
    """Under bf16 autocast the layer computes like a serial nn.Linear under autocast (bf16 tolerance),
    in forward and backward, with plain matmul and through the GEMM tuner; gradients keep the parameters' dtype."""
    cfg = axgrid.RuntimeConfig(timeout_s=60, gemm_tuning=tuning, gemm_cache=cache,
                               overlap=axgrid.OverlapConfig(ors=True))
    grid = axgrid.init(spec, config=cfg)
    try:
        layer = axgrid.nn.Linear(16, 32, seed=2)
        ref = reference_linear(16, 32, True, 2)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
        xp, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yp, yr = layer(xp), ref(xr)
            yp.float().pow(2).sum().backward()
            yr.float().pow(2).sum().backward()
        assert yp.dtype == yr.dtype
        assert layer.weight.grad.dtype == torch.float32 and layer.bias.grad.dtype == torch.float32
        torch.testing.assert_close(yp.float(), yr.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(xp.grad, xr.grad, rtol=5e-2, atol=5e-2)
        return float((xp.grad - xr.grad).abs().max())
    finally:
        grid.destroy()


@pytest.mark.parametrize("tuning", ["off", "on-first-use"])
def test_bf16_autocast(ranks, tmp_path, tuning):
    errs = ranks(4, rank_autocast, "2x2x1x1", tuning, str(tmp_path / "g.json"))
    assert all(e < 5e-2 for e in errs)
