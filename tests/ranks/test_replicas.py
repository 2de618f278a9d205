"""Tensor-parallel replicas that drifted apart (a non-deterministic GPU backward gives the QKV bias of two x replicas
different last bits; the norms' replicas over y likewise) are found and made one again: by ``check_replicas``, by
every checkpoint save, and in the training driver; the embedding tables' backward accumulates deterministically."""
from __future__ import annotations

import warnings

import torch

import axgrid
from axgrid.data_parallel.replicas import ReplicaWarning, check_replicas, fingerprint


def _fingerprints(model, grid) -> list[list[int]]:
    mine = torch.stack([fingerprint(p) for p in model.parameters()])
    return grid.comm.all_gather(mine, "xyz").tolist()


def rank_drift(root: str) -> dict:
    from axgrid.models.gpt import GPT, GPTConfig
    from axgrid.spec import TransformerShape
    grid = axgrid.init("2x2x1x1", config=axgrid.RuntimeConfig(timeout_s=60, seed=0))
    try:
        model = GPT(GPTConfig(TransformerShape("replicas", 1, 16, 2, 8, 32)), grid)
        clean = check_replicas(model, grid)
        with torch.no_grad():                           # what a non-deterministic backward leaves behind
            if grid.index("x") == 1:
                model.blocks[0].qkv.bias.add_(1e-7)     # a normal layer's bias: replicated over x
            if grid.index("y") == 1:
                model.blocks[0].ln1.weight.mul_(1 + 1e-6)   # a norm over the x-split stream: replicated over y
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            found = check_replicas(model, grid)
        again = check_replicas(model, grid)
        with torch.no_grad():
            if grid.rank == 3:
                model.wte.weight[0, 0] += 1e-3          # the token table: replicated over y
        from axgrid.checkpoint import save_checkpoint
        save_checkpoint(root, model, None, grid, step=1)
        after_save = check_replicas(model, grid)
        prints = _fingerprints(model, grid)
        return {"clean": clean, "found": found, "again": again, "after_save": after_save,
                "warned": [str(w.message) for w in seen if issubclass(w.category, ReplicaWarning)],
                "same_everywhere": [len({prints[r][j] for r in range(4)}) for j in range(len(prints[0]))],
                "tp": [bool(set(getattr(p, "axgrid_replicated", "xyzd")) & set("xy")) for p in model.parameters()]}
    finally:
        grid.destroy()


def test_drifted_replicas_are_found_and_made_one(ranks, tmp_path):
    results = ranks(4, rank_drift, str(tmp_path / "ck"))
    for r, got in enumerate(results):
        assert got["clean"] == [] and got["again"] == [] and got["after_save"] == []
        assert got["found"] == ["blocks.0.ln1.weight", "blocks.0.qkv.bias"], got["found"]
        assert (len(got["warned"]) == 1) == (r == 0)
    # the replicas of every parameter replicated over x or y hold the same bits on every rank now
    got = results[0]
    for n_distinct, tp in zip(got["same_everywhere"], got["tp"]):
        if tp:
            assert n_distinct <= 2      # equal over its replicated letter; its split letter may hold other parts


def rank_embedding_backward_ops() -> list[str]:
    """The ops the token table's backward dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode
    grid = axgrid.init("1x2x1x1", config=axgrid.RuntimeConfig(timeout_s=60, seed=0))
    try:
        from axgrid.tensor_parallel.embedding import Embedding
        emb = Embedding(16, 8, grid)
        out = emb(torch.tensor([1, 3, 3, 7]))
        seen: list[str] = []

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(str(func.overloadpacket))
                return func(*args, **(kwargs or {}))
        with Ops():
            out.sum().backward()
        return seen
    finally:
        grid.destroy()


def test_the_embedding_backward_accumulates_deterministically(ranks):
    """``index_add_`` uses atomics on a GPU (replicas' sums differ in their last bits); ``index_put_`` with
    ``accumulate=True`` sorts the rows and adds in order."""
    for ops in ranks(2, rank_embedding_backward_ops):
        assert "aten.index_put_" in ops and "aten.index_add_" not in ops, ops


def rank_check_beside_gathers() -> list[list[str]]:
    """zero=1 with ODP on 2x1x1x2: the parameters' all-gathers over d are in flight after each step; a replica
    check right then must see (and repair) nothing. It once read half-gathered values: ``0.bias`` flagged at step 0,
    every parameter by step 5, and its repair broadcast them into memory the all-gather was still writing."""
    from axgrid.models.gpt import GPT, GPTConfig
    from axgrid.spec import TransformerShape
    from axgrid.train import train_step
    grid = axgrid.init("2x1x1x2", config=axgrid.RuntimeConfig(timeout_s=60, seed=0, zero=1, bucket_bytes=4096,
                                                               overlap=axgrid.OverlapConfig.parse("odp")))
    try:
        model = GPT(GPTConfig(TransformerShape("race", 2, 16, 2, 8, 32)), grid)
        grid.watch(model)
        opt = axgrid.shard_optimizer(torch.optim.AdamW(model.parameters(), lr=0.1), model, grid)
        gen = torch.Generator().manual_seed(grid.index("d"))
        flagged = []
        for _ in range(6):
            ids = torch.randint(0, 32, (2, 9), generator=gen)
            train_step(model, opt, lambda i: model(ids[:, :-1], ids[:, 1:]), grid)
            flagged.append(check_replicas(model, grid, repair=False))
        return flagged
    finally:
        grid.destroy()


def test_replicas_are_checked_only_when_no_collective_writes_them(ranks):
    for flagged in ranks(4, rank_check_beside_gathers):
        assert flagged == [[]] * 6, flagged
