"""AxgridStrategy (Lightning Fabric) on real gloo ranks, beyond the example's training (tests/scripts/
test_examples.py): a plain torch model set up drop-in, ``fabric.no_backward_sync`` holding back the reduction over
d that the next backward posts, and bad input refused in one line on every rank before any collective."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

pytest.importorskip("lightning_fabric")


def d_calls(grid) -> int:
    return sum(e.calls for (dim, _), e in grid.ledger.entries.items() if dim == "d")


def rank_fabric_seams(spec: str, root: str) -> dict:
    saved = dict(os.environ)          # Fabric's teardown removes WORLD_SIZE, which later tests on this rank read
    try:
        return fabric_seams(spec, root)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def fabric_seams(spec: str, root: str) -> dict:
    from lightning_fabric import Fabric

    from axgrid.integrations.lightning import AxgridStrategy
    strategy = AxgridStrategy(spec, zero=1, overlap="odp")
    fabric = Fabric(accelerator="cpu", devices=4, strategy=strategy)
    fabric.launch()
    grid, out = strategy.grid, {}
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = fabric.setup(model, opt)
        out["drop-in"] = type(model.module[0]).__module__
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
        grid.ledger.reset()
        with fabric.no_backward_sync(model):
            fabric.backward(model(x).square().mean())
        out["d calls under no_backward_sync"] = d_calls(grid)
        fabric.backward(model(x).square().mean())
        out["d calls after"] = d_calls(grid)
        errors = []
        other = nn.Linear(8, 8)
        other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
        before = grid.ledger.snapshot()
        for call in (lambda: fabric.save(root, {"model": model, "x": torch.ones(1)}),
                     lambda: fabric.save(root, {"model": model, "other": model}),
                     lambda: fabric.load(root),
                     lambda: AxgridStrategy(spec, zero=3),
                     lambda: AxgridStrategy(spec, overlap="fast"),
                     lambda: fabric.setup(nn.Linear(8, 8), torch.optim.SGD(nn.Linear(8, 8).parameters(), lr=0.1)),
                     lambda: fabric.setup(other, other_opt, scheduler=torch.optim.lr_scheduler.StepLR(other_opt, 1))):
            try:
                call()
                errors.append("no error")
            except (ValueError, TypeError) as e:
                errors.append(str(e))
        out["no collective before the errors"] = grid.ledger.snapshot() == before
        fabric.save(root, {"model": model, "optimizer": opt, "step": 1})
        try:
            fabric.load(root, {"model": model, "optimizer": opt, "epoch": 0})
            errors.append("no error")
        except Exception as e:          # KeyError on every rank, agreed before anything was read
            errors.append(str(e))
        out["errors"] = errors
        out["loaded"] = fabric.load(root, {"model": model, "optimizer": opt})
        return out
    finally:
        strategy.teardown()


def test_drop_in_setup_no_backward_sync_and_bad_input(ranks, tmp_path):
    want = ["state['x'] (Tensor) is not JSON-serialisable", "one model and at most one optimizer",
            "needs state={'model': model, ...}", "zero=3: choose 0", "unknown overlap switch(es) ['fast']",
            "holds a tensor that is not a parameter of the model", "build the scheduler on the optimizer fabric.setup",
            "holds no 'epoch'"]
    for got in ranks(4, rank_fabric_seams, "1x1x2x2", str(tmp_path / "ck")):
        assert got["drop-in"] == "axgrid.tensor_parallel.linear"
        assert got["d calls under no_backward_sync"] == 0 and got["d calls after"] > 0, got
        assert got["no collective before the errors"]
        assert len(got["errors"]) == len(want)
        for expected, message in zip(want, got["errors"]):
            assert expected in message, (expected, message)
        assert got["loaded"] == {"step": 1}
