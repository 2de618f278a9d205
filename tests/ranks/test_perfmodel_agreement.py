"""perfmodel's predicted collective bytes equal what the runtime's ledger counts, for the same layers, grid,
tokens and step (docs/design.md: "its predicted bytes per collective must equal what the runtime's communication
ledger counts").

Each case builds transformer blocks (QKV 3h×h normal, attention-out h×h transposed, MLP-up 4h×h normal,
MLP-down h×4h transposed) of ``axgrid.nn.Linear`` in the sharded layout, so the only collectives are the
layers' own; runs ``microbatches`` forward+backward passes, then ``axgrid.sync_gradients`` (the data-parallel
mean over d); and compares ``grid.ledger`` with ``perfmodel.collective_bytes`` / ``collective_calls``.

Bytes and calls must be equal for every (dimension, operation), ("d", "all_reduce") included: perfmodel packs
the gradients into buckets of ``bucket_bytes`` as the runtime does (``sync_gradients``: parameters() order, post
a bucket before it would overflow; ODP's ``GradientPipeline``: gradient-ready order, post once full), so its d
calls are the runtime's buckets. The default 25 MiB gives one bucket for these sizes, so some cases set a tiny
``RuntimeConfig.bucket_bytes`` to make several, and some turn ODP on (earlier micro-batches under
``grid.no_sync()``, as a training loop does). In fp32, and in bf16 (autocast): the weights are gathered over z in
bf16, the activations' all-reduces carry bf16, the gradients are reduced in fp32 (``RuntimeConfig.grad_reduce_dtype``,
perfmodel's ``grad_dtype_bytes``) or in bf16 when configured so. The bf16 cases sum in bf16 on gloo
(``reduce_in_fp32=False``), as NCCL does: gloo's own default sums low-precision tensors in fp32.
"""
from __future__ import annotations

import contextlib

import pytest

from helpers import slow_where
import torch

import axgrid
from axgrid.perfmodel import FCLayer, collective_bytes, collective_calls
from axgrid.spec import block_layers
from helpers.ledger_compare import assert_ledger_matches

# (world, grid, hidden, microbatches, m_loc tokens per rank per micro-batch, bias, keep_gathered_weights)
CASES = [
    (8, "2x2x2x1", 8, 1, 5, True, False),      # every tensor-parallel dimension > 1
    (8, "2x2x2x1", 8, 2, 3, True, True),       # keep gathered weights, 2 micro-batches
    (8, "2x1x2x2", 8, 1, 4, True, False),      # data parallel
    (8, "1x2x4x1", 6, 1, 3, True, False),      # padding: QKV block 9·6 = 54 over Gz=4 -> 56; out 6·3 = 18 -> 20
    (8, "1x2x4x1", 6, 2, 3, False, True),      # padding, no bias, keep, 2 micro-batches
    (8, "2x2x1x2", 8, 2, 2, True, True),       # data parallel + keep
    (6, "3x1x2x1", 6, 1, 5, True, False),      # non-powers of two
    (6, "1x3x1x2", 6, 2, 4, True, False),      # Gy=3 with data parallel
    (6, "1x1x3x2", 6, 1, 4, True, True),       # Gz=3 with data parallel, keep
    (6, "2x3x1x1", 6, 1, 4, False, False),     # x and y both > 1, no bias
]
# (world, grid, hidden, microbatches, m_loc, bias, keep, bucket_bytes, odp): several d buckets, and ODP
BUCKET_CASES = [
    (8, "2x2x1x2", 8, 1, 2, True, False, 100, False),     # shards 64 B / 128 B, biases 16 B: buckets of <= 100 B
    (8, "1x2x2x2", 8, 2, 3, True, False, 200, True),      # ODP, 2 micro-batches (first under no_sync)
    (6, "1x3x1x2", 6, 1, 4, True, False, 150, False),
    (6, "1x1x3x2", 6, 1, 4, False, True, 300, True),      # ODP, no bias, keep
    (8, "2x2x2x1", 8, 1, 5, True, False, 100, True),      # ODP with Gd = 1: nothing over d
]
CASES = [c + (None, False) for c in CASES] + BUCKET_CASES
# bf16 (autocast): (world, grid, hidden, microbatches, m_loc, bias, keep, bucket_bytes, odp, gradient dtype)
BF16_CASES = [
    (8, "2x2x2x1", 8, 1, 5, True, False, None, False, "fp32"),   # every tensor-parallel dimension
    (8, "1x2x2x2", 8, 2, 3, True, True, 200, True, "fp32"),      # keep, ODP, several buckets
    (6, "1x1x3x2", 6, 1, 4, True, False, None, False, "bf16"),   # gradients reduced in bf16
]
CASES = [c + ("fp32", "fp32") for c in CASES] + [c[:9] + ("bf16", c[9]) for c in BF16_CASES]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def rank_ledgers(cases: list[tuple]) -> list[dict]:
    """On one rank: for every case, the ledger of one step as {(dim, op): (calls, bytes)}."""
    torch.set_num_threads(1)
    out = []
    for _, spec, h, mbs, m_loc, bias, keep, bucket, odp, dtype, grads in cases:
        kw = {} if bucket is None else {"bucket_bytes": bucket}
        if dtype == "bf16":
            kw.update(reduce_in_fp32=False, grad_reduce_dtype=DTYPES[grads])
        cfg = axgrid.RuntimeConfig(timeout_s=60, overlap=axgrid.OverlapConfig(odp=odp, keep_gathered_weights=keep),
                                   **kw)
        grid = axgrid.init(spec, config=cfg)
        try:
            layers = torch.nn.ModuleList(
                axgrid.nn.Linear(L.k, L.n, L.bias, transpose=L.transposed, grid=grid, input_layout="sharded",
                                 output_layout="sharded", dtype=torch.float32)
                for _ in range(2) for L in block_layers(h, bias=bias))        # two blocks
            k0 = layers[0].sharding.k_blk
            grid.ledger.reset()
            for i in range(mbs):
                # the first layer's input needs a gradient, as in a model (it comes from a LayerNorm): a layer
                # whose input needs none skips its input-gradient GEMM and all-reduce, which perfmodel prices
                x = torch.randn(m_loc, k0, requires_grad=True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                    for j, lin in enumerate(layers):        # layouts chain: normal -> transposed -> normal
                        x = torch.nn.functional.gelu(lin(x))
                        if j % 4 == 0:                      # QKV [m', 3h/Gy] -> "attention" output [m', h/Gy]
                            x = x.chunk(3, dim=-1)[0]
                with grid.no_sync() if i < mbs - 1 else contextlib.nullcontext():
                    x.sum().backward()
            axgrid.sync_gradients(layers, grid)
            out.append({key: (e.calls, e.bytes) for key, e in grid.ledger.entries.items()})
        finally:
            grid.destroy()
    return out


def predicted(case: tuple) -> tuple[dict, dict]:
    _, spec, h, mbs, m_loc, bias, keep, bucket, odp, dtype, grads = case
    shape = tuple(int(v) for v in spec.split("x"))
    gz, gd = shape[2], shape[3]
    layers = block_layers(h, bias=bias) * 2
    kw = dict(layers=layers, grid=shape, tokens_per_microbatch_global=m_loc * gz * gd, n_microbatches=mbs,
              dtype_bytes=4 if dtype == "fp32" else 2, grad_dtype_bytes=4 if grads == "fp32" else 2,
              keep_gathered=keep, recompute=False,
              bucket_bytes=axgrid.RuntimeConfig().bucket_bytes if bucket is None else bucket)
    return collective_bytes(**kw), collective_calls(**kw)


def test_bucket_cases_make_several_buckets():
    """Guards the case list: the tiny buckets do split the d all-reduce into several calls."""
    for case in BUCKET_CASES:
        if int(case[1].split("x")[3]) > 1:
            assert predicted(case + ("fp32", "fp32"))[1][("d", "all_reduce")] > 1, case


@pytest.mark.parametrize("world", slow_where(sorted({c[0] for c in CASES}), lambda w: w > 4))
def test_predicted_bytes_equal_ledger(ranks, world):
    cases = [c for c in CASES if c[0] == world]
    per_rank = ranks(world, rank_ledgers, cases)
    for i, case in enumerate(cases):
        want_bytes, want_calls = predicted(case)
        for r, ledger in enumerate(per_rank):
            where = (f"grid {case[1]} (h={case[2]}, mb={case[3]}, bias={case[5]}, keep={case[6]}, "
                     f"bucket={case[7]}, odp={case[8]}, {case[9]}, gradients {case[10]}), rank {r}")
            assert_ledger_matches(ledger[i], want_bytes, want_calls, where)


def test_padding_case_really_pads():
    """The padding cases above do exercise a block that Gz does not divide (guards the case list)."""
    from axgrid.perfmodel.comm import layer_volumes
    v = layer_volumes(FCLayer(18, 6, False), 1, 2, 4, 3)
    assert int(v.block) == 54 and int(v.padded) == 56
    v = layer_volumes(FCLayer(6, 6, True), 1, 2, 4, 3)
    assert int(v.block) == 18 and int(v.padded) == 20
