"""Data-parallel buckets are the gradients' storage (one copy of every gradient): ``.grad`` are views of them, kept
across steps, one set per model, freed with the model; the mean over d gives the same bits as an all-reduce of a
fresh copy; a ``zero_grad(set_to_none=True)`` does not leave stale values, and a parameter no rank used has no
gradient; every backward ends with the buckets reduced (with ODP during it)."""
import gc
import weakref

import torch
from torch import nn

import axgrid
from axgrid.metrics.memtrack import storage_bytes, storage_key

BUCKET = 256     # bytes: several buckets per model


def _model(widths: list[int], seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(a, b) for a, b in zip(widths, widths[1:])])


def _local_grads(model: nn.Module, d: int, step: int, skip_last: bool = False) -> None:
    gen = torch.Generator().manual_seed(100 * step + d)     # each d member its own batch
    x = torch.randn(5, model[0].in_features, generator=gen)
    for i, layer in enumerate(model):
        if not (skip_last and i == len(model) - 1):
            x = layer(x)
    x.square().sum().backward()


def _fresh_mean(model: nn.Module, grid) -> list[torch.Tensor]:
    """The mean over d of this rank's current gradients (zeros where there is none), by one all-reduce of a copy."""
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()])
    mean = grid.comm.all_reduce(flat.clone(), "d", average=True)
    return list(mean.split([p.numel() for p in model.parameters()]))


def rank_buckets(odp: bool) -> dict:
    ov = axgrid.OverlapConfig(odp=odp)
    grid = axgrid.init("1x1x1x2", config=axgrid.RuntimeConfig(timeout_s=60, overlap=ov, bucket_bytes=BUCKET))
    try:
        d = grid.coord.d
        a, b = _model([8, 16, 6, 4], 1), _model([8, 12, 6, 4], 2)
        grid.watch(a)
        out = {"same": [], "views": [], "ptrs": [], "reduced_in_backward": []}
        for step, (model, set_to_none, skip) in enumerate([(a, False, False), (a, True, False), (a, False, True),
                                                           (b, True, False), (b, False, False)]):
            if set_to_none:
                model.zero_grad(set_to_none=True)        # the buckets survive it: gradients come back as views
            else:
                axgrid.zero_gradients(model, grid)
            twin = _model([m.in_features for m in model] + [model[-1].out_features], 0)
            twin.load_state_dict(model.state_dict())
            _local_grads(twin, d, step, skip)
            want = _fresh_mean(twin, grid)
            grid.ledger.reset()
            _local_grads(model, d, step, skip)            # skip: the last layer gets no gradient (zeros, not stale)
            out["reduced_in_backward"].append(("d", "all_reduce") in grid.ledger.entries)
            axgrid.sync_gradients(model, grid)
            lay = model[0].weight.axgrid_buckets
            # a parameter no d-rank used (skip) has no gradient, as torch leaves it; the others the mean
            out["same"].append(all(torch.equal(p.grad.reshape(-1), w) if p.grad is not None else
                                   skip and (p is model[-1].weight or p is model[-1].bias) and not w.any()
                                   for p, w in zip(model.parameters(), want)))
            bufs = lay.buffers()["grads"]
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            out["views"].append({storage_key(g) for g in grads} <= {storage_key(b) for b in bufs}
                                and storage_bytes(bufs) == 4 * sum(p.numel() for p in model.parameters())
                                and (skip or storage_bytes(grads) == storage_bytes(bufs)))
            out["ptrs"].append(tuple(t.data_ptr() for t in bufs))
        out["buckets"] = len(a[0].weight.axgrid_buckets.buckets)
        ref = weakref.ref(a[0].weight.axgrid_buckets)
        del a, lay, bufs
        gc.collect()
        out["freed"] = ref() is None
        return out
    finally:
        grid.destroy()


def test_gradients_are_views_of_the_buckets(ranks):
    for odp in (False, True):
        out = ranks(2, rank_buckets, odp)[0]
        assert all(out["same"]), (odp, out["same"])                 # bit-identical to an all-reduce of a copy
        assert all(out["views"]), out["views"]                      # one copy: .grad storages are the buckets
        assert out["buckets"] > 1
        assert out["ptrs"][0] == out["ptrs"][1] == out["ptrs"][2]   # kept across steps (and set_to_none)
        assert out["ptrs"][3] == out["ptrs"][4] != out["ptrs"][0]   # model b: its own
        # every backward outside no_sync ends with the gradients reduced (as DDP's), from the first step on
        # (grid.watch) and for b from its second (its buckets are built by its first sync_gradients)
        assert out["reduced_in_backward"] == [True, True, True, False, True]
        assert out["freed"]                                         # a model's buckets go with it
