"""axgrid.train.train_step, the one training step of demo, train_gpt and the benchmarks: micro-batches (all but
the last under no_sync, averaged), gradient sync over d, clipping and the optimizer step end where serial training on
the whole batch ends."""
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

            def loss_p(mb: int) -> torch.Tensor:      # the mean over this rank's rows of micro-batch mb
                rows = slice(mb * 8 + d * per, mb * 8 + (d + 1) * per)
                return nn.functional.mse_loss(par(x[rows]), t[rows])

            def loss_s(_: int) -> torch.Tensor:       # the mean over the whole batch, in one pass
                return nn.functional.mse_loss(ser(x), t)

            grid.ledger.reset()
            rp = train_step(par, opt_p, loss_p, grid, micro, clip=0.05)
            reduces = sum(e.calls for (dim, op), e in grid.ledger.entries.items() if dim == "d")
            rs = train_step(ser, opt_s, loss_s, None, 1, clip=0.05)
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
    """Micro-batches averaged (the default) over d and micro-batches: the full-batch mean gradient and loss."""
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


def _gradients(accumulate: str, micro: int, scale: float) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x, t = torch.randn(8, 3, generator=torch.Generator().manual_seed(1)), torch.zeros(8, 2)
    rows = 8 // micro
    out = train_step(model, torch.optim.SGD(model.parameters(), lr=0.0),
                     lambda i: nn.functional.mse_loss(model(x[i * rows:(i + 1) * rows]), t[i * rows:(i + 1) * rows],
                                                      reduction="sum") / scale, None, micro, accumulate=accumulate)
    return torch.cat([model.weight.grad.flatten(), model.bias.grad, out.loss.reshape(1)])


def test_micro_batches_are_averaged_by_default_and_summed_on_request():
    """The README's loss_of (each micro-batch's mean) trains with the full-batch mean gradient; accumulate="sum" is
    for a loss already divided by the step's global count (the drivers' Goldfish normaliser)."""
    full = _gradients("mean", 1, 8 * 2)                  # mean over all 8 rows (x 2 outputs), one pass
    torch.testing.assert_close(_gradients("mean", 2, 4 * 2), full)      # two micro-batch means, averaged
    torch.testing.assert_close(_gradients("sum", 2, 8 * 2), full)       # two shares of the global mean, summed
    with pytest.raises(ValueError, match="accumulate='avg'"):
        _gradients("avg", 2, 1)
