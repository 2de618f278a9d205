"""axgrid.train.train_step, the one training step of demo, train_gpt and the benchmarks: micro-batches (all but
the last under no_sync), gradient sync over d, clipping and the optimizer step end where serial training ends."""
import pytest
import torch
from torch import nn

import axgrid
from axgrid.models import MLPStack
from axgrid.train import train_step


def rank_train_step(spec: str, overlap: str, micro: int) -> dict:
    grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60, overlap=axgrid.OverlapConfig.parse(overlap)))
    try:
        gd, d = grid.size("d"), grid.coord.d
        par = MLPStack(8, 2, ffn=16, grid=grid, seed=3)
        ser = MLPStack(8, 2, ffn=16, grid=None, seed=3)
        grid.watch(par)
        opt_p = torch.optim.AdamW(par.parameters(), lr=1e-2)
        opt_s = torch.optim.AdamW(ser.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(0)
        per = 8 // gd
        out = {"loss": [], "norm": [], "d_reduces": []}
        for _ in range(3):
            x, t = torch.randn(8 * micro, 8, generator=gen), torch.randn(8 * micro, 8, generator=gen)

            def loss_p(mb: int) -> torch.Tensor:
                rows = slice(mb * 8 + d * per, mb * 8 + (d + 1) * per)
                return nn.functional.mse_loss(par(x[rows]), t[rows]) / micro

            def loss_s(mb: int) -> torch.Tensor:
                return nn.functional.mse_loss(ser(x[mb * 8:(mb + 1) * 8]), t[mb * 8:(mb + 1) * 8]) / micro

            grid.ledger.reset()
            rp = train_step(par, opt_p, loss_p, grid, micro, clip=0.05)
            reduces = sum(e.calls for (dim, op), e in grid.ledger.entries.items() if dim == "d")
            rs = train_step(ser, opt_s, loss_s, None, micro, clip=0.05)
            mean_p = float(grid.comm.all_reduce(rp.loss.reshape(1), "d", average=True)[0])
            out["loss"].append((mean_p, float(rs.loss)))
            out["norm"].append((float(rp.grad_norm), float(rs.grad_norm)))
            out["d_reduces"].append(reduces)
        for pl, sl in zip(list(par.ups) + list(par.downs), list(ser.ups) + list(ser.downs)):
            dense = pl.to_dense()
            torch.testing.assert_close(dense.weight, sl.weight, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(dense.bias, sl.bias, rtol=1e-4, atol=1e-5)
        return out
    finally:
        grid.destroy()


def test_train_step_with_micro_batches_matches_serial_and_syncs_once_per_step(ranks):
    one, two = (ranks(2, rank_train_step, "1x1x1x2", "oar,odp", micro) for micro in (1, 2))
    for out in (one[0], two[0]):
        for p, s in out["loss"] + out["norm"]:
            assert p == pytest.approx(s, rel=1e-5)
        assert all(p > 0.05 for p, _ in out["norm"])          # clipping active every step
    # ODP: the first micro-batch runs under no_sync, so 2 micro-batches reduce over d as often as 1 does
    assert two[0]["d_reduces"] == one[0]["d_reduces"]


def test_train_step_refuses_bad_input_before_any_work():
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="microbatches"):
        train_step(model, opt, lambda i: model(torch.ones(2)).sum(), None, 0)
    with pytest.raises(ValueError, match="clip"):
        train_step(model, opt, lambda i: model(torch.ones(2)).sum(), None, 1, clip=float("nan"))
    assert model.weight.grad is None                            # nothing ran
