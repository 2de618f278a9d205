"""Data-parallel flat bucket buffers are kept across steps (sync_gradients and ODP), give the same bits as a
fresh buffer per bucket, are never shared by two layouts, and are freed when their model stops being used."""
import torch
from torch import nn

import axgrid
from axgrid.data_parallel import _buckets, flat_grads, write_grads

BUCKET = 256     # bytes: several buckets per model


def _model(widths: list[int], seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(a, b) for a, b in zip(widths, widths[1:])])


def _local_grads(model: nn.Module, d: int, step: int) -> None:
    gen = torch.Generator().manual_seed(100 * step + d)     # each d member its own batch
    x = torch.randn(5, model[0].in_features, generator=gen)
    model(x).square().sum().backward()


def _fresh_mean(model: nn.Module, grid) -> list[torch.Tensor]:
    """What the reduction gives with a fresh torch.cat buffer per bucket (the code before buffers were kept)."""
    params = [p for p in model.parameters()]
    saved = [p.grad.clone() for p in params]
    for bucket in _buckets(params, BUCKET):
        write_grads(bucket, grid.comm.all_reduce(flat_grads(bucket), "d", average=True))
    out = [p.grad.clone() for p in params]
    for p, g in zip(params, saved):
        p.grad.copy_(g)
    return out


def _step(model: nn.Module, grid, d: int, step: int, buffers, odp: bool) -> tuple[bool, set[int]]:
    """One step: local gradients, the expected mean, the synchronised result; (bit-identical, buffer ptrs)."""
    model.zero_grad(set_to_none=True)
    if not odp:
        _local_grads(model, d, step)
        want = _fresh_mean(model, grid)
    else:                     # ODP reduces during backward: the expectation comes from an unwatched twin
        twin = _model([m.in_features for m in model] + [model[-1].out_features], 0)
        twin.load_state_dict(model.state_dict())
        _local_grads(twin, d, step)
        want = _fresh_mean(twin, grid)
        _local_grads(model, d, step)
    axgrid.sync_gradients(model, grid)
    same = all(torch.equal(p.grad, w) for p, w in zip(model.parameters(), want))
    return same, {b.data_ptr() for b in buffers.buffers.values()}


def rank_reuse(odp: bool) -> dict:
    ov = axgrid.OverlapConfig(odp=odp)
    grid = axgrid.init("1x1x1x2", config=axgrid.RuntimeConfig(timeout_s=60, overlap=ov, bucket_bytes=BUCKET))
    try:
        d = grid.coord.d
        buffers = grid.runtime.grads.dp_buffers if odp else grid.runtime.grad_buffers
        a = _model([8, 16, 6, 4], 1)
        b = _model([8, 12, 6, 4], 2)       # another layout: same dtype, different sizes
        grid.watch(a)
        grid.watch(b)
        out = {"same": [], "ptrs": [], "count": [], "sizes": []}
        for step, model in enumerate([a, a, b, b, b, b]):
            same, ptrs = _step(model, grid, d, step, buffers, odp)
            out["same"].append(same)
            out["ptrs"].append(ptrs)
            out["count"].append(len(buffers.buffers))
            out["sizes"].append(sorted(k_b.numel() for k_b in buffers.buffers.values()))
        with grid.no_sync():                # a no_sync backward neither uses nor ages buffers
            _local_grads(b, d, 9)
        out["after_no_sync"] = len(buffers.buffers)
        out["numel"] = [sum(p.numel() for p in m.parameters()) for m in (a, b)]
        return out
    finally:
        grid.destroy()


def test_bucket_buffers_kept_across_steps_and_per_layout(ranks):
    for odp in (False, True):
        out = ranks(2, rank_reuse, odp)[0]
        na, nb = out["numel"]
        assert all(out["same"]), (odp, out["same"])                  # bit-identical to fresh buffers
        assert out["ptrs"][0] and out["ptrs"][1] == out["ptrs"][0]   # step 2 reuses step 1's buffers
        assert sum(out["sizes"][1]) == na
        # model b (another layout) gets buffers of its own next to a's, then reuses them
        assert sum(out["sizes"][2]) == na + nb and out["ptrs"][2] > out["ptrs"][1], (odp, out["sizes"])
        # a's buffers are freed once b alone has run for keep_steps steps: memory does not grow with models
        assert out["ptrs"][3] == out["ptrs"][2] - out["ptrs"][1] == out["ptrs"][-1]
        assert sum(out["sizes"][-1]) == nb, (odp, out["sizes"])
        assert out["after_no_sync"] == out["count"][-1]
