"""perfmodel prices the whole GPT step: for the real ``axgrid.models.gpt.GPT`` (FC layers, layer norms, embeddings,
vocabulary-parallel cross entropy, the loss, and the data-parallel buckets of every parameter), the bytes AND calls
per (grid dimension, operation) that ``perfmodel.collective_bytes`` / ``collective_calls`` predict for the same
``TransformerShape``, grid and step equal what the runtime's ledger counts.

One optimizer step per case, as a training loop runs it (``experiments/train/train_gpt.py``): ``grid.watch(model)``;
each micro-batch's forward with targets and ``loss.backward()``, all but the last under ``grid.no_sync()``; then
``axgrid.sync_gradients(model, grid)``, the global-norm clipping (``axgrid.clip_grad_norm_``: its 8-byte all-reduce
over x·y·z, and over d with ``zero`` >= 1), and with ``zero`` >= 1 the sharded optimizer's step (its all-gather of
the parameters over d). Grids include non-powers of two, d > 1, z > 1, several micro-batches, recompute on and off, the
overlaps and kept gathered weights, and the ``zero`` modes (reduce-scatters over d, in every micro-batch with
``zero=2``, and the all-gathers); some cases set a tiny ``bucket_bytes`` so the d collectives take several
buckets. In fp32, and in bf16 (autocast, two grids of 4 ranks): weights gathered and activations reduced in bf16,
gradients reduced in fp32 (perfmodel's ``grad_dtype_bytes``), layer-norm statistics, cross entropy and the
embeddings' gradients in fp32; the bf16 cases sum in bf16 on gloo (``reduce_in_fp32=False``), as NCCL does.
"""
from __future__ import annotations

import contextlib

import pytest

from helpers import slow_where
import torch

import axgrid
from axgrid import perfmodel as pm
from axgrid.spec import TransformerShape
from helpers.ledger_compare import assert_ledger_matches

# layers, hidden, heads, seq, vocab: every Gx, Gy below divides hidden 24 and 4·24, heads 12 and vocab 48
SIZES = (2, 24, 12, 8, 48)
# (world, grid, microbatches, sequences per z-rank per micro-batch, recompute, overlap, bucket_bytes, bias[, zero];
# then zero 0 and the dtype are appended)
CASES = [
    (4, "1x1x2x2", 2, 1, False, "all", 2000, True, 2),      # zero=2: a reduce-scatter per bucket per micro-batch
    (4, "2x1x1x2", 1, 1, True, "none", 1500, True, 1),      # zero=1: reduce-scatter + all-gather per bucket
    (8, "2x2x2x1", 2, 1, True, "all", None, True),           # every tensor-parallel dimension, all overlaps
    (8, "1x2x2x2", 2, 1, False, "none", 2000, True),         # d and z, no overlap, several buckets
    (8, "2x1x2x2", 2, 2, True, "all,keep", 3000, True),      # ORS + ODP + keep: bucket order from the pipeline
    (8, "2x2x1x2", 1, 1, False, "oar,odp", 1500, False),     # ODP without ORS, no bias
    (8, "1x1x4x2", 3, 1, True, "ors,odp", 2500, True),       # Gz = 4, three micro-batches
    (8, "2x2x1x2", 2, 1, True, "all", 1200, True),           # ORS with Gz = 1: layer norms ready before FC
    (8, "1x4x1x2", 1, 2, False, "oar,oag", None, True),      # Gy = 4 with d: vocabulary-parallel cross entropy
    (6, "3x1x2x1", 1, 1, True, "all", None, True),           # non-powers of two
    (6, "1x3x1x2", 2, 1, False, "none", 1200, True),         # Gy = 3 with d
    (6, "1x1x3x2", 2, 1, False, "all,keep", 2000, True),     # Gz = 3 with d, ORS + ODP
    (6, "2x3x1x1", 1, 1, True, "oar,oag,ors", None, False),  # x and y, recompute, no bias
]
BF16 = [
    (4, "2x1x2x1", 2, 1, True, "all", None, True),           # x and z, every overlap, recompute
    (4, "1x2x1x2", 1, 1, False, "oar,odp", 1500, True),      # y and d, several buckets
]
CASES = [c + ((0,) if len(c) == 8 else ()) + ("fp32",) for c in CASES] + [c + (0, "bf16") for c in BF16]


def _options(overlap: str) -> axgrid.OverlapConfig:
    return axgrid.OverlapConfig.parse(overlap)


def rank_ledgers(cases: list[tuple]) -> list[dict]:
    """On one rank: for every case, the ledger of one optimizer step as {(dim, op): (calls, bytes)}."""
    from axgrid.models.gpt import GPT, GPTConfig
    torch.set_num_threads(1)
    layers, hidden, heads, seq, vocab = SIZES
    out = []
    for _, spec, mbs, seqs, recompute, overlap, bucket, bias, zero, dtype in cases:
        kw = {} if bucket is None else {"bucket_bytes": bucket}
        if dtype == "bf16":
            kw["reduce_in_fp32"] = False
        grid = axgrid.init(spec, config=axgrid.RuntimeConfig(timeout_s=60, overlap=_options(overlap), seed=0,
                                                             zero=zero, **kw))
        try:
            cfg = GPTConfig(TransformerShape("test", layers, hidden, heads, seq, vocab, bias=bias),
                            recompute=recompute)
            model = GPT(cfg, grid)
            grid.watch(model)
            opt = axgrid.shard_optimizer(torch.optim.AdamW(model.parameters()), model, grid)
            gen = torch.Generator().manual_seed(grid.index("d"))
            batch_d = seqs * grid.size("z")                      # this data-parallel rank's sequences
            grid.ledger.reset()
            for i in range(mbs):
                ids = torch.randint(0, vocab, (batch_d, seq + 1), generator=gen)
                with grid.no_sync() if i < mbs - 1 else contextlib.nullcontext():
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                        loss = model(ids[:, :-1], ids[:, 1:])
                    loss.backward()
            axgrid.sync_gradients(model, grid)
            axgrid.clip_grad_norm_(model, 1.0, grid)
            if zero:
                opt.step()                                       # the all-gather of the parameters over d
            out.append({key: (e.calls, e.bytes) for key, e in grid.ledger.entries.items()})
        finally:
            grid.destroy()
    return out


def predicted(case: tuple) -> tuple[dict, dict]:
    _, spec, mbs, seqs, recompute, overlap, bucket, bias, zero, dtype = case
    layers, hidden, heads, seq, vocab = SIZES
    shape = tuple(int(v) for v in spec.split("x"))
    ov = _options(overlap)
    model = TransformerShape("test", layers, hidden, heads, seq=seq, vocab=vocab, bias=bias)
    kw = dict(layers=model, grid=shape, tokens_per_microbatch_global=seqs * shape[2] * shape[3] * seq,
              n_microbatches=mbs, dtype_bytes=4 if dtype == "fp32" else 2, grad_dtype_bytes=4,
              keep_gathered=ov.keep_gathered_weights, recompute=recompute, zero=zero, clip=True,
              bucket_bytes=axgrid.RuntimeConfig().bucket_bytes if bucket is None else bucket)
    return pm.collective_bytes(**kw), pm.collective_calls(**kw)


def test_bucket_cases_make_several_buckets():
    """Guards the case list: the tiny buckets do split the d all-reduce into several calls."""
    for case in CASES:
        if case[6] is not None:
            op = "reduce_scatter" if case[8] else "all_reduce"
            assert predicted(case)[1][("d", op)] > 2, case


@pytest.mark.parametrize("world", slow_where(sorted({c[0] for c in CASES}), lambda w: w > 4))
def test_gpt_predicted_bytes_and_calls_equal_ledger(ranks, world):
    cases = [c for c in CASES if c[0] == world]
    per_rank = ranks(world, rank_ledgers, cases)
    for i, case in enumerate(cases):
        want_bytes, want_calls = predicted(case)
        for r, ledger in enumerate(per_rank):
            where = (f"grid {case[1]} (mb={case[2]}, seqs={case[3]}, recompute={case[4]}, overlap={case[5]}, "
                     f"bucket={case[6]}, bias={case[7]}, {case[8]}), rank {r}")
            assert_ledger_matches(ledger[i], want_bytes, want_calls, where)
